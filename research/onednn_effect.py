r"""oneDNN's effect per preset: op costs with it off and on, and what follows.

  python -m research.onednn_effect \
      --presets=fashion_mnist_resnet,fortunes_lm,synthetic_mlp \
      --out_dir=docs/results/onednn_effect

TF reads TF_ENABLE_ONEDNN_OPTS once, when it loads, so each setting runs
`research.module_costs` in a process of its own (the preset's model, placement
and batch, one thread per op). Off and on alternate for --rounds rounds and
the median of each op cost is kept, which evens out a busy machine. From
the costs it reports the one-thread work of a step and, through the schedule
model (`step_model.schedule`), each strategy's step time on this host's
cores and with one core per module: the effect on every strategy.
Writes onednn_effect.json and onednn_effect.md to --out_dir.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import tensorflow as tf

from step_model import schedule
from step_model import threading_plan
from train import config as config_lib
from train import error_boundary
from train import owned_dir
from train import user_files

_PRESETS = flags.DEFINE_list(
    "presets", ["fashion_mnist_resnet", "fortunes_lm", "synthetic_mlp"],
    "Presets to measure (each with its own model, placement and batch).")
_STRATEGIES = flags.DEFINE_list("strategies", ["e2e", "local", "2wise"],
                                "Strategies the schedule model times.")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 2, "Off/on measurement pairs (>= 1) per preset; op costs are "
    "their medians.")
_REPEATS = flags.DEFINE_integer(
    "repeats", 10, "Timed calls (>= 1) per op in one measurement "
    "(research.module_costs --repeats).")
_OUT_DIR = flags.DEFINE_string(
    "out_dir", "runs/onednn_effect", "Folder onednn_effect.json and "
    "onednn_effect.md are written to.")
_EXTRA = flags.DEFINE_list("extra_flags", [],
                           "More train flags for every preset (e.g. smaller "
                           "sizes), without dashes: mlp_width=64.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = ("0", "1")  # TF_ENABLE_ONEDNN_OPTS: off, on.


def measure_costs(preset, setting, repeats, extra):
  """`research.module_costs` of `preset` in its own process with oneDNN at
  `setting`; its JSON, which must report the setting it ran with."""
  env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=setting,
             PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "costs.json")
    proc = subprocess.run(
        [sys.executable, "-m", "research.module_costs", f"--preset={preset}",
         f"--repeats={repeats}", f"--out={out}",
         *[f"--{flag}" for flag in extra]],
        cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
      tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
      raise RuntimeError(f"research.module_costs --preset={preset} with "
                         f"TF_ENABLE_ONEDNN_OPTS={setting} failed: {tail}")
    costs = owned_dir.load_json(out, received=f"preset={preset!r}")
  if costs.get("onednn") != setting:
    raise RuntimeError(f"research.module_costs ran with oneDNN "
                       f"{costs.get('onednn')!r}, not {setting!r}. "
                       f"Received: preset={preset!r}")
  return costs


def median_costs(runs):
  """Per module and op, the median over `runs` (module_costs JSONs)."""
  first = runs[0]
  return dict(first, costs=[
      {op: statistics.median(run["costs"][k][op] for run in runs)
       for op in module} for k, module in enumerate(first["costs"])])


def summarize(costs, strategies, cores):
  """One-thread work per step and predicted step seconds per strategy."""
  modules = [schedule.ModuleCost(**c) for c in costs["costs"]]
  k = len(modules)
  return {
      "work_s": sum(sum(c.values()) for c in costs["costs"]),
      "step_s": {s: {f"{n} cores": schedule.simulate(
          modules, s, num_cores=n, has_aux=costs["has_aux"],
          num_microbatches=costs["num_microbatches"]).step_time
                     for n in sorted({min(cores, k), k})}
                 for s in strategies},
  }


def report_markdown(results):
  """A table per preset: off, on and the speedup, work and strategies."""
  lines = ["# oneDNN off and on, per preset", "",
           f"Cores here: {results['cores']}; medians of {results['rounds']} "
           "alternating off/on rounds of `research.module_costs`. Step times "
           "are the schedule model's, from those costs.", ""]
  for preset, row in results["presets"].items():
    off, on = row["off"], row["on"]
    lines += [f"## {preset}", "", "| quantity | off ms | on ms | speedup |",
              "|---|---|---|---|",
              f"| one-thread work per step | {off['work_s'] * 1e3:.1f} | "
              f"{on['work_s'] * 1e3:.1f} | "
              f"{off['work_s'] / on['work_s']:.2f}x |"]
    for strategy, cases in off["step_s"].items():
      for cores, seconds in cases.items():
        now = on["step_s"][strategy][cores]
        lines.append(f"| {strategy} step, {cores} (model) | "
                     f"{seconds * 1e3:.1f} | {now * 1e3:.1f} | "
                     f"{seconds / now:.2f}x |")
    lines.append("")
  return "\n".join(lines)


@error_boundary.guard()
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  try:
    for preset in _PRESETS.value:
      config_lib.check_choice("presets", preset, config_lib.PRESETS)
    config_lib.check_positive("rounds", _ROUNDS.value, integer=True)
    config_lib.check_positive("repeats", _REPEATS.value, integer=True)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  cores = threading_plan.host_cores()
  results = {"cores": cores, "rounds": _ROUNDS.value, "presets": {}}
  for preset in _PRESETS.value:
    runs = {setting: [] for setting in SETTINGS}
    for _ in range(_ROUNDS.value):
      for setting in SETTINGS:
        runs[setting].append(measure_costs(preset, setting, _REPEATS.value,
                                           _EXTRA.value))
    results["presets"][preset] = {
        name: summarize(median_costs(runs[setting]), _STRATEGIES.value,
                        cores)
        for name, setting in zip(("off", "on"), SETTINGS)}
  tf.io.gfile.makedirs(_OUT_DIR.value)
  user_files.write_output(os.path.join(_OUT_DIR.value, "onednn_effect.json"),
                          json.dumps(results, indent=2), "--out_dir")
  text = report_markdown(results)
  user_files.write_output(os.path.join(_OUT_DIR.value, "onednn_effect.md"),
                          text, "--out_dir")
  print(text)


if __name__ == "__main__":
  app.run(main)
