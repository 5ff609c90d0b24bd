r"""Per-module op costs of a configured network: `python -m research.module_costs`.

  python -m research.module_costs --preset=fashion_mnist_resnet \
      --out=/tmp/costs.json

Builds the trainer a `train.train` run with the same flags would build (its
own process: placement configures the devices), times each module's forward,
input VJP, weight VJP, aux head and update with
`step_model.profiling.measure_module_costs` on one training batch, and
writes them as JSON, with what `schedule.simulate` needs besides: which
modules have an aux head and the number of microbatches. With
--repetitions > 1 the costs are medians over that many full measurements,
with their min and max ("costs_min", "costs_max").

  python -m research.module_costs --preset=fashion_mnist_resnet \
      --balance_into=4 --repetitions=3 --out=docs/results/balance/x.json

--balance_into=K measures the network with every block a module of its own
(one device and one thread each) and splits it into K modules by measured
time, through `partition.balanced_split`, the balance code of
`from_keras(balance="time")`: a block costs its forward, input and weight
VJPs and update; a module ending after block j also runs the aux head
measured there (the cut cost). The split is written as "balanced_split";
a preset copies it (tests/test_presets_balance.py checks that it matches).
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import dataclasses
import json
import sys

from absl import app
from absl import flags

from step_model import profiling
from step_model import schedule
from train import config as config_lib
from train import error_boundary
from train import flags_lib
from train import runtime_setup
from train import train_lib
from train import user_files

_OUT = flags.DEFINE_string(
    "out", None, "JSON file (required, local or gs://) the op costs are "
    "written to.")
_REPEATS = flags.DEFINE_integer(
    "repeats", 10, "Timed calls (>= 1) per op in one measurement; an op's "
    "cost is their median.")
_REPETITIONS = flags.DEFINE_integer(
    "repetitions", 1, "Full measurements (>= 1); costs are their medians, "
    "with min and max.")
_BALANCE_INTO = flags.DEFINE_integer(
    "balance_into", None, "Measure every block as a module of its own and "
    "split the network into this many modules (>= 1) by measured time.")
# --help lists the Config flags too: they configure the measured network.
flags.adopt_module_key_flags(flags_lib)


def per_block(config):
  """`config` with every block a module of its own, one device and one
  thread each."""
  blocks = config_lib.num_blocks(config)
  if blocks is None:
    raise ValueError(f"--balance_into needs a network of fixed blocks "
                     f"(resnet or transformer). Received: "
                     f"model={config.network.model}")
  return dataclasses.replace(config, num_modules=blocks, split=(1,) * blocks,
                             placement="simulated", threads_per_device=1,
                             modules_per_device=1)


def measure(config, repeats, repetitions=1):
  """{"costs": [{op: seconds}], "has_aux": [...], ...} for `config`."""
  config_lib.validate(config)
  if repeats < 1:
    raise ValueError(f"--repeats must be >= 1. Received: repeats={repeats}")
  runtime_setup.setup_runtime(config)
  trainer, task, _ = train_lib.build(config)
  features, labels = next(iter(task.train.take(1)))
  costs, low, high = profiling.repeated_module_costs(
      trainer, features, labels, repetitions, repeats)
  return {
      "costs": [dataclasses.asdict(c) for c in costs],
      "costs_min": [dataclasses.asdict(c) for c in low],
      "costs_max": [dataclasses.asdict(c) for c in high],
      "repetitions": repetitions,
      "has_aux": [bool(m.has_aux_head) for m in trainer.modules],
      "num_microbatches": config.interlock.num_microbatches,
      "num_modules": config.interlock.num_modules,
      "placement": config.devices.placement,
      "batch_size": config.run.batch_size,
      "onednn": runtime_env.onednn_state(),
  }


@error_boundary.guard()
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  if not _OUT.value:
    raise app.UsageError("--out is required. Received: out=None")
  user_files.check_output(_OUT.value, "--out")  # before minutes of timing
  try:
    config = flags_lib.config_from_flags()
    k = _BALANCE_INTO.value
    if k is not None:
      blocks = config_lib.num_blocks(config)
      if blocks is not None and not 1 <= k <= blocks:
        raise ValueError(f"--balance_into must be in [1, {blocks}], the "
                         f"network's blocks. Received: balance_into={k}")
      config = per_block(config)
    result = measure(config, _REPEATS.value, _REPETITIONS.value)
    if k is not None:
      blocks = [schedule.ModuleCost(**c) for c in result["costs"]]
      result.update(profiling.balance_blocks(blocks, k))
      # The balanced modules' op costs, and the schedule model's one core
      # per module projection of them.
      result["projection_one_core_per_module"] = (
          profiling.project_one_core_per_module(profiling.compose_modules(
              blocks, result["balanced_split"])))
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  user_files.write_output(_OUT.value, json.dumps(result, indent=2), "--out")


if __name__ == "__main__":
  app.run(main)
