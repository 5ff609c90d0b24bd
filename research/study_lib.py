"""The runs of a multi-seed study (`research.compare`).

Each (strategy, seed) trains for the same number of steps in its own
`python -m train.train` process into out_dir/<strategy>/seed_<seed>, and is
evaluated on the whole evaluation split at `eval_points` evenly spaced steps;
`research.study_clock` reads its clocks from the run's event files.

Then the per-module op costs (`research.module_costs`, own process) and the
schedule model give each strategy's predicted step time: with as many cores
as here, and with one core per module.

`check_study` reads everything stored in out_dir before the first write:
run folders must be this study's (`research.study_owner`), stored results and
op costs complete and made with the same settings, no run in use.
"""

import collections
import concurrent.futures
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
from typing import Optional

import tensorflow as tf

from tf_interlock import routing
from tf_interlock import strategy as strategy_lib
from step_model import projection
from step_model import schedule
from train import config as config_lib
from research import legacy_heads
from research import study_clock
from research import study_owner
from research import study_store
from train import owned_dir
from train import stop_watchdog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Config fields that compare sets itself, and the flag that sets them.
SET_BY_COMPARE = {"strategy": "--strategies",
                  "variant": "--strategies (e.g. 2wise-sum)",
                  "model_dir": "--out_dir",
                  "export_dir": "--out_dir", "eval_every_steps": "--eval_points",
                  "time_budget_s": "--train_steps",
                  "epochs": "--train_steps",
                  "checkpoint_every_steps": "(none: only the final one)"}
# No checkpoint inside the loop: its time would land in an evaluation's.
NEVER = 10**9
RESULT_FILE = "result.json"
COSTS_FILE = "module_costs.json"


class RunError(RuntimeError):
  """A subprocess failed; the message holds the end of its log."""


@dataclasses.dataclass(frozen=True)
class Study:
  """What every run of a study shares (its settings are stored with each)."""
  preset: str
  overrides: dict  # {Config field: flag text} given on the command line
  strategies: tuple
  seeds: tuple
  train_steps: int
  eval_every_steps: int
  metric: str
  num_modules: int
  out_dir: str
  jobs: int = 1
  owner: Optional[str] = None  # the study's id (`study_owner.claim`)

  def settings(self):
    """What a stored run must agree with to be reused."""
    return {"preset": self.preset, "overrides": self.overrides,
            "train_steps": self.train_steps,
            "eval_every_steps": self.eval_every_steps, "metric": self.metric}


def eval_every_steps(train_steps, eval_points, steps_per_loop):
  """Steps between evaluations: train_steps / eval_points whole loops.

  Raises:
    ValueError: when the points cannot be evenly spaced on loop ends.
  """
  every, remainder = divmod(train_steps, eval_points)
  if remainder or every % steps_per_loop:
    raise ValueError(
        f"--eval_points={eval_points} must divide --train_steps="
        f"{train_steps} into a whole number of loops of steps_per_loop="
        f"{steps_per_loop} steps. Received: eval_points={eval_points}")
  return every


def strategy_names(spellings, num_modules):
  """The names of --strategies, each strategy once.

  Spellings of one strategy train the same network the same way:
  'pairwise' is '2wise' is '2wise-only'; the variant means nothing for
  local (a window of one loss) or end-to-end; and a window n >= K is
  end-to-end (every module trained by the final loss, the aux heads by
  their own losses only), so with K = 4 '4wise' is 'e2e'.

  Args:
    spellings: the --strategies list.
    num_modules: K.

  Returns:
    The canonical names (`InterlockStrategy.name`), in the given order.

  Raises:
    ValueError: for an unknown spelling, or two that name one strategy.
  """
  received = f"Received: strategies={','.join(spellings)}"
  if not spellings:
    raise ValueError(f"--strategies must name at least one strategy. "
                     f"{received}")
  seen = {}
  for spelling in spellings:
    try:
      parsed = strategy_lib.parse_strategy(spelling)
    except ValueError as e:
      raise ValueError(f"--strategies: {str(e).split('. Received')[0]}. "
                       f"{received}") from None
    # One strategy is one routing (the variant matters only where the
    # window holds several losses: `RoutingPlan.routes`).
    key = routing.make_plan(parsed, num_modules).routes
    if key in seen:
      raise ValueError(
          f"--strategies names one strategy twice: {seen[key]!r} and "
          f"{spelling!r} train the same way with num_modules={num_modules}; "
          f"give it once. {received}")
    seen[key] = spelling
  return [strategy_lib.parse_strategy(s).name for s in spellings]


def train_args(study, strategy, **run_flags):
  """train.train's flags: the preset, the overrides, then `run_flags`.

  The variant is always given, from `strategy`'s name ("2wise" is "only",
  "2wise-sum" is "sum"), so a preset's own variant never changes what a
  strategy's name means.
  """
  variant = strategy_lib.parse_strategy(strategy).variant
  merged = {**study.overrides, "strategy": strategy, "variant": variant,
            **{k: str(v) for k, v in run_flags.items()}}
  return [f"--preset={study.preset}"] + [
      f"--{name}={value}" for name, value in merged.items()]


# The subprocesses `launch` is waiting for (one per --jobs thread).
_RUNNING = set()


def child_environment(environ=None):
  """A subprocess's environment: it stops a second before compare would be
  stopped by its own watchdog (so that its line is printed first), and
  it stops itself when compare is gone (even after a SIGKILL of compare:
  its watchdog sees its parent change; see train/stop_watchdog.py)."""
  environ = dict(os.environ if environ is None else environ)
  environ[stop_watchdog.GRACE_ENV] = str(
      max(stop_watchdog.grace_s(environ) - 1.0, 1.0))
  environ[stop_watchdog.PARENT_ENV] = str(os.getpid())
  return environ


def forward_stop(error):
  """Passes the signal that stopped compare (`error`: KeyboardInterrupt or
  the error boundary's `Terminated`) on to every running subprocess, which
  saves nothing (compare restarts an unfinished run) and exits."""
  signum = getattr(error, "signum", None)
  if isinstance(error, KeyboardInterrupt):
    signum = signal.SIGINT
  if signum is None:
    return
  for proc in list(_RUNNING):
    if proc.poll() is None:
      proc.send_signal(signum)


def launch(module, args, log_path):
  """Runs `python -m module args`, its output into `log_path`."""
  print(f"  {module} {' '.join(shlex.quote(a) for a in args)}", flush=True)
  tail = collections.deque(maxlen=20)
  with tf.io.gfile.GFile(log_path, "w") as log:
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=child_environment())
    _RUNNING.add(proc)
    try:
      for line in proc.stdout:
        log.write(line)
        tail.append(line)
      proc.wait()
    finally:
      if proc.poll() is None:  # compare stopped (Ctrl-C, SIGTERM, error)
        # Not left running unseen: on SIGTERM train.train releases its
        # lock and exits (compare restarts the run from scratch anyway).
        proc.terminate()
        proc.wait()
      _RUNNING.discard(proc)
  if proc.returncode:
    last = next((line.strip() for line in reversed(tail) if line.strip()),
                "")
    raise RunError(f"{module} exited with {proc.returncode}: {last} (log: "
                   f"{log_path})\n{''.join(tail)}")


def _run_dir(study, strategy, seed):
  return os.path.join(study.out_dir, strategy, f"seed_{seed}")


def _costs_settings(study, repeats):
  return {"preset": study.preset, "overrides": study.overrides,
          "repeats": repeats}


def check_study(study, repeats, break_lock=False):
  """Everything stored in out_dir that can refuse the study; writes nothing.

  Every existing run folder must be this study's; stored results and op
  costs complete and made with the same settings; no unfinished run held by
  a live process (a dead one's lock is taken over and so removed).

  Args:
    study: the `Study` (its owner is read here).
    repeats: the op costs' --cost_repeats.
    break_lock: take over a run's lock although its holder looks alive.

  Returns:
    The study's id from out_dir's marker; None for a new or empty out_dir.

  Raises:
    ValueError: in one line naming the folder or file at fault.
  """
  owner = study_owner.study_owner(study.out_dir)
  unfinished = []
  for strategy in study.strategies:
    for seed in study.seeds:
      model_dir = _run_dir(study, strategy, seed)
      state = study_owner.run_state(study.out_dir, model_dir, owner,
                                    strategy, seed, RESULT_FILE)
      if state == study_owner.FINISHED:
        study_store.read(os.path.join(model_dir, RESULT_FILE),
                         study.settings(), study_store.RESULT_FIELDS,
                         study_store.result_problem)
      elif state == study_owner.UNFINISHED:
        unfinished.append(model_dir)
  study_owner.check_unclaimed(study.out_dir, owner)
  study_store.read(os.path.join(study.out_dir, COSTS_FILE),
                   _costs_settings(study, repeats), study_store.COSTS_FIELDS)
  for model_dir in unfinished:
    study_owner.check_not_in_use(model_dir, break_lock)
  return owner


def train_preset(study, strategy, seed, model_dir):
  """One run of a preset study in its own `train.train` process; its
  clocks, evaluations and curve (`study_clock.summarize_run`)."""
  launch("train.train", train_args(
      study, strategy, seed=seed, model_dir=model_dir,
      train_steps=study.train_steps, eval_every_steps=study.eval_every_steps,
      checkpoint_every_steps=NEVER),
         os.path.join(study.out_dir, "logs", f"{strategy}_seed_{seed}.log"))
  return study_clock.summarize_run(model_dir, study.metric)


def run_one(study, strategy, seed, break_lock=False, train=train_preset):
  """Trains one (strategy, seed) unless its result exists; its result.

  Only a run folder of this study is reused or restarted; see
  `study_owner`. `train(study, strategy, seed, model_dir)` runs it (a user
  model's study passes its own, `research.user_study`).
  """
  model_dir = _run_dir(study, strategy, seed)
  result_path = os.path.join(model_dir, RESULT_FILE)
  settings = study.settings()
  state = study_owner.run_state(study.out_dir, model_dir, study.owner,
                                strategy, seed, RESULT_FILE)
  if state == study_owner.FINISHED:
    print(f"{strategy} seed {seed}: finished earlier, not rerun", flush=True)
    result = study_store.read(result_path, settings, study_store.RESULT_FIELDS,
                              study_store.result_problem)
    # A result stored before heads were named "module_k" reads in today's
    # names, so that it aggregates with new ones.
    result["eval"] = legacy_heads.canonical_heads(result["eval"],
                                                  study.num_modules)
    return result
  if state == study_owner.UNFINISHED:
    # An unfinished run of ours restarts from scratch for a clean clock.
    print(f"{strategy} seed {seed}: restarting the unfinished run",
          flush=True)
  study_owner.prepare(study.out_dir, model_dir, study.owner, strategy, seed,
                      break_lock)
  result = train(study, strategy, seed, model_dir)
  result.update(settings=settings, strategy=strategy, seed=seed)
  study_store.write_json(result_path, result)
  return result


def run_all(study, break_lock=False, train=train_preset):
  """{strategy: [result per seed]}, `study.jobs` runs at a time (`train`:
  as for `run_one`)."""
  tf.io.gfile.makedirs(os.path.join(study.out_dir, "logs"))
  pairs = [(s, seed) for s in study.strategies for seed in study.seeds]
  with concurrent.futures.ThreadPoolExecutor(study.jobs) as pool:
    try:
      results = list(pool.map(
          lambda pair: run_one(study, *pair, break_lock, train), pairs))
    except BaseException as e:
      # Before the pool's exit waits for its threads, which wait for their
      # runs: a signal reaches only this (the main) thread.
      forward_stop(e)
      raise
  by_strategy = {s: [] for s in study.strategies}
  for (strategy, _), result in zip(pairs, results):
    by_strategy[strategy].append(result)
  return by_strategy


def launch_costs(study, repeats, raw):
  """A preset's op costs into the file `raw`: `research.module_costs` in its
  own process."""
  launch("research.module_costs", train_args(
      study, study.strategies[0], out=raw, repeats=repeats),
         os.path.join(study.out_dir, "logs", "module_costs.log"))


def measure_costs(study, repeats=10, measure=launch_costs):
  """The per-module op costs of the study's network (reused if stored);
  `measure(study, repeats, raw)` writes them to the file `raw`."""
  path = os.path.join(study.out_dir, COSTS_FILE)
  settings = _costs_settings(study, repeats)
  stored = study_store.read(path, settings, study_store.COSTS_FIELDS)
  if stored is not None:
    return stored
  raw = path + ".raw"
  measure(study, repeats, raw)
  measured = owned_dir.load_json(raw, received=f"out_dir={study.out_dir!r}")
  tf.io.gfile.remove(raw)
  measured["settings"] = settings
  study_store.write_json(path, measured)
  return measured


def predict_step_times(costs, strategies, cores):
  """{strategy: {cores: predicted step seconds}} from the schedule model."""
  modules = [schedule.ModuleCost(**c) for c in costs["costs"]]
  return {s: {n: schedule.simulate(
      modules, s, num_cores=n, has_aux=costs["has_aux"],
      num_microbatches=costs["num_microbatches"]).step_time for n in cores}
          for s in strategies}


def predict_pipeline(costs, cores):
  """{cores: {"microbatches": M, "step_s": s}}: the best microbatched e2e
  pipeline (`schedule.best_pipeline`), the model-parallel peer."""
  modules = [schedule.ModuleCost(**c) for c in costs["costs"]]
  out = {}
  for n in cores:
    m, step = schedule.best_pipeline(modules, num_cores=n,
                                     has_aux=costs["has_aux"])
    out[n] = {"microbatches": m, "step_s": step}
  return out


def aggregate_runs(runs):
  """Seeds of one strategy: bands of the clocks, curve and final metrics."""
  heads = {head: sorted(m) for head, m in runs[0]["eval"].items()}
  for run in runs[1:]:
    if {head: sorted(m) for head, m in run["eval"].items()} != heads:
      raise ValueError(f"every seed must report the same heads and metrics; "
                       f"seed {runs[0]['seed']}: {heads}. Received: seed "
                       f"{run['seed']} eval={sorted(run['eval'])}")
  curves = [[(p["step"], p["seconds"], p["value"]) for p in run["curve"]]
            for run in runs]
  points = projection.aggregate(curves)
  keys = ("median_step_s", "compile_s", "training_s", "eval_s", "wall_s")
  return {
      "seeds": [run["seed"] for run in runs],
      "steps": runs[0]["steps"],
      **{k: projection.band([run[k] for run in runs])._asdict()
         for k in keys},
      "final": {head: {name: projection.band(
          [run["eval"][head][name] for run in runs])._asdict()
                       for name in metrics}
                for head, metrics in runs[0]["eval"].items()},
      "curve": [{"step": p.step, "seconds": p.seconds, **p.value._asdict()}
                for p in points],
  }


def config_overrides(flag_values):
  """{field: flag text} of the Config fields given on the command line.

  Args:
    flag_values: {field: (given?, text)} for every Config field.

  Raises:
    ValueError: for a field compare sets itself.
  """
  given = {}
  for field in config_lib.flat_fields():
    is_given, text = flag_values[field.name]
    if not is_given:
      continue
    if field.name in SET_BY_COMPARE:
      raise ValueError(
          f"--{field.name} is set by compare; use "
          f"{SET_BY_COMPARE[field.name]}. Received: {field.name}={text!r}")
    given[field.name] = text
  return given
