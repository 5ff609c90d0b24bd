"""Training a run: check the run directory, lock it, train, export.

`run` is the train binary's entry. It first checks everything it can
without writing (the configuration, the run directory's layout, its
config.json, the checkpoint pointer, the export target), then locks
model_dir and trains with a `Controller` (train/controller.py) whose
actions (train/actions.py) print progress, write TensorBoard scalars,
checkpoint, evaluate and handle NaNs, time budgets and SIGTERM/SIGINT.
Checkpoints are written by `tf.train.CheckpointManager` (TF writes the data
files first and the "checkpoint" pointer last, so a crash mid-write leaves
the previous checkpoint as the latest); rerunning the same command resumes.
"""

import json
import sys
import time

import keras
import tensorflow as tf

from tf_interlock import evaluation
from tf_interlock import losses
from tf_interlock import metric_names
from tf_interlock import placement as placement_lib
from tf_interlock.execution_options import ExecutionOptions
from tf_interlock.trainer import InterlockTrainer
from train import actions as actions_lib
from train import checkpoint_match
from train import config as config_lib
from train import datasets
from train import distribution
from train import error_boundary
from train import export_dir as export_dir_lib
from train import multi_worker
from train import networks
from train import optimization
from train import paths
from train import preflight
from train import run_lock
from train import runtime_setup
from train import stop_watchdog
from train.controller import Controller
from train.run_dir import RunDir

ARCHITECTURE_FIELDS = (
    "model", "resnet_preset", "resnet_width", "aux_head", "split",
    "num_modules", "vocab_kind", "vocab_size", "seq_len", "num_layers",
    "d_model", "num_heads", "mlp_dim", "mlp_width", "dataset", "optimizer")
# The checkpointed input pipeline position counts batches of this size.
RESUME_FIELDS = ("batch_size",)
TrainingError = actions_lib.TrainingError


def check_checkpoint(path, modules):
  """Raises unless checkpoint `path` is readable and holds exactly `modules`.

  Every variable of every module must have a value of the same shape in the
  checkpoint, and the checkpoint must hold no module variable the model
  lacks (a K = 4 checkpoint would otherwise fill a K = 2 model in part).
  A checkpoint is called corrupt only when TF says its bytes are damaged.

  Args:
    path: the checkpoint prefix (".../ckpt-N").
    modules: the built modules about to be restored.

  Raises:
    TrainingError: one line naming `path`; nothing was written.
  """
  try:
    saved = checkpoint_match.variable_shapes(
        checkpoint_match.reader(path))
  except (tf.errors.OpError, ValueError, IndexError) as e:
    raise restore_error(path, e) from None
  model = checkpoint_match.model_shapes({
      f"module_{k + 1}": m for k, m in enumerate(modules)})
  differs = checkpoint_match.difference(saved, model)
  if differs:
    raise TrainingError(
        f"cannot restore checkpoint {path}: it is from another model "
        f"({differs}); nothing was changed: resume with the flags that "
        "trained it or use a new model_dir")


def restore_error(path, e):
  """The one line of a failed restore: corrupt only for damaged bytes
  (TF's checkpoint reader raises IndexError for a truncated file)."""
  first = error_boundary.first_line(getattr(e, "message", e))[:200]
  if isinstance(e, (tf.errors.DataLossError, tf.errors.OutOfRangeError,
                    IndexError)):
    advice = ("it is corrupt. Nothing was changed; move it away to resume "
              "from an older one")
  elif isinstance(e, tf.errors.OpError):
    advice = ("it could not be read; nothing was changed: check the folder "
              "(permissions, disk, mount) and rerun")
  else:
    advice = "it does not match this model; nothing was changed"
  return TrainingError(f"cannot restore checkpoint {path} "
                       f"({type(e).__name__}: {first}); {advice}")


def _restore(checkpoint, path, modules):
  """Restores `path` after `check_checkpoint`, or raises one line.

  Nothing is written before this, so a bad checkpoint is left as it is.
  """
  check_checkpoint(path, modules)
  try:
    checkpoint.restore(path).assert_existing_objects_matched()
  except (tf.errors.OpError, AssertionError, ValueError, IndexError,
          KeyError) as e:
    raise restore_error(path, e) from None


def _apply_hyperparameters(trainer, config):
  """Hyperparameters come from this run's flags, state from checkpoints."""
  for opt in trainer.optimizers:
    if hasattr(opt.learning_rate, "assign"):  # a constant, not a schedule
      opt.learning_rate.assign(config.optim.learning_rate)


def _learning_rates(trainer):
  return {metric_names.metric_name(k, "learning_rate"):
          # Read through a tensor: under MultiWorkerMirroredStrategy the
          # variable holds a MirroredVariable, which float() refuses.
          float(tf.convert_to_tensor(opt.learning_rate))
          for k, opt in enumerate(trainer.optimizers)}


def evaluate(trainer, task, config):
  """Every exit on the eval split: {"module_k": metrics}, k = 1..K."""
  dataset = task.eval
  if config.run.eval_batches:
    dataset = dataset.take(config.run.eval_batches)
  return evaluation.evaluate_modules(
      trainer.modules, dataset, losses.sparse_softmax_cross_entropy,
      losses.sparse_accuracy, task=task.kind)


def build(config):
  """Runtime, strategy, data and a built trainer for `config`."""
  distribute = distribution.make_distribute(config)
  task = datasets.make_task(config)
  steps = optimization.total_steps(config)
  # A task of a replicas x modules job: module k on its own device k.
  replicas, placement, _ = multi_worker.joined(config) or (None, None, None)
  placement = placement or placement_lib.make_placement(
      config.devices.placement, config.interlock.num_modules, distribute,
      module_devices=runtime_setup.module_devices(config))
  # Seeded again, just before the layers are made: Keras draws each
  # initializer's seed from Python's `random` when the layer is made, and
  # the data step may have drawn from it too, but only on a first run (TFDS
  # names the temporary folder it prepares a data set in with
  # random.choice). Without this, the run that prepares the data starts
  # from other weights than every later run with the same --seed.
  runtime_setup.seed(config)
  with distribute.scope():
    modules = networks.make_modules(config, task)
  trainer = InterlockTrainer(
      modules, lambda k: optimization.make_optimizer(config, steps),
      config.interlock.strategy, variant=config.interlock.variant, distribute=distribute,
      placement=placement, steps_per_loop=config.run.steps_per_loop,
      num_microbatches=config.interlock.num_microbatches, replicas=replicas,
      jit_compile=config_lib.jit_compile_value(config),
      options=execution_options(config))
  sample = next(iter(task.train.take(1)))[0]
  trainer.build(sample)
  return trainer, task, steps


def execution_options(config):
  """The trainer's `ExecutionOptions`: --loop_block=U >= 1 loops blocks of
  U steps; 0 keeps the library's loop."""
  block = config.run.loop_block
  if not block:
    return ExecutionOptions()
  return ExecutionOptions(loop="while", loop_block=block)


def check_run(config, run):
  """Everything about model_dir that can fail, checked before any write.

  Args:
    config: the validated `Config`.
    run: its `RunDir`.

  Returns:
    (checkpoint to resume from or None, normalized export path).
  """
  run.check_layout()
  run.check_nesting()
  current = json.loads(config.to_json())
  saved = run.read_config() or {}
  if networks.same_aux_head(saved.get("aux_head"), config):
    current["aux_head"] = saved["aux_head"]  # the same heads, named another way
  run.check_same(current, ARCHITECTURE_FIELDS,
                 "its checkpoints hold that architecture")
  latest = run.latest_checkpoint(config.run.resume_from)
  if latest is not None:
    run.check_same(current, RESUME_FIELDS,
                   "the checkpointed input position counts such batches")
    # The seed drew the initial weights and the shuffle order, both already
    # in the checkpoint: a new one could not take effect.
    run.check_same(current, ("seed",), "its weights and data order were "
                   "drawn with that seed and are restored from checkpoints")
    step = checkpoint_step(latest)
    if config.run.train_steps is not None and config.run.train_steps < step:
      config_lib.fail("train_steps", config.run.train_steps,
                      f"the run in {run.path} is already at step {step} "
                      f"({latest}); give at least {step} or use a new "
                      "model_dir")
  export_dir = run.check_export_dir(config.run.export_dir)
  return latest, export_dir


def checkpoint_step(prefix):
  """N of a checkpoint prefix ".../ckpt-N" (the step it was saved at)."""
  return int(paths.basename(prefix).rsplit("-", 1)[1])


def record_config(run, config, step):
  """Writes config.json: this start's configuration, plus the history.

  config.json always says what the run trains with now. Each start that
  changes a recorded field appends {"step", "time", "changed": {field:
  [before, after]}} to its "history", so the record of what ran at which
  step stays true across resumes.
  """
  saved = run.read_config() or {}
  history = list(saved.pop("history", None) or [])
  current = json.loads(config.to_json())
  changed = {name: [saved[name], value] for name, value in current.items()
             if name in saved and saved[name] != value}
  if changed:
    history.append({"step": step, "time": time.time(), "changed": changed})
  run.write_config(json.dumps(dict(current, history=history), indent=2,
                              sort_keys=True))
  return changed


def describe_changes(changed):
  """"; changed since the last start: a 1 -> 2, ..." or "" (for the
  resumed line: a resume never changes the run's flags silently)."""
  if not changed:
    return ""
  return "; changed since the last start: " + ", ".join(
      f"{name} {before!r} -> {after!r}"
      for name, (before, after) in sorted(changed.items()))


def landing_note(config, start_step):
  """A note when checkpoints cannot land on multiples of
  checkpoint_every_steps (a save happens only at the end of a loop), or
  None. Names the first steps they land on."""
  every, per_loop = config.run.checkpoint_every_steps, config.run.steps_per_loop
  landed, step = [], start_step
  while len(landed) < 3:  # a loop ends on a multiple at least every `every`
    step += per_loop
    if step % every < per_loop:  # a multiple of `every` in this loop
      landed.append(step)
  if all(n % every == 0 for n in landed):
    return None
  why = (f"a --checkpoint_every_steps that is a multiple of {per_loop} "
         "gives exact steps" if every % per_loop else
         f"the loops start at step {start_step}, off that grid")
  return (f"note: checkpoints are saved at the end of a loop, so with "
          f"--steps_per_loop={per_loop} and --checkpoint_every_steps="
          f"{every} they land at steps {', '.join(map(str, landed))}, ... "
          f"(the end of the loop that passes each multiple of {every}); "
          f"{why}")


def train(config, built, run, latest, export_dir, lock, out=None,
          extra_actions=()):
  """Trains (or resumes) a checked, locked run; returns its summary.

  Args:
    config: the validated `Config`.
    built: (trainer, task, total steps) of `build(config)`.
    run: its `RunDir`, checked by `check_run`.
    latest: the checkpoint to resume from, or None.
    export_dir: where the SavedModel goes.
    lock: the held `RunLock` (renewed while training).
    out: where progress lines go (default: sys.stdout when called).
    extra_actions: further controller actions, run before the preemption
      check (e.g. a test's).

  Returns:
    {"step": int, "eval": {head: metrics}, "export_dir": str}.
  """
  out = sys.stdout if out is None else out
  trainer, task, steps = built
  global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                            name="global_step")
  iterator = iter(trainer.distribute_dataset(task.train))
  checkpoint = trainer.checkpoint(global_step=global_step,
                                  **multi_worker.input_position(config, iterator))
  # The same objects without the data position: on_nan=skip restores this.
  model_checkpoint = trainer.checkpoint(global_step=global_step)
  if latest:
    _restore(checkpoint, latest, trainer.modules)
    _apply_hyperparameters(trainer, config)
  # Ours to delete: under the lock, only a save killed midway leaves these.
  removed = run.remove_unfinished_checkpoints()
  if removed:
    print(f"note: removed {', '.join(removed)} in {run.checkpoint_dir}, "
          "left by a checkpoint save that was interrupted", file=sys.stderr,
          flush=True)
  if latest:
    run.repair_pointer(latest)  # a no-op unless --resume_from was needed
  manager = tf.train.CheckpointManager(checkpoint, run.checkpoint_dir,
                                       max_to_keep=config.run.keep_checkpoints)
  changed = record_config(run, config, int(global_step))
  if latest:
    print(f"resumed from {latest} at step {int(global_step)}"
          f"{describe_changes(changed)}", file=out, flush=True)
  note = landing_note(config, int(global_step))
  if note:
    print(note, file=sys.stderr, flush=True)
  run_id = run.run_id(create=True)

  def rollback(path):
    model_checkpoint.restore(path).expect_partial()
    _apply_hyperparameters(trainer, config)
    return int(global_step)

  eval_writer = tf.summary.create_file_writer(run.eval_log_dir)
  checkpointing = actions_lib.Checkpointing(
      manager, config.run.checkpoint_every_steps,
      saved_step=int(global_step) if latest else None, lock=lock)
  evaluation_action = actions_lib.Evaluation(
      lambda: evaluate(trainer, task, config), eval_writer,
      config.run.eval_every_steps)
  # On a terminal a progress bar replaces the per-loop lines.
  progbar = (keras.utils.Progbar(steps, stateful_metrics=[
      f"L{k + 1}" for k in range(config.interlock.num_modules)])
             if steps and hasattr(out, "isatty") and out.isatty() else None)
  preemption = actions_lib.Preemption(checkpointing)
  loop_actions = [
      actions_lib.LockHeartbeat(lock),  # first: nothing written if lost
      stop_watchdog.Watch(),  # a killed watchdog is named and replaced
      # Before the checkpoints and evaluations: the trace holds steps only.
      *([actions_lib.ProfileSteps(run.train_log_dir,
                                  *config.run.profile_steps)]
        if config.run.profile_steps else []),
      actions_lib.StepVariable(global_step),
      actions_lib.Progress(out, config.run.batch_size, progbar),
      actions_lib.Summaries(tf.summary.create_file_writer(run.train_log_dir),
                            config.run.batch_size,
                            lambda: _learning_rates(trainer)),
      checkpointing, evaluation_action,
      *([actions_lib.TimeBudget(config.run.time_budget_s, out)]
        if config.run.time_budget_s else []),
      *extra_actions, preemption]
  try:
    step = Controller(
        lambda n: trainer.train_loop(iterator, n), loop_actions,
        start_step=int(global_step), total_steps=steps,
        steps_per_loop=config.run.steps_per_loop,
        guard=actions_lib.NanPolicy(config.run.on_nan, manager, rollback,
                                    out)).run()
  except (tf.errors.OpError, OSError) as e:
    actions_lib.verify_lock(lock)  # a moved folder fails many a write
    failure = _save_failure(run, manager, e)
    if failure is None:
      raise
    raise failure from None
  finally:
    preemption.restore()
  actions_lib.verify_lock(lock)  # the export replaces model_dir/export
  export_dir_lib.export_owned(
      trainer.modules, tf.TensorSpec((None,) + tuple(task.input_shape),
                                     task.input_dtype),
      export_dir, owner=run_id,
      metadata={"model_dir": run.path, "step": step, "config": json.loads(
          config.to_json())})
  summary = {"step": step, "eval": evaluation_action.results,
             "export_dir": export_dir}
  if config_lib.runtime_of(config).splits_host_cpu:
    summary["threading"] = runtime_setup.simulated_plan(config).describe()
  if task.unigram_perplexity is not None:
    summary["unigram_perplexity"] = task.unigram_perplexity
    warning = no_context_warning(evaluation_action.results,
                                 task.unigram_perplexity)
    if warning:
      print(warning, file=sys.stderr, flush=True)
  print(json.dumps(summary), file=out, flush=True)
  return summary


def _save_failure(run, manager, error):
  """A failed checkpoint save (full disk, read-only or immutable folder) as
  one line naming the checkpoint to resume from, or None for any other
  error. The unfinished ckpt-N_temp folder is removed first."""
  removed = run.remove_unfinished_checkpoints()
  if not removed and run.checkpoint_dir not in str(error):
    return None
  first = error_boundary.first_line(getattr(error, "message", error))
  latest = manager.latest_checkpoint
  return TrainingError(
      f"saving a checkpoint in {run.checkpoint_dir} failed ({first}); "
      f"{'removed ' + ', '.join(removed) + '; ' if removed else ''}"
      f"{latest or 'no checkpoint'} is the latest usable one: free space or "
      "fix the folder's permissions, then rerun to resume")


def no_context_warning(results, unigram_perplexity, margin=0.95):
  """A warning naming the heads of an LM that learnt no context, or None.

  A head whose perplexity is not clearly below the unigram perplexity of the
  same tokens predicts no better than token frequencies: the run finished
  but learnt nothing from context (e.g. a collapsed module). Saying so beats
  a silent number.

  Args:
    results: {"module_k": {"perplexity": value, ...}} of the last
      evaluation.
    unigram_perplexity: the unigram model's perplexity on the eval split.
    margin: a head above `margin` x the unigram perplexity is named.
  """
  flat = sorted((head for head, metrics in (results or {}).items()
                 if metrics.get("perplexity", 0.0)
                 >= margin * unigram_perplexity),
                key=metric_names.head_index)
  if not flat:
    return None
  values = ", ".join(f"{head} {results[head]['perplexity']:.1f}"
                     for head in flat)
  return (f"warning: perplexity not below {margin:.0%} of the unigram "
          f"perplexity {unigram_perplexity:.1f} ({values}): these heads "
          "predict no better than token frequencies. With --variant=only, "
          "try --variant=sum (docs/results/study_fortunes_lm/report.md).")


def _raise_cluster_failure(config, error):
  """placement=cluster: a runtime error from a worker becomes one line
  naming the worker (TrainingError); a damaged record in a prepared image
  data set, one naming its file; anything else is raised as it is."""
  if isinstance(error, tf.errors.DataLossError):
    datasets.name_damaged_file(config, error)
  line = distribution.cluster_failure(config, error)
  if line is None:
    raise error
  raise TrainingError(line) from None


def run(config, out=None, break_lock=False, extra_actions=()):
  """Validates, checks and locks model_dir, then trains; the binary's entry.

  Args:
    config: the `Config` from the flags.
    out: where progress lines go.
    break_lock: take over model_dir's lock even if its holder looks alive.
    extra_actions: see `train`.

  Returns:
    The summary of `train`.
  """
  preflight.validate_for_run(config)
  if not config.run.model_dir:
    raise ValueError("--model_dir is required. Received: model_dir=None")
  # A multi-worker job (TF_CONFIG): only the chief writes --model_dir.
  config, shared_dir = multi_worker.task_config(config)
  run_dir = RunDir(config.run.model_dir)
  multi_worker.check_fresh(config, check_run(config, run_dir)[0],
                           shared_dir and RunDir(shared_dir))
  runtime_setup.setup_runtime(config)
  try:
    built = build(config)  # data and model errors before model_dir is made
  except tf.errors.OpError as e:
    _raise_cluster_failure(config, e)
  try:
    with run_lock.held(run_dir.path, break_lock=break_lock) as lock:
      # Checked again under the lock: another run may have moved on.
      latest, export_dir = check_run(config, run_dir)
      try:
        return train(config, built, run_dir, latest, export_dir, lock, out,
                     extra_actions)
      except tf.errors.OpError as e:
        _raise_cluster_failure(config, e)
  finally:
    multi_worker.remove_own_dir(config)
