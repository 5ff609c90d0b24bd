r"""Validates the schedule model out of sample: predict first, then time.

  python -m research.model_validation --out_dir=docs/results/model_validation

For every network and threading plan of the grid, in this order:

1. Profile: `research.benchmark --role=profile` measures each module's op
   costs in a process of its own (no strategy is timed there), as the
   median of --repetitions full measurements, with their range, and the
   host's reference time around it (`research.host_reference`); and
   `research.concurrency_probe --network=X`, in another, how much two
   modules' ops slow each other when they run at once (the model's
   `contention`), unless --contention_from names earlier probe reports.
2. Predict: the schedule model turns those costs into each strategy's step
   time on the plan (and, from the cheapest and dearest costs, a range).
   Every prediction of the grid is written to predictions.json before any
   timed run starts.
3. Time: each cell (network, plan, strategy) runs in its own process
   (`research.benchmark --role=worker --costs=false`), median of --steps calls
   of --steps_per_loop steps after 2 warm-ups, with the host's reference
   time around it; measured.json grows cell by cell, so an interrupted grid
   keeps what it measured.
4. Report: report.md, model / measured per cell, the cells off by more
   than 10% and the worst cell, and per cell the host's drift since the
   profile (the reference's time around the cell over that around the
   profile) with model x drift / measured.

A plan is K modules on D simulated devices of t intra-op threads on this
host's cores (`step_model.threading_plan`): "2x1" is K = 2 on 2 devices x
1 thread (one core per module on a 2-core host), "4x1", "4x2" K = 4 on 4
devices of 1 or 2 threads, "4on2" K = 4 on 2 devices x 1 thread with 2
modules each. Every network has the same 4 layers (blocks) at K = 2 and 4.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import json
import os
import platform
import sys
import time

from absl import app
from absl import flags

from step_model import threading_plan
from research import benchmark_lib
from train import config as config_lib
from train import error_boundary
from train import owned_dir
from train import user_files
from research import validation_report

# name -> (K, devices, intra-op threads per device).
PLANS = {"2x1": (2, 2, 1), "4x1": (4, 4, 1), "4x2": (4, 4, 2),
         "4on2": (4, 2, 1)}
# name -> research.benchmark flags; layers_per_module is 4 // K.
NETWORKS = {
    "mlp": ["--model=mlp", "--width=1024", "--batch_size=512"],
    # The fashion_mnist_resnet preset's network and batch on random images.
    "resnet": ["--model=resnet", "--preset=resnet20", "--image_size=28",
               "--channels=1", "--resnet_aux_head=pool", "--batch_size=128"],
    # The fortunes_lm preset's shape and batch on random token ids.
    "lm": ["--model=lm", "--batch_size=32"],
}
STRATEGIES = ("e2e", "e2e-m2", "e2e-m4", "e2e-m8", "local", "2wise", "3wise")
LAYERS = 4

_OUT_DIR = flags.DEFINE_string(
    "out_dir", None, "Folder (required) of predictions.json, measured.json "
    "and report.md.")
_NETWORKS = flags.DEFINE_list("networks", list(NETWORKS),
                              f"Networks: any of {list(NETWORKS)}.")
_STRATEGIES = flags.DEFINE_list(
    "strategies", list(STRATEGIES),
    "Strategy cells (research.benchmark names; e2e-mM: M microbatches).")
_PLANS = flags.DEFINE_list("plans", list(PLANS),
                           f"Threading plans: any of {list(PLANS)}.")
_STEPS = flags.DEFINE_integer(
    "steps", 5, "Timed calls (>= 1) per cell after 2 warm-up calls; their "
    "median is reported.")
_STEPS_PER_LOOP = flags.DEFINE_integer(
    "steps_per_loop", 8, "Training steps unrolled in each timed "
    "tf.function call (>= 1).")
_REPETITIONS = flags.DEFINE_integer(
    "repetitions", 3, "Full op-cost measurements (>= 1) per network and "
    "plan; predictions use their medians.")
_CORES = flags.DEFINE_integer(
    "num_cores", None, "Cores of the host (>= 1; default: those this "
    "process may use).")
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace this tool's files in --out_dir "
    "(predictions.json, measured.json, report.md).")

_CONTENTION_FROM = flags.DEFINE_string(
    "contention_from", None, "Folder of research.concurrency_probe reports "
    "named <network>.json (their `contention` feeds the model) instead of "
    "probing each network before predicting (into <out_dir>/"
    "concurrency_probe/). With --repredict_from and no folder, or with "
    "--contention_from=none, the model has no contention (c = 1, v3).")
_PROBE_REPEATS = flags.DEFINE_integer(
    "probe_repeats", 9, "Timed calls (>= 1) of each case of the "
    "concurrency probe; their median is used.")

_REPREDICT = flags.DEFINE_string(
    "repredict_from", None, "Time nothing: take the op costs and the "
    "measured cells of an earlier run's folder, predict every cell again "
    "with today's model and write predictions.json (marked in_sample: the "
    "measurements were seen before this model) and report.md to --out_dir. "
    "For comparing model versions on the same measurements.")

FILES = ("predictions.json", "measured.json", "report.md")


def validate():
  """One-line errors for bad flags, before anything is written."""
  if not _OUT_DIR.value:
    config_lib.fail("out_dir", _OUT_DIR.value, "must name a folder")
  for flag, allowed in ((_NETWORKS, NETWORKS), (_PLANS, PLANS)):
    if not flag.value or any(v not in allowed for v in flag.value):
      config_lib.fail(flag.name, ",".join(flag.value),
                      f"must list some of {', '.join(allowed)}")
  if not _STRATEGIES.value:
    config_lib.fail("strategies", "", "must name at least one strategy")
  for name in _STRATEGIES.value:
    strategy, microbatches = benchmark_lib.parse_cell(name)
    if strategy not in ("e2e", "local", "2wise", "3wise") or not (
        1 <= microbatches <= 32):
      config_lib.fail("strategies", ",".join(_STRATEGIES.value),
                      f"{name!r} is not e2e, local, 2wise or 3wise, with an "
                      f"optional -mM, 1 <= M <= 32")
  for flag in (_STEPS, _STEPS_PER_LOOP, _REPETITIONS, _PROBE_REPEATS):
    config_lib.check_number(flag.name, flag.value, minimum=1, integer=True)
  config_lib.check_number("num_cores", _CORES.value, minimum=1, integer=True,
                          allow_none=True)
  if _REPREDICT.value is not None and not all(
      os.path.isfile(os.path.join(_REPREDICT.value, f))
      for f in ("predictions.json", "measured.json")):
    config_lib.fail("repredict_from", _REPREDICT.value,
                    "must be a folder holding this tool's predictions.json "
                    "and measured.json")
  folder = _CONTENTION_FROM.value
  if folder not in (None, "none"):
    networks = _NETWORKS.value
    if _REPREDICT.value is not None:  # The earlier run's networks.
      networks = {key.split("/")[0] for key in owned_dir.load_json(
          os.path.join(_REPREDICT.value, "predictions.json"), {"groups": dict},
          received=f"repredict={_REPREDICT.value!r}")["groups"]}
    missing = [n for n in sorted(networks)
               if not os.path.isfile(os.path.join(folder, f"{n}.json"))]
    if missing:
      config_lib.fail("contention_from", folder,
                      f"must be a folder holding research.concurrency_probe "
                      f"reports {', '.join(n + '.json' for n in missing)}")
    for network in sorted(networks):  # Each report readable, before writing.
      for threads in sorted({t for _, _, t in PLANS.values()}):
        try:
          contention(network, folder, threads)
        except (OSError, ValueError) as e:
          config_lib.fail("contention_from", folder,
                          str(e).split(" Received:")[0].rstrip("."))
  present = [f for f in FILES if os.path.exists(
      os.path.join(_OUT_DIR.value, f))]
  if present and not _OVERWRITE.value:
    config_lib.fail("out_dir", _OUT_DIR.value,
                    f"already holds {', '.join(present)}; choose another "
                    f"folder or pass --overwrite")


def _benchmark(network, plan, role, extra=()):
  """Runs research.benchmark in a child process; its JSON report."""
  k, devices, threads = PLANS[plan]
  args = [f"--role={role}",
          "--placement=simulated", f"--num_modules={k}",
          f"--layers_per_module={LAYERS // k}",
          f"--threads_per_device={threads}",
          f"--modules_per_device={k // devices}", f"--num_cores={_cores()}",
          f"--steps={_STEPS.value}", f"--steps_per_loop={_STEPS_PER_LOOP.value}",
          *NETWORKS[network], *extra]
  return benchmark_lib.run_child(args)


def _cores():
  return _CORES.value or threading_plan.host_cores()


def contention(network, folder, threads=1):
  """(by_batch, source): {batch: c} from `network`'s probe report in
  `folder` for ops of `threads` intra-op threads (<network>.json for one,
  <network>_intra<t>.json for t); ({}, "none") without a folder, or without
  a report for t > 1."""
  if folder in (None, "none"):
    return {}, "none"
  path = os.path.join(folder, f"{network}.json" if threads == 1 else
                      f"{network}_intra{threads}.json")
  if threads > 1 and not os.path.isfile(path):
    return {}, "none"
  return benchmark_lib.read_contention(path), path


def probe_contention(network, threads, microbatches):
  """Runs research.concurrency_probe for `network`'s modules of `threads`
  intra-op threads (2 devices, on its whole batch and on batch / M for
  each of `microbatches`) in a process of its own, into
  <out_dir>/concurrency_probe/."""
  # Absolute: the probe runs from the repository root.
  folder = os.path.abspath(os.path.join(_OUT_DIR.value, "concurrency_probe"))
  os.makedirs(folder, exist_ok=True)
  name = f"{network}.json" if threads == 1 else f"{network}_intra{threads}.json"
  benchmark_lib.run_child(
      [f"--network={network}", f"--repeats={_PROBE_REPEATS.value}",
       f"--intra_op_threads={threads}",
       "--microbatches=" + ",".join(map(str, microbatches)),
       "--out=" + os.path.join(folder, name)],
      module="research.concurrency_probe", report=False)
  return contention(network, folder, threads)


def predict_cells(profile, plan, strategies, by_batch=None):
  """{strategy: {predicted_step_s, predicted_min_s, predicted_max_s}} from a
  profile report (costs in ms: median, min and max over repetitions) and the
  network's contention per batch size `by_batch` (the whole batch first; a
  cell of M microbatches takes batch / M's, else the whole batch's; none:
  c = 1)."""
  k, devices, threads = PLANS[plan]
  module_devices = threading_plan.make_plan(k, devices, threads).module_devices
  micro = profile.get("microbatch_costs_ms", {})
  by_batch = by_batch or {}
  whole = next(iter(by_batch), None)
  # t > 1 threads per device on fewer cores than D x t (4x2 here): the model
  # of v4 let one op hold both cores, so two ops ran one after the other;
  # the OS runs them at once, each slower (two 2-thread chains took 1.51x
  # one alone, not 2x). With a probe of t-thread modules every device may
  # run an op (D x t cores), slowed by that probe's contention.
  cores = devices * threads if threads > 1 and by_batch else _cores()
  cells = {}
  for name in strategies:
    m = benchmark_lib.parse_cell(name)[1]
    factor = by_batch.get(whole // m, by_batch[whole]) if by_batch else 1.0
    values = [benchmark_lib.predict(
        benchmark_lib.costs_from_ms(profile[key]), name, cores, threads,
        module_devices,
        {int(m): benchmark_lib.costs_from_ms(rows[key])
         for m, rows in micro.items()},
        # The plan's D logical devices share one inter-op pool of D threads
        # (placement.configure_simulated_devices), which runs any device's
        # ops: research.concurrency_probe measured two chains on one device
        # at 1.00-1.07x of one alone.
        ops_per_device=devices, contention=factor)
              for key in ("module_costs_ms", "module_costs_min_ms",
                          "module_costs_max_ms")]
    cells[name] = {"predicted_step_s": values[0],
                   "predicted_min_s": values[1],
                   "predicted_max_s": values[2]}
  return cells


def _write(name, payload):
  user_files.write_output(os.path.join(_OUT_DIR.value, name), payload,
                          "--out_dir")


def _header():
  return {"command": " ".join(["python -m research.model_validation"] +
                              sys.argv[1:]),
          "host": platform.node(), "machine": platform.machine(),
          "num_cores": _cores(), "onednn": runtime_env.onednn_state(),
          "steps": _STEPS.value, "steps_per_loop": _STEPS_PER_LOOP.value,
          "repetitions": _REPETITIONS.value,
          "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def repredict(folder):
  """Today's model on an earlier run's profiles; its measured cells kept."""
  predictions, measured = (owned_dir.load_json(
      os.path.join(folder, name), {key: dict},
      received=f"repredict={folder!r}") for name, key in (
          ("predictions.json", "groups"), ("measured.json", "cells")))
  strategies = list(dict.fromkeys(c.split("/")[2] for c in measured["cells"]))
  for key, group in predictions["groups"].items():
    network, plan = key.split("/")
    by_batch, group["contention_source"] = contention(
        network, _CONTENTION_FROM.value, PLANS[plan][2])
    group["contention"] = {str(b): c for b, c in by_batch.items()}
    group["cells"] = predict_cells(group, plan, strategies, by_batch)
  predictions["in_sample"] = (
      f"re-predicted from {folder} by `--repredict_from` after its cells were "
      f"timed: in sample")
  _write("predictions.json", json.dumps(predictions, indent=1) + "\n")
  report = validation_report.render(predictions, measured)
  _write("report.md", report.replace(
      "# Schedule model, validated out of sample",
      "# Schedule model, re-predicted IN SAMPLE from " + folder +
      "\n\nToday's model on the op costs profiled before these cells were "
      "timed; the measurements were seen before this model was written."))
  print(os.path.join(_OUT_DIR.value, "report.md"))


@error_boundary.guard()
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  validate()
  os.makedirs(_OUT_DIR.value, exist_ok=True)
  if _REPREDICT.value:
    repredict(_REPREDICT.value)
    return
  strategies = list(dict.fromkeys(_STRATEGIES.value))
  groups = [(n, p) for n in _NETWORKS.value for p in _PLANS.value]
  predictions = dict(_header(), groups={})
  microbatches = sorted({benchmark_lib.parse_cell(name)[1]
                         for name in strategies} - {1})
  factors = {}
  for network in _NETWORKS.value:
    for threads in sorted({PLANS[p][2] for p in _PLANS.value}):
      if _CONTENTION_FROM.value is None:
        print(f"probing {network}'s contention ({threads} threads)",
              file=sys.stderr, flush=True)
        factors[network, threads] = probe_contention(network, threads,
                                                     microbatches)
      else:
        factors[network, threads] = contention(
            network, _CONTENTION_FROM.value, threads)
  for network, plan in groups:
    print(f"profiling {network} on {plan}", file=sys.stderr, flush=True)
    profile = _benchmark(network, plan, "profile",
                         ["--host_reference",
                          f"--repetitions={_REPETITIONS.value}",
                          "--microbatches=" + ",".join(map(str, microbatches))])
    by_batch, source = factors[network, PLANS[plan][2]]
    predictions["groups"][f"{network}/{plan}"] = dict(
        profile, contention={str(b): c for b, c in by_batch.items()},
        contention_source=source,
        cells=predict_cells(profile, plan, strategies, by_batch))
  # Every prediction is on disk before the first timed run.
  _write("predictions.json", json.dumps(predictions, indent=1) + "\n")
  measured = dict(_header(), cells={})
  for network, plan in groups:
    for name in strategies:
      print(f"timing {network} {plan} {name}", file=sys.stderr, flush=True)
      cell = f"{network}/{plan}/{name}"
      try:
        run = _benchmark(network, plan, "worker",
                         [f"--strategies={name}", "--costs=false",
                          "--fit=false", "--host_reference"])
      except RuntimeError as e:  # One failed cell does not end the grid.
        measured["cells"][cell] = {"error": str(e)}
      else:
        row = run["strategies"][name]
        measured["cells"][cell] = dict(
            {key: row[key] for key in ("measured_step_s", "measured_min_s",
                                       "measured_max_s")},
            host_reference_ms=run["host_reference_ms"])
      _write("measured.json", json.dumps(measured, indent=1) + "\n")
  _write("report.md", validation_report.render(predictions, measured))
  print(os.path.join(_OUT_DIR.value, "report.md"))


if __name__ == "__main__":
  app.run(main)
