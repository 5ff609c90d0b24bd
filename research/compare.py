r"""Every strategy over seeds, measured and projected: `python -m research.compare`.

  python -m research.compare --preset=fashion_mnist_resnet \
      --strategies=e2e,local,2wise,3wise --seeds=3 --train_steps=300 \
      --out_dir=runs/study_fashion_mnist

Each (strategy, seed) trains --train_steps steps (seed = --seed + i) in its
own `python -m train.train` process, with --preset and every Config flag
given here, and is evaluated on the whole evaluation split (unless
--eval_batches is given) at --eval_points evenly spaced steps. The per-module
op costs (`research.module_costs`) and the schedule model predict each
strategy's step time with one core per module; the report puts the measured
per-step curves on the measured and on the predicted time axis (see
`step_model.projection`).

A run with an out_dir/<strategy>/seed_<seed>/result.json is not rerun; an
unfinished one restarts from scratch. Writes results.json, report.md and the
PNG plots of `research.study_report.PLOTS` to out_dir and to --report_dir.

Compare deletes only what it made: out_dir and every run folder carry its
marker (`research.study_owner`); a run folder that is not this study's, or an
unfinished one that a live process holds (its lock.json), is refused in one
line before anything is written. Each spelling of --strategies is parsed:
one strategy given twice ('2wise,pairwise') is refused.

--model_fn=package.module:function with --data=package.module:function runs
the same study on your own Keras network instead of a preset
(`research.user_study`, docs/user_study.md).
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import dataclasses
import importlib.util
import os
import shlex
import sys

from absl import app
from absl import flags
import tensorflow as tf

from train import config as config_lib
from train import error_boundary
from train import flags_lib
from train import paths
from train import run_dir
from research import study_lib
from research import study_report
from research import user_study

_STRATEGIES = flags.DEFINE_list(
    "strategies", ["e2e", "local", "2wise", "3wise"], "Strategies to train, "
    "comma-separated (e2e, local, Nwise, Nwise-sum), each with its own "
    "variant.")
_SEEDS = flags.DEFINE_integer("seeds", 1, "Runs per strategy (>= 1; seed = "
                              "--seed + i).")
_EVAL_POINTS = flags.DEFINE_integer(
    "eval_points", 10, "Evaluations per run (>= 2), evenly spaced in "
    "steps; the curves and time-to-target use them.")
_TARGET = flags.DEFINE_float(
    "target", None, "Eval metric (accuracy or perplexity) whose time to "
    "reach is reported; default: e2e's mean final metric.")
_JOBS = flags.DEFINE_integer(
    "jobs", 1, "Runs at a time (>= 1); more than 1 overlaps them (the "
    "report says so).")
_PLOTS = flags.DEFINE_bool(
    "plots", True, "Draw the report's PNG plots with matplotlib (false: "
    "report and results only).")
_COST_REPEATS = flags.DEFINE_integer(
    "cost_repeats", 10, "Timed calls (>= 1) per op when measuring the op "
    "costs for the schedule model.")
_OUT_DIR = flags.DEFINE_string(
    "out_dir", None, "Folder (required) of one run per strategy and seed, "
    "the report, results and plots; reruns reuse it.")
_REPORT_DIR = flags.DEFINE_string(
    "report_dir", None, "Also write the report, results and plots here "
    "(e.g. docs/results/NAME); default: only --out_dir.")
_BREAK_LOCK = flags.DEFINE_bool(
    "break_lock", False, "Restart an unfinished run although the process "
    "holding its lock.json looks alive (it is known to be dead).")
_MODEL_FN = flags.DEFINE_string(
    "model_fn", None, "Your own network instead of --preset: "
    "'package.module:function' (or 'file.py:function') returning a fresh, "
    "built keras.Model; with --data. See docs/user_study.md.")
_DATA = flags.DEFINE_string(
    "data", None, "With --model_fn: 'package.module:function' returning "
    "(train, evaluation) datasets or (x, y) arrays.")
# --help lists the Config flags too: each run takes them.
flags.adopt_module_key_flags(flags_lib)


def make_study(strategies, seeds, eval_points, jobs, out_dir):
  """Checks every flag before the first run; the `Study`."""
  for name, value, minimum in (("seeds", seeds, 1), ("jobs", jobs, 1),
                               ("eval_points", eval_points, 2),
                               ("cost_repeats", _COST_REPEATS.value, 1)):
    config_lib.check_number(name, value, minimum=minimum, integer=True)
  overrides = study_lib.config_overrides(
      {field.name: (not flags.FLAGS[field.name].using_default_value,
                    flags.FLAGS[field.name].value)
       for field in config_lib.flat_fields()})
  config = dataclasses.replace(flags_lib.config_from_flags(),
                               model_dir=out_dir)
  if "eval_batches" not in overrides:  # the whole split
    overrides["eval_batches"] = "none"
    config = dataclasses.replace(config, eval_batches=None)
  if config.run.train_steps is None:
    raise ValueError(f"compare runs a fixed number of steps: set "
                     f"--train_steps (preset {flags_lib.PRESET.value} has "
                     "none). Received: train_steps=None")
  strategies = study_lib.strategy_names(strategies, config.interlock.num_modules)
  for strategy in strategies:
    config_lib.validate(dataclasses.replace(config, strategy=strategy))
  every = study_lib.eval_every_steps(config.run.train_steps, eval_points,
                                     config.run.steps_per_loop)
  return study_lib.Study(
      preset=flags_lib.PRESET.value, overrides=overrides,
      strategies=tuple(strategies),
      seeds=tuple(config.run.seed + i for i in range(seeds)),
      train_steps=config.run.train_steps, eval_every_steps=every,
      metric="perplexity" if config.is_text else "accuracy",
      num_modules=config.interlock.num_modules, out_dir=out_dir, jobs=jobs)


def compare(strategies, seeds, eval_points, jobs, target, out_dir, command):
  """Checks the flags, then runs (or reuses) every run and reports."""
  study = make_study(strategies, seeds, eval_points, jobs, out_dir)
  report_dir = _REPORT_DIR.value
  if report_dir:
    study_report.check_report_dir(report_dir, _PLOTS.value)
  if _PLOTS.value and not importlib.util.find_spec("matplotlib"):
    raise ValueError("the plots need matplotlib (pip install matplotlib); "
                     "or pass --noplots. Received: plots=True")
  study_report.run_and_report(
      study, eval_points=eval_points, target=target, plots=_PLOTS.value,
      cost_repeats=_COST_REPEATS.value, command=command,
      report_dir=report_dir, break_lock=_BREAK_LOCK.value)


@error_boundary.guard()
def main(argv):
  if not _OUT_DIR.value:
    raise app.UsageError("--out_dir is required")
  for name, value in (("--out_dir", _OUT_DIR.value),
                      ("--report_dir", _REPORT_DIR.value)):
    run_dir.check_lasting(value, name)  # the study must outlive this process
  # This process only reads event files: keep it off the runs' GPUs.
  tf.config.set_visible_devices([], "GPU")
  command = "python -m research.compare " + " ".join(
      shlex.quote(a) for a in sys.argv[1:])
  try:
    blocker = paths.file_above(_OUT_DIR.value)
    if blocker is not None:
      raise ValueError(f"--out_dir={_OUT_DIR.value} is or lies under the "
                       f"file {blocker}. Received: out_dir={_OUT_DIR.value!r}")
    if _MODEL_FN.value or _DATA.value:
      user_study.compare_from_flags(
          _MODEL_FN.value, _DATA.value, flags_lib.config_from_flags(),
          flags_lib.given_flags(), preset_given=flags.FLAGS["preset"].present,
          seeds=_SEEDS.value,
          **({"strategies": _STRATEGIES.value}
             if flags.FLAGS["strategies"].present else {}),
          eval_points=_EVAL_POINTS.value, jobs=_JOBS.value,
          target=_TARGET.value, out_dir=_OUT_DIR.value,
          report_dir=_REPORT_DIR.value, plots=_PLOTS.value,
          cost_repeats=_COST_REPEATS.value, break_lock=_BREAK_LOCK.value,
          command=command)
    else:
      compare(_STRATEGIES.value, _SEEDS.value, _EVAL_POINTS.value,
              _JOBS.value, _TARGET.value, _OUT_DIR.value, command)
  except (ValueError, FileNotFoundError, study_lib.RunError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(f"wrote {os.path.join(_OUT_DIR.value, 'report.md')}")


if __name__ == "__main__":
  app.run(main)
