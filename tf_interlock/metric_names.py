"""One naming scheme for every per-module number: "module_{k}/{name}".

Module k (1-based; 0-based index k - 1 in the code) owns one exit: its aux
head's logits for k < K, the network's own output for k = K (see
`tf_interlock.exits`). Every number about module k or its exit is named
"module_{k}/{name}": the trainer's "module_1/loss" and
"module_1/grad_norm", Keras `fit`'s logs, TensorBoard (training and
evaluation) and the evaluation results, which nest the same names as
{"module_1": {"loss": ..., "accuracy": ...}, ..., "module_K": {...}}.
Keras's own "loss" and "accuracy" in `fit`'s and `evaluate`'s logs are
module K's, the network's (`with_keras_names`), and a metric function's one
score (not a dict of them) is named "accuracy" (`named_scores`).
"""

import re

_KEY = re.compile(r"^module_([1-9]\d*)/(.+)$")
_HEAD = re.compile(r"^module_([1-9]\d*)$")


def module_name(index):
  """"module_{index + 1}": module `index`'s (0-based) head and prefix."""
  return f"module_{index + 1}"


def metric_name(index, name):
  """The key of metric `name` of the module with 0-based `index`.

  Args:
    index: the 0-based module index (the name counts from 1).
    name: the metric, e.g. "loss", "accuracy", "grad_norm".

  Returns:
    "module_{index + 1}/{name}".
  """
  return f"{module_name(index)}/{name}"


# The name of a metric function's one score; a function returning a dict
# names each of its scores itself (`keras_metrics`: compile's metrics).
DEFAULT_METRIC = "accuracy"


def named_scores(scores):
  """A metric function's result as {name: value}: a dict as it is, one
  value (a tensor) as {"accuracy": value}."""
  return scores if isinstance(scores, dict) else {DEFAULT_METRIC: scores}


def with_keras_names(metrics, num_modules, names):
  """`metrics` plus the names Keras itself shows for them.

  Keras's progress bar, History and callbacks know a model's "loss" and
  the names of `compile`'s metrics. Ours are module K's (the network's),
  which `metrics` holds as "module_K/loss" and "module_K/<name>"; each of
  them present is added again under the bare name, after the others.

  Args:
    metrics: {"module_k/<name>": value}.
    num_modules: K.
    names: the metrics' names besides "loss" (e.g. ["accuracy"]).

  Returns:
    A new dict: `metrics`, then "loss" and each of `names` present.
  """
  named = dict(metrics)
  for name in ["loss", *names]:
    key = metric_name(num_modules - 1, name)
    if key in metrics:
      named[name] = metrics[key]
  return named


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


def head_index(head):
  """The 0-based module index of a head name "module_{k}".

  Raises:
    ValueError: when `head` is not a head name of this scheme.
  """
  match = _HEAD.match(head)
  if match is None:
    raise ValueError(f"A head name looks like 'module_<k>' with k >= 1. "
                     f"Received: head={head!r}")
  return int(match.group(1)) - 1


def network_head(results):
  """The name of the deepest head in `results`: the network's output."""
  return max(results, key=head_index)
