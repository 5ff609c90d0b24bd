r"""The strategy study on your own Keras network: `compare(model_fn, data)`.

  from research import user_study
  user_study.compare("my_pkg.nets:cnn", "my_pkg.nets:data",
                     strategies=("e2e", "2wise", "local"), seeds=(0, 1, 2),
                     time_budget_s=120, eval_every_steps=50,
                     out_dir="runs/my_cnn")

or `python -m research.compare --model_fn=my_pkg.nets:cnn
--data=my_pkg.nets:data ...`. Per (strategy, seed) the network `model_fn`
builds is cut by `ti.from_keras` into K modules, trained by
`ti.InterlockModel.fit` for `steps` steps or for `time_budget_s` seconds of
training (`ti.callbacks.TimeBudget(count="batches")`), and evaluated on the
whole evaluation data every `eval_every_steps` steps. The per-module op costs
(`step_model.profiling.measure_module_costs`) feed the schedule model's
projection with one core per module. The report, results and plots are the
preset studies' (`research.study_report`), in out_dir and --report_dir; a
rerun reuses finished runs, as there.

Every run, and the op-cost measurement, runs in its own Python process
(`research.user_study_cell`), as the preset studies run each in its own
`train.train`. A fair wall-clock comparison needs it: the placement's
logical devices and the one-thread-per-op pools are process-wide and must be
set before TensorFlow starts (the caller's own process has usually started
it, with every core per op); and in one process the later runs would inherit
the earlier runs' warm caches, memory and traced functions. So `model_fn`
and `data` must be importable by name: "package.module:function",
"path/to/file.py:function", or a module-level function (its name is
taken; one in a script must be defined at the script's top level).

`model_fn()` or `model_fn(seed)` returns a fresh, built `keras.Model`
(`keras.utils.set_random_seed(seed)` runs before it). `data()` or
`data(seed)` returns `(train, evaluation)`, each a `tf.data.Dataset` of
`(features, labels)` batches or a tuple `(x, y)` of arrays (batched with
`batch_size`, the training data shuffled with the seed). The training data
is repeated; each step takes one batch.
"""

import importlib
import importlib.util
import inspect
import json
import math
import os
import sys

import keras
import tensorflow as tf

import tf_interlock as ti
from research import study_lib
from research import study_report
from train import owned_dir
from train import paths

METRICS = ("accuracy", "perplexity")
PLACEMENTS = ("simulated", "single")
CELL = "research.user_study_cell"
# Set in a run's process: a script that calls compare() unguarded and is
# imported there would otherwise start the study again.
IN_CELL = "TF_INTERLOCK_USER_STUDY_RUN"


def reference(fn, name):
  """The "module:function" (or "file.py:function") name of `fn`.

  Raises:
    ValueError: `fn` is neither such a string nor a module-level function.
  """
  if isinstance(fn, str):
    resolve(fn, name)
    return fn
  module = getattr(fn, "__module__", None)
  qualname = getattr(fn, "__qualname__", "")
  if not callable(fn) or module is None or "<" in qualname:
    raise ValueError(
        f"{name} must be 'package.module:function', 'file.py:function' or a "
        f"module-level function (each run imports it in its own process). "
        f"Received: {name}={fn!r}")
  if module == "__main__":
    # Checked here without running the script again; the runs load it by
    # its path, not as __main__.
    main = sys.modules["__main__"]
    if getattr(main, qualname, None) is not fn:
      raise ValueError(f"{name} must be defined at the top level of the "
                       f"script. Received: {name}={fn!r}")
    return f"{os.path.abspath(main.__file__)}:{qualname}"
  ref = f"{module}:{qualname}"
  resolve(ref, name)
  return ref


def _search_path(ref):
  """The folder to put on sys.path so that `ref`'s module imports."""
  module = ref.rpartition(":")[0]
  if module.endswith(".py"):
    return None
  spec = importlib.util.find_spec(module.split(".")[0])
  if spec is None or not spec.origin:
    return None
  top = os.path.dirname(spec.origin)
  # A package's origin is its __init__.py; a module's, its file.
  return os.path.dirname(top) if spec.submodule_search_locations else top


def resolve(ref, name, search=()):
  """The function that `ref` ("module:function", "file.py:function")
  names, after putting the folders `search` on sys.path."""
  module, _, attr = ref.rpartition(":")
  received = f"Received: {name}={ref!r}"
  if not module or not attr:
    raise ValueError(f"{name} must look like 'package.module:function' or "
                     f"'path/file.py:function'. {received}")
  for folder in search:
    if folder and folder not in sys.path:
      sys.path.insert(0, folder)
  try:
    if module.endswith(".py"):
      # Not as __main__: a script's `if __name__ == "__main__"` stays off.
      spec = importlib.util.spec_from_file_location(
          "user_study_" + os.path.basename(module)[:-3], module)
      loaded = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(loaded)
    else:
      loaded = importlib.import_module(module)
  except (ImportError, OSError) as e:
    raise ValueError(f"{name}: cannot import {module} ({e}). "
                     f"{received}") from None
  fn = loaded
  for part in attr.split("."):
    fn = getattr(fn, part, None)
  if not callable(fn):
    raise ValueError(f"{name}: {module} has no function {attr}. {received}")
  return fn


def call_with_seed(fn, seed):
  """`fn(seed)` if it takes an argument, else `fn()`."""
  try:
    takes = bool(inspect.signature(fn).parameters)
  except (TypeError, ValueError):
    takes = False
  return fn(seed) if takes else fn()


def build_model(build, seed, ref):
  """The `keras.Model` that `build` (model_fn) returns, or one line saying
  what it did instead: returned something else, raised, or exited
  (`builtins:exit` would end the study with status 0, having done nothing;
  `os:system` is no model function).

  Raises:
    ValueError: naming model_fn and what it did.
  """
  received = f"Received: model_fn={ref!r}"
  try:
    model = call_with_seed(build, seed)
  except (Exception, SystemExit) as e:  # pylint: disable=broad-except
    what = "exited" if isinstance(e, SystemExit) else "raised"
    first = (str(e).strip().splitlines() or [""])[0][:200]
    raise ValueError(
        f"model_fn {what} ({type(e).__name__}: {first}) instead of returning "
        f"a keras.Model; model_fn() or model_fn(seed) must return a fresh, "
        f"built keras.Model. {received}") from None
  if not isinstance(model, keras.Model):
    raise ValueError(
        f"model_fn returned {type(model).__name__}, not a keras.Model; "
        f"model_fn() or model_fn(seed) must return a fresh, built "
        f"keras.Model. {received}")
  return model


def _check(name, value, minimum, integer=True):
  kinds = (int,) if integer else (int, float)
  if (isinstance(value, bool) or not isinstance(value, kinds) or
      not math.isfinite(value) or value < minimum or
      (not integer and value <= 0)):
    kind = "an int" if integer else "a finite number"
    bound = f">= {minimum}" if integer else "> 0"
    raise ValueError(f"{name} must be {kind} {bound}. "
                     f"Received: {name}={value!r}")


def make_study(model_ref, data_ref, *, out_dir, strategies, seeds, steps,
               time_budget_s, num_modules, eval_points, eval_every_steps,
               steps_per_execution, settings, jobs):
  """Checks the length of the runs and their evaluations; the `Study`."""
  if (steps is None) == (time_budget_s is None):
    raise ValueError(f"give steps or time_budget_s, one of them. Received: "
                     f"steps={steps!r}, time_budget_s={time_budget_s!r}")
  for name, value in (("num_modules", num_modules), ("jobs", jobs),
                      ("steps_per_execution", steps_per_execution)):
    _check(name, value, 1)
  seeds = tuple(seeds)
  if not seeds or len(set(seeds)) < len(seeds):
    raise ValueError(f"seeds must be distinct ints, at least one. "
                     f"Received: seeds={seeds!r}")
  for seed in seeds:
    _check("seed", seed, 0)
  if steps is not None:
    _check("steps", steps, 1)
    _check("eval_points", eval_points, 2)
    if eval_every_steps is None:
      eval_every_steps = study_lib.eval_every_steps(steps, eval_points,
                                                    steps_per_execution)
  else:
    _check("time_budget_s", time_budget_s, 0, integer=False)
    if eval_every_steps is None:
      raise ValueError("a time budget needs eval_every_steps (steps between "
                       "evaluations). Received: eval_every_steps=None")
  _check("eval_every_steps", eval_every_steps, 1)
  if eval_every_steps % steps_per_execution or (
      steps is not None and steps % eval_every_steps):
    raise ValueError(
        f"eval_every_steps must be a multiple of steps_per_execution="
        f"{steps_per_execution} and divide steps={steps}. "
        f"Received: eval_every_steps={eval_every_steps}")
  return study_lib.Study(
      preset=model_ref, overrides={"data": data_ref, **settings},
      strategies=tuple(study_lib.strategy_names(
          strategies.split(",") if isinstance(strategies, str)
          else list(strategies), num_modules)),
      seeds=seeds, train_steps=steps, eval_every_steps=eval_every_steps,
      metric=settings["metric"], num_modules=num_modules,
      out_dir=paths.normalize(out_dir), jobs=jobs)


def _cell_args(study, out, **cell):
  """The cell process's one flag: everything it needs, as JSON."""
  folders = [_search_path(study.preset), _search_path(study.overrides["data"]),
             os.getcwd()]
  spec = {"model_fn": study.preset, "train_steps": study.train_steps,
          "search_path": [f for f in folders if f],
          "eval_every_steps": study.eval_every_steps,
          "num_modules": study.num_modules, **study.overrides, "out": out,
          **cell}
  return ["--cell=" + json.dumps(spec)]


def _raw_path(study, name):
  return os.path.join(study.out_dir, "logs", name + ".json")


def train_cell(study, strategy, seed, model_dir):
  """One run in its own process (`research.user_study_cell`); its result."""
  raw = _raw_path(study, f"{strategy}_seed_{seed}")
  study_lib.launch(CELL, _cell_args(study, raw, mode="run", strategy=strategy,
                                    seed=seed, model_dir=model_dir),
                   os.path.join(study.out_dir, "logs",
                                f"{strategy}_seed_{seed}.log"))
  return owned_dir.load_json(raw, received=f"out_dir={study.out_dir!r}")


def measure_cell(study, repeats, raw):
  """The op costs, measured in their own process, into the file `raw`."""
  study_lib.launch(CELL, _cell_args(study, raw, mode="costs",
                                    strategy=study.strategies[0],
                                    strategies=list(study.strategies),
                                    seed=study.seeds[0], repeats=repeats),
                   os.path.join(study.out_dir, "logs", "module_costs.log"))


def run_all_common_steps(study, break_lock, train):
  """`study_lib.run_all`, each seed's curve cut to the evaluation steps
  that every seed of its strategy reached (a time budget ends seeds at
  different steps; the seeds' bands need the same steps)."""
  runs = study_lib.run_all(study, break_lock, train)
  for results in runs.values():
    common = set.intersection(*({p["step"] for p in r["curve"]}
                                for r in results))
    for result in results:
      result["curve"] = [p for p in result["curve"] if p["step"] in common]
  return runs


def optimizer_config(optimizer):
  """A name, or a Keras optimizer's serialized config (JSON for the runs)."""
  if isinstance(optimizer, str):
    keras.optimizers.get(optimizer)  # an unknown name raises here
    return optimizer
  if isinstance(optimizer, keras.optimizers.Optimizer):
    return keras.optimizers.serialize(optimizer)
  raise ValueError(f"optimizer must be a name such as 'adam' or a "
                   f"keras.optimizers.Optimizer. Received: "
                   f"optimizer={optimizer!r}")


def compare(model_fn, data, *, out_dir, strategies=("e2e", "2wise", "local"),
            seeds=(0, 1, 2), steps=None, time_budget_s=None, num_modules=3,
            split=None, balance="flops", aux_head="linear", batch_size=32,
            optimizer="adam", loss=None, metric="accuracy",
            placement="simulated", threads_per_device=1,
            steps_per_execution=1, eval_points=10, eval_every_steps=None,
            target=None, plots=True, cost_repeats=10, report_dir=None,
            jobs=1, break_lock=False, command=None):
  """Trains every (strategy, seed) of your network and writes the report.

  Args:
    model_fn: "package.module:function", "file.py:function" or a
      module-level function; `model_fn()` or `model_fn(seed)` returns a
      fresh, built `keras.Model` (see the module docstring).
    data: the same kinds of name; returns `(train, evaluation)`.
    out_dir: folder of the runs, report.md, results.json and the plots.
    strategies: strategy names ("e2e", "local", "2wise", "3wise-sum", ...).
    seeds: one run per strategy and seed.
    steps: training steps per run; or
    time_budget_s: seconds of training per run (the training clock: the
      first call's tracing and the evaluations are not counted), checked
      once per `steps_per_execution` steps (`ti.callbacks.TimeBudget`).
    num_modules, split, balance, aux_head: `ti.from_keras`'s.
    batch_size: the batch of array data.
    optimizer: a name or a Keras optimizer (cloned per module).
    loss: a Keras loss name; None: sparse softmax cross-entropy on logits.
    metric: "accuracy" or "perplexity" (exp of the network's loss).
    placement: "simulated" (one logical CPU device per module with
      `threads_per_device` threads per op: one core per module) or "single".
    threads_per_device: intra-op threads per device (placement simulated).
    steps_per_execution: steps per call of the train function.
    eval_points: with `steps`, evaluations per run (>= 2).
    eval_every_steps: steps between evaluations (needed with a budget).
    target: the metric to reach; None: e2e's mean final metric.
    plots: draw the PNG plots (needs matplotlib).
    cost_repeats: timed calls per op for the op costs.
    report_dir: a second folder for report, results and plots.
    jobs: runs at a time (> 1 overlaps them: the report says so).
    break_lock: restart an unfinished run whose lock looks alive.
    command: how the study was started, for the report.

  Returns:
    The summary written to results.json.

  Raises:
    ValueError: in one line, before anything is written, for a bad
      argument or an out_dir this study cannot use.
  """
  if os.environ.get(IN_CELL):
    raise ValueError(
        "compare() ran again inside one of its own runs, which imported "
        "your script: call it under `if __name__ == \"__main__\":`. "
        f"Received: {IN_CELL}={os.environ[IN_CELL]}")
  if not isinstance(out_dir, str) or not out_dir:
    raise ValueError(f"out_dir must name a folder. "
                     f"Received: out_dir={out_dir!r}")
  model_ref = reference(model_fn, "model_fn")
  data_ref = reference(data, "data")
  if metric not in METRICS:
    raise ValueError(f"metric must be one of {METRICS}. "
                     f"Received: metric={metric!r}")
  if placement not in PLACEMENTS:
    raise ValueError(f"placement must be one of {PLACEMENTS}. "
                     f"Received: placement={placement!r}")
  for name, value, minimum in (("batch_size", batch_size, 1),
                               ("threads_per_device", threads_per_device, 1),
                               ("cost_repeats", cost_repeats, 1)):
    _check(name, value, minimum)
  if loss is not None and not isinstance(loss, str):
    raise ValueError(f"loss must be a Keras loss name or None. "
                     f"Received: loss={loss!r}")
  settings = {
      "split": None if split is None else list(split), "balance": balance,
      "aux_head": aux_head, "batch_size": batch_size,
      "optimizer": optimizer_config(optimizer), "loss": loss,
      "metric": metric, "placement": placement,
      "threads_per_device": threads_per_device,
      "steps_per_execution": steps_per_execution,
      "time_budget_s": time_budget_s, "eval_batches": "none"}
  study = make_study(
      model_ref, data_ref, out_dir=out_dir, strategies=strategies,
      seeds=seeds, steps=steps, time_budget_s=time_budget_s,
      num_modules=num_modules, eval_points=eval_points,
      eval_every_steps=eval_every_steps,
      steps_per_execution=steps_per_execution, settings=settings, jobs=jobs)
  # The cut, here: a network that from_keras refuses fails before any run.
  build = model_fn if callable(model_fn) else resolve(model_ref, "model_fn")
  source = build_model(build, study.seeds[0], model_ref)
  ti.from_keras(source, num_modules, split=split, balance=balance,
                aux_head=aux_head)
  blocker = paths.file_above(study.out_dir)
  if blocker is not None:
    raise ValueError(f"out_dir={out_dir} is or lies under the file "
                     f"{blocker}. Received: out_dir={out_dir!r}")
  if report_dir:
    study_report.check_report_dir(report_dir, plots)
  if plots and not importlib.util.find_spec("matplotlib"):
    raise ValueError("the plots need matplotlib (pip install matplotlib); "
                     "or pass plots=False. Received: plots=True")
  if command is None:
    command = (f"{study_report.COMMAND} --model_fn={model_ref} "
               f"--data={data_ref} (from Python: research.user_study.compare;"
               " every setting is in results.json's overrides)")
  return study_report.run_and_report(
      study, eval_points=eval_points if steps is not None else None,
      target=target, plots=plots,
      cost_repeats=cost_repeats, command=command, report_dir=report_dir,
      break_lock=break_lock, train=train_cell, measure=measure_cell,
      run_all=run_all_common_steps,
      extra={"time_budget_s": time_budget_s, "model_fn": model_ref,
             "data": data_ref})


# The Config flags `research.compare --model_fn` takes, and the argument of
# `compare` each sets (--optimizer, --learning_rate and --seed apart).
CONFIG_ARGS = {"train_steps": "steps", "time_budget_s": "time_budget_s",
               "num_modules": "num_modules", "split": "split",
               "aux_head": "aux_head", "batch_size": "batch_size",
               "placement": "placement",
               "threads_per_device": "threads_per_device",
               "steps_per_loop": "steps_per_execution",
               "eval_every_steps": "eval_every_steps"}
# --aux_head's values (`layers.aux_heads.KINDS`) that a study passes to
# `from_keras` as another: "pool" builds the "linear" head (pool -> dense on
# image features, and a head for any features), "none" None, as studies
# written before the registry recorded them; "auto" (the binaries' default,
# the network's own) is from_keras's own default, "linear".
_AUX_HEADS = {"pool": "linear", "none": None, "auto": "linear"}


def compare_from_flags(model_fn, data, config, given, *, preset_given,
                       seeds, **kwargs):
  """`research.compare --model_fn`: the Config flags given, as `compare`'s
  arguments.

  Args:
    model_fn, data: --model_fn and --data.
    config: `flags_lib.config_from_flags()`; only the `given` fields count.
    given: the names of the Config flags given on the command line.
    preset_given: whether --preset was given (refused: the network is
      model_fn's).
    seeds: --seeds, the number of runs per strategy (seed = --seed + i).
    **kwargs: the other arguments of `compare`, from compare's own flags.

  Returns:
    `compare`'s summary.
  """
  allowed = set(CONFIG_ARGS) | {"optimizer", "learning_rate", "seed"}
  if preset_given or given - allowed:
    name = "preset" if preset_given else sorted(given - allowed)[0]
    raise ValueError(
        f"--{name} does not apply with --model_fn (your network and data "
        f"stand for the preset); the flags it takes besides compare's: "
        f"{', '.join('--' + n for n in sorted(allowed))}. "
        f"Received: {name} given")
  args = {CONFIG_ARGS[name]: config.get(name)
          for name in given & set(CONFIG_ARGS)}
  if "aux_head" in args:
    args["aux_head"] = _AUX_HEADS.get(args["aux_head"], args["aux_head"])
  if given & {"optimizer", "learning_rate"}:
    optimizer = keras.optimizers.get(config.optim.optimizer if "optimizer" in given
                                     else "adam")
    if "learning_rate" in given:
      optimizer = type(optimizer)(learning_rate=config.optim.learning_rate)
    args["optimizer"] = optimizer
  first = config.run.seed if "seed" in given else 0
  _check("seeds", seeds, 1)
  return compare(model_fn, data, seeds=tuple(first + i for i in range(seeds)),
                 **args, **kwargs)
