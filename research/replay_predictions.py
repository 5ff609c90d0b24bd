r"""Replays research.benchmark reports with today's schedule model.

  python -m research.replay_predictions \
      --reports='docs/results/speed_held/*.json'

A `research.benchmark --json` report keeps, for every plan it ran, the op
costs it timed (`module_costs_ms`), and for every cell its measured step,
its cost scale (`benchmark_lib.work_scale`, 1 where absent), its
microbatch costs and the loop its trainer ran. This predicts each cell of
a plan of one-thread devices again from those, with the model as it is
now, and prints model / measured per cell, then how many cells fall within
`BAND` of measured and the rms of log(model / measured) over all of them:
a change to `step_model.schedule` is judged on every run already made, not
only on the run after it. A cell without its loop (reports written before
the loop was recorded) is replayed in the loop its name resolves to
(`benchmark_lib.cell_run_loop`), blocks of one.
"""

# First: checks the environment and quiets TF before TensorFlow loads.
from train import runtime_env  # pylint: disable=unused-import,g-bad-import-order

import math

from absl import app
from absl import flags
import tensorflow as tf

from research import benchmark_lib
from train import error_boundary
from train import user_files

BAND = 0.15

_REPORTS = flags.DEFINE_string(
    "reports", None, "A glob pattern of research.benchmark --json reports "
    "(quote it for the shell); files that hold no runs are skipped.")


def replay(report):
  """[(plan, cell, recorded model / measured, replayed model / measured)]
  of one report's cells on plans of one-thread devices."""
  out = []
  for run in report.get("runs", []):
    if run.get("threads_per_device") != 1 or "module_costs_ms" not in run:
      continue
    costs = benchmark_lib.costs_from_ms(run["module_costs_ms"])
    num_modules = len(costs)
    devices = int(run["plan"].split()[0])
    module_devices = [k * devices // num_modules for k in range(num_modules)]
    for name, row in run["strategies"].items():
      m = benchmark_lib.parse_cell(name)[1]
      if not row.get("predicted_step_s") or (
          m > 1 and "microbatch_costs_ms" not in row):
        continue
      scale = row.get("cost_scale") or 1.0
      micro = {m: [c.scaled(scale) for c in benchmark_lib.costs_from_ms(
          row["microbatch_costs_ms"])]} if m > 1 else {}
      predicted = benchmark_lib.predict(
          [c.scaled(scale) for c in costs], name, report["num_cores"], 1,
          module_devices, microbatch_costs=micro, ops_per_device=devices,
          loop=row.get("loop"), loop_block=row.get("loop_block", 1))
      measured = row["measured_step_s"]
      out.append((run["plan"], name, row["predicted_step_s"] / measured,
                  predicted / measured))
  return out


def summary(ratios):
  """(cells within BAND, rms of the log ratios) of model / measured."""
  within = sum(1 - BAND <= r <= 1 + BAND for r in ratios)
  rms = math.sqrt(sum(math.log(r) ** 2 for r in ratios) / len(ratios))
  return within, rms


@error_boundary.guard()
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  paths = sorted(tf.io.gfile.glob(_REPORTS.value or ""))
  if not paths:
    raise ValueError(f"--reports matches no file. "
                     f"Received: reports={_REPORTS.value!r}")
  recorded, replayed = [], []
  for path in paths:
    report = user_files.read_json(path, "--reports")
    for plan, name, was, now in replay(report):
      recorded.append(was)
      replayed.append(now)
      print(f"{path.rsplit('/', 1)[-1]:38} {plan[:9]:9} {name:18} "
            f"recorded {was:.2f}  now {now:.2f}")
  if not replayed:
    raise ValueError(f"no report under --reports holds a cell of a "
                     f"one-thread plan with its costs. "
                     f"Received: reports={_REPORTS.value!r}")
  for label, ratios in (("recorded", recorded), ("now", replayed)):
    within, rms = summary(ratios)
    print(f"{label}: {within} of {len(ratios)} cells within {BAND:.0%} of "
          f"measured, rms log(model / measured) {rms:.3f}")


if __name__ == "__main__":
  app.run(main)
