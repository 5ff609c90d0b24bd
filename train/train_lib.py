"""The outer training loop: resume, train, log, evaluate, checkpoint, export.

Orbit-style: each iteration runs `steps_per_loop` steps in one
`tf.function` call and reads the metrics back on the host, where they go to
the console, TensorBoard and the NaN check. Checkpoints are written by
`tf.train.CheckpointManager` (TF writes the data files first and the
"checkpoint" index last, so a crash mid-write leaves the previous checkpoint
as the latest); rerunning the same command resumes from the latest one.
"""

import json
import math
import os
import signal
import sys
import time

from absl import logging
import keras
import tensorflow as tf

from tf_interlock import evaluation
from tf_interlock import export as export_lib
from tf_interlock import losses
from tf_interlock import placement as placement_lib
from tf_interlock.trainer import InterlockTrainer
from train import config as config_lib
from train import setup_lib

ARCHITECTURE_FIELDS = (
    "model", "resnet_preset", "resnet_width", "aux_head", "split",
    "num_modules", "vocab_kind", "vocab_size", "seq_len", "num_layers",
    "d_model", "num_heads", "mlp_dim", "mlp_width", "dataset", "optimizer")


class TrainingError(RuntimeError):
  """A run stopped on purpose (NaN, preemption); the message says why."""


def check_model_dir(config):
  """Refuses a model_dir whose checkpoint belongs to another architecture."""
  path = os.path.join(config.model_dir, "config.json")
  if not tf.io.gfile.exists(path):
    return
  with tf.io.gfile.GFile(path) as f:
    saved = json.load(f)
  current = json.loads(config.to_json())
  for field in ARCHITECTURE_FIELDS:
    if saved.get(field) != current.get(field):
      raise ValueError(
          f"--model_dir={config.model_dir} holds a run with {field}="
          f"{saved.get(field)!r}; use a new model_dir or the same "
          f"architecture. Received: {field}={current.get(field)!r}")


def write_config(config):
  tf.io.gfile.makedirs(config.model_dir)
  tmp = os.path.join(config.model_dir, "config.json.tmp")
  with tf.io.gfile.GFile(tmp, "w") as f:
    f.write(config.to_json())
  tf.io.gfile.rename(tmp, os.path.join(config.model_dir, "config.json"),
                     overwrite=True)


class _Preemption:
  """Turns SIGTERM (the TPU preemption notice) into a flag the loop reads."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def restore(self):
    signal.signal(signal.SIGTERM, self._previous)


def _restore(checkpoint, path):
  """Restores `path`, turning a corrupt or foreign checkpoint into one line.

  Nothing is written before this, so a bad checkpoint is left as it is.
  """
  try:
    checkpoint.restore(path).assert_existing_objects_matched()
  except (tf.errors.OpError, AssertionError, ValueError, IndexError,
          KeyError) as e:
    first = str(e).strip().splitlines()[0][:200]
    raise TrainingError(
        f"cannot restore checkpoint {path} ({type(e).__name__}: {first}); "
        "it is corrupt or from another model. Nothing was changed; move it "
        "away to resume from an older one") from None


def _apply_hyperparameters(trainer, config):
  """Hyperparameters come from this run's flags, state from checkpoints."""
  for opt in trainer.optimizers:
    if hasattr(opt.learning_rate, "assign"):  # a constant, not a schedule
      opt.learning_rate.assign(config.learning_rate)


def _first_nonfinite(metrics):
  for key in sorted(metrics):
    if not math.isfinite(metrics[key]):
      return key
  return None


def _progress_line(step, total, metrics, steps_per_s, examples_per_s, eta):
  losses_text = " ".join(
      f"L{key.split('/')[0].split('_')[1]}={value:.4f}"
      for key, value in sorted(metrics.items()) if key.endswith("/loss"))
  of = f"/{total}" if total else ""
  eta_text = f" eta={eta:.0f}s" if eta is not None else ""
  return (f"step {step}{of}: {steps_per_s:.2f} steps/s "
          f"{examples_per_s:.0f} ex/s {losses_text}{eta_text}")


def _write_scalars(writer, step, values):
  with writer.as_default(step=step):
    for key, value in values.items():
      tf.summary.scalar(key, value)
  writer.flush()


def _learning_rates(trainer):
  return {f"module_{k + 1}/learning_rate": float(opt.learning_rate)
          for k, opt in enumerate(trainer.optimizers)}


def evaluate(trainer, task, config):
  """Final head and every exit on the eval split: {head: metrics}."""
  dataset = task.eval
  if config.eval_batches:
    dataset = dataset.take(config.eval_batches)
  return evaluation.evaluate_modules(
      trainer.modules, dataset, losses.sparse_softmax_cross_entropy,
      losses.sparse_accuracy, task=task.kind)


def _eval_scalars(results):
  return {f"{head}/{name}": value for head, metrics in results.items()
          for name, value in metrics.items() if name != "num_examples"}


def build(config):
  """Runtime, strategy, data and a built trainer for `config`."""
  distribute = setup_lib.make_distribute(config)
  task = setup_lib.make_task(config)
  steps = setup_lib.total_steps(config)
  placement = placement_lib.make_placement(config.placement,
                                           config.num_modules, distribute)
  with distribute.scope():
    modules = setup_lib.make_modules(config, task)
  trainer = InterlockTrainer(
      modules, lambda k: setup_lib.make_optimizer(config, steps),
      config.strategy, variant=config.variant, distribute=distribute,
      placement=placement, steps_per_loop=config.steps_per_loop,
      num_microbatches=config.num_microbatches)
  sample = next(iter(task.train.take(1)))[0]
  trainer.build(sample)
  return trainer, task, steps


def train_and_evaluate(config, out=sys.stdout):
  """Runs (or resumes) training; returns the final evaluation.

  Args:
    config: a validated `Config` with `model_dir` set.
    out: where progress lines go.

  Returns:
    {"step": int, "eval": {head: metrics}, "export_dir": str or None}.
  """
  trainer, task, steps = build(config)
  global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                            name="global_step")
  iterator = iter(trainer.distribute_dataset(task.train))
  checkpoint = trainer.checkpoint(global_step=global_step, iterator=iterator)
  # The same objects without the data position: on_nan=skip restores this.
  model_checkpoint = trainer.checkpoint(global_step=global_step)
  manager = tf.train.CheckpointManager(
      checkpoint, os.path.join(config.model_dir, "checkpoints"),
      max_to_keep=config.keep_checkpoints)
  if manager.latest_checkpoint:
    _restore(checkpoint, manager.latest_checkpoint)
    _apply_hyperparameters(trainer, config)
    logging.info("Resumed from %s at step %d", manager.latest_checkpoint,
                 int(global_step))
    print(f"resumed from {manager.latest_checkpoint} at step "
          f"{int(global_step)}", file=out, flush=True)
  write_config(config)
  train_writer = tf.summary.create_file_writer(
      os.path.join(config.model_dir, "train"))
  eval_writer = tf.summary.create_file_writer(
      os.path.join(config.model_dir, "eval"))
  preemption = _Preemption()
  # On a terminal a progress bar replaces the per-loop lines.
  progbar = (keras.utils.Progbar(steps, stateful_metrics=[
      f"L{k + 1}" for k in range(config.num_modules)])
             if steps and hasattr(out, "isatty") and out.isatty() else None)
  start, step = time.monotonic(), int(global_step)
  first_step, results = step, None
  saved_step, eval_step = step if manager.latest_checkpoint else -1, -1
  skipped = 0  # consecutive loops rolled back for non-finite values
  try:
    while steps is None or step < steps:
      if config.time_budget_s and time.monotonic() - start >= (
          config.time_budget_s):
        break
      n = config.steps_per_loop if steps is None else min(
          config.steps_per_loop, steps - step)
      loop_start = time.monotonic()
      metrics = trainer.train_loop(iterator, n)
      elapsed = time.monotonic() - loop_start
      bad = _first_nonfinite(metrics)
      if bad is not None:
        skipped += 1
        _handle_nonfinite(config, manager, model_checkpoint, bad, step, n,
                          skipped, out)
        _apply_hyperparameters(trainer, config)
        step = int(global_step)
        continue
      skipped = 0
      step += n
      global_step.assign(step)
      rate = (step - first_step) / max(time.monotonic() - start, 1e-9)
      eta = (steps - step) / rate if steps and rate else None
      if progbar is not None:
        progbar.update(step, [(key.replace("module_", "L").split("/")[0],
                               value) for key, value in sorted(
                                   metrics.items()) if key.endswith("/loss")])
      else:
        print(_progress_line(step, steps, metrics, n / elapsed,
                             n * config.batch_size / elapsed, eta),
              file=out, flush=True)
      _write_scalars(train_writer, step, {
          **metrics, **_learning_rates(trainer),
          "step_time_s": elapsed / n,
          "examples_per_s": n * config.batch_size / elapsed})
      if step % config.checkpoint_every_steps < n:
        manager.save(checkpoint_number=step)
        saved_step = step
      if step % config.eval_every_steps < n:
        results, eval_step = evaluate(trainer, task, config), step
        _write_scalars(eval_writer, step, _eval_scalars(results))
      if preemption.requested:
        manager.save(checkpoint_number=step)
        raise TrainingError(f"SIGTERM at step {step}: checkpoint saved to "
                            f"{manager.latest_checkpoint}; rerun to resume")
  finally:
    preemption.restore()
  if saved_step != step:
    manager.save(checkpoint_number=step)
  if eval_step != step:
    results = evaluate(trainer, task, config)
    _write_scalars(eval_writer, step, _eval_scalars(results))
  export_dir = config.export_dir or os.path.join(config.model_dir, "export")
  export_lib.export_saved_model(
      trainer.modules, tf.TensorSpec((None,) + tuple(task.input_shape),
                                     task.input_dtype),
      export_dir, overwrite=True)
  summary = {"step": step, "eval": results, "export_dir": export_dir}
  if task.unigram_perplexity is not None:
    summary["unigram_perplexity"] = task.unigram_perplexity
  print(json.dumps(summary), file=out, flush=True)
  return summary


MAX_SKIPS = 3


def _handle_nonfinite(config, manager, model_checkpoint, key, step, n,
                      skipped, out):
  """on_nan=stop: raise (the last good checkpoint stays the latest).

  on_nan=skip: roll back to the last checkpoint and go on with the next
  batches; after MAX_SKIPS loops in a row it stops as well.
  """
  module = key.split("/")[0]
  message = (f"non-finite {key.split('/')[1]} in {module} at steps "
             f"{step + 1}..{step + n}")
  if (config.on_nan == "stop" or manager.latest_checkpoint is None or
      skipped > MAX_SKIPS):
    raise TrainingError(f"{message}; stopped, last good checkpoint: "
                        f"{manager.latest_checkpoint}")
  # Restore model and optimizers, not the iterator: the bad batches are
  # skipped, not replayed.
  model_checkpoint.restore(manager.latest_checkpoint).expect_partial()
  print(f"{message}; skipped: rolled back to {manager.latest_checkpoint}",
        file=out, flush=True)


def run(config, out=sys.stdout):
  """Validates, sets up the runtime, then trains; the binary's entry."""
  config_lib.validate(config)
  if not config.model_dir:
    raise ValueError("--model_dir is required. Received: model_dir=None")
  check_model_dir(config)
  setup_lib.setup_runtime(config)
  return train_and_evaluate(config, out)
