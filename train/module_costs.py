r"""Per-module op costs of a configured network: `python -m train.module_costs`.

  python -m train.module_costs --preset=fashion_mnist_resnet \
      --out=/tmp/costs.json

Builds the trainer a `train.train` run with the same flags would build (its
own process: placement configures the devices), times each module's forward,
input VJP, weight VJP, aux head and update with
`tf_interlock.profiling.measure_module_costs` on one training batch, and
writes them as JSON, with what `schedule.simulate` needs besides: which
modules have an aux head and the number of microbatches.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import dataclasses
import json
import sys

from absl import app
from absl import flags
import tensorflow as tf

from tf_interlock import profiling
from train import config as config_lib
from train import error_boundary
from train import flags_lib
from train import setup_lib
from train import train_lib

_OUT = flags.DEFINE_string("out", None, "JSON file to write.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed calls per op.")


def measure(config, repeats):
  """{"costs": [{op: seconds}], "has_aux": [...], ...} for `config`."""
  config_lib.validate(config)
  if repeats < 1:
    raise ValueError(f"--repeats must be >= 1. Received: repeats={repeats}")
  setup_lib.setup_runtime(config)
  trainer, task, _ = train_lib.build(config)
  features, labels = next(iter(task.train.take(1)))
  costs = profiling.measure_module_costs(trainer, features, labels, repeats)
  return {
      "costs": [dataclasses.asdict(c) for c in costs],
      "has_aux": [bool(m.has_aux_head) for m in trainer.modules],
      "num_microbatches": config.num_microbatches,
      "num_modules": config.num_modules,
      "placement": config.placement,
      "batch_size": config.batch_size,
      "onednn": runtime_env.onednn_state(),
  }


@error_boundary.guard()
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _OUT.value:
    raise app.UsageError("--out is required. Received: out=None")
  try:
    result = measure(flags_lib.config_from_flags(), _REPEATS.value)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  with tf.io.gfile.GFile(_OUT.value, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  app.run(main)
