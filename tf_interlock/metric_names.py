"""Per-module metric names: "module_{k}/{name}", modules counted from 1.

The trainer reports every metric of module k (0-based index k in the code)
as "module_{k + 1}/{name}", e.g. "module_1/loss"; TensorBoard, the progress
line and the NaN policy read them back. Both directions live here, so the
format is defined once.
"""

import re

_KEY = re.compile(r"^module_([1-9]\d*)/(.+)$")


def metric_name(index, name):
  """The key of metric `name` of the module with 0-based `index`.

  Args:
    index: the 0-based module index (the name counts from 1).
    name: the metric, e.g. "loss", "accuracy", "grad_norm".

  Returns:
    "module_{index + 1}/{name}".
  """
  return f"module_{index + 1}/{name}"


def parse_metric_name(key):
  """Inverse of `metric_name`.

  Args:
    key: a key such as "module_2/loss".

  Returns:
    `(index, name)` with the 0-based module index, e.g. (1, "loss").

  Raises:
    ValueError: when `key` is not a per-module metric name.
  """
  match = _KEY.match(key)
  if match is None:
    raise ValueError(
        f"A per-module metric name looks like 'module_<k>/<name>' with "
        f"k >= 1. Received: key={key!r}")
  return int(match.group(1)) - 1, match.group(2)
