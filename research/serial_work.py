r"""A step's work, measured: every module on one device of one thread.

  python -m research.serial_work --strategies=local,local-m8,e2e,e2e-m8 \
      --json_out=docs/results/many_core/serial_work.json

The schedule model (`step_model.schedule`) predicts a step from each op's
cost, timed alone (`step_model.profiling`). Where a cell's prediction is
off, two causes look alike: the schedule (which ops overlap, what waits)
or the costs themselves (an op timed alone may cost more or less than
inside the step's graph). Run serially, nothing overlaps: one logical
device, one inter-op and one intra-op thread, so a step's time is the sum
of the time of every op the step really runs. Next to it, this prints the
sum of the op costs the model charges that step (`schedule.step_work`: at
M microbatches, M times the microbatch ops, M - 1 accumulations, one
update per module). Their ratio is the costs' error alone, with the
schedule taken out.
"""

# First: checks the environment and quiets TF before TensorFlow loads.
from train import runtime_env  # pylint: disable=unused-import,g-bad-import-order

import json

from absl import app
from absl import flags
import tensorflow as tf

from research import benchmark_lib
from step_model import profiling
from step_model import schedule
from tf_interlock import placement as placement_lib
from train import error_boundary
from train import user_files

_STRATEGIES = flags.DEFINE_list(
    "strategies", ["local", "local-m8", "e2e", "e2e-m8"],
    "Cells to run (strategy, or strategy-mM for M microbatches).")
_NUM_MODULES = flags.DEFINE_integer(
    "num_modules", 4, "K, the MLP's modules (>= 1; all on one logical "
    "device).")
_WIDTH = flags.DEFINE_integer(
    "width", 512, "Units of every Dense layer of the MLP, and its "
    "inputs (>= 1).")
_BATCH = flags.DEFINE_integer(
    "batch_size", 512, "Examples per training step (>= 1; M must divide "
    "it).")
_STEPS = flags.DEFINE_integer(
    "steps", 7, "Timed training calls per cell (>= 1); the median is "
    "reported.")
_JSON_OUT = flags.DEFINE_string(
    "json_out", None, "Also write the JSON report to this file.")


def measure(name, placement, spec):
  """{serial step ms, charged ms, charged over serial} of one cell."""
  trainer, step = benchmark_lib.run_strategy(spec, name, placement)
  x, y = benchmark_lib.make_batch(spec)
  strategy, m = benchmark_lib.parse_cell(name)
  costs = profiling.measure_module_costs(trainer, x, y, microbatches=m)
  # measure_module_costs at M > 1 gives one microbatch's ops (the update
  # the whole step's), as research.benchmark feeds the model.
  charged = schedule.step_work(
      costs, strategy, m, [module.has_aux_head for module in trainer.modules],
      microbatch_costs=costs if m > 1 else None)
  return {"serial_step_ms": round(1e3 * step, 3),
          "charged_ms": round(1e3 * charged, 3),
          "charged_over_serial": round(charged / step, 3),
          "costs_ms": benchmark_lib.costs_ms(costs)}


@error_boundary.guard()
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _JSON_OUT.value:  # before minutes of timing
    user_files.check_output(_JSON_OUT.value, "--json_out")
  tf.config.threading.set_inter_op_parallelism_threads(1)
  tf.config.threading.set_intra_op_parallelism_threads(1)
  k = _NUM_MODULES.value
  placement_lib.configure_simulated_devices(1, intra_op_threads=1)
  placement = placement_lib.make_placement("simulated", k,
                                           module_devices=[0] * k)
  spec = benchmark_lib.make_spec("mlp", k, width=_WIDTH.value,
                                 batch_size=_BATCH.value, steps=_STEPS.value)
  report = {"model": "mlp", "num_modules": k, "width": _WIDTH.value,
            "batch_size": _BATCH.value, "threads": "1 device, 1 inter-op "
            "and 1 intra-op thread", "cells": {}}
  for name in _STRATEGIES.value:
    report["cells"][name] = measure(name, placement, spec)
    row = report["cells"][name]
    print(f"{name:10} serial {row['serial_step_ms']:8.2f} ms  charged "
          f"{row['charged_ms']:8.2f} ms  charged/serial "
          f"{row['charged_over_serial']:.2f}", flush=True)
  if _JSON_OUT.value:
    user_files.write_output(_JSON_OUT.value,
                            json.dumps(report, indent=1) + "\n", "--json_out")


if __name__ == "__main__":
  app.run(main)
