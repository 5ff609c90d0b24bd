"""The actions of the training controller (train/controller.py).

Each class does one thing after every loop (`after_loop(loop)`) and, for
some, once at the end (`finish(step)`): count the step, print progress,
write TensorBoard scalars, checkpoint, evaluate, stop on a time budget, save
and stop on SIGTERM/SIGINT, renew the run lock, record a profiler trace.
`NanPolicy` is the controller's guard: it sees a loop's metrics before the
step advances.
"""

import math
import signal

import tensorflow as tf

from tf_interlock import metric_names
from train import run_lock
from train import stop_signals


class TrainingError(RuntimeError):
  """A run stopped on purpose (NaN, preemption); the message says why."""


def verify_lock(lock):
  """`lock.verify()`, a lost lock as the run's one-line `TrainingError`."""
  if lock is None:
    return
  try:
    lock.verify()
  except run_lock.LockLost as e:
    raise TrainingError(str(e)) from None


class StepVariable:
  """Keeps the checkpointed `global_step` variable equal to the step."""

  def __init__(self, variable):
    self.variable = variable

  def after_loop(self, loop):
    self.variable.assign(loop.step)


def _losses(metrics):
  """[("L1", loss of module 1), ...] in module order."""
  found = []
  for key, value in metrics.items():
    index, name = metric_names.parse_metric_name(key)
    if name == "loss":
      found.append((index, f"L{index + 1}", value))
  return [(label, value) for _, label, value in sorted(found)]


def progress_line(loop, batch_size):
  """One line per loop: step, speed, each module's loss, time left."""
  losses = " ".join(f"{label}={value:.4f}"
                    for label, value in _losses(loop.metrics))
  of = f"/{loop.total_steps}" if loop.total_steps else ""
  rate = (loop.step - loop.first_step) / max(loop.elapsed_s, 1e-9)
  eta = (f" eta={(loop.total_steps - loop.step) / rate:.0f}s"
         if loop.total_steps and rate else "")
  per_s = loop.num_steps / max(loop.seconds, 1e-9)
  return (f"step {loop.step}{of}: {per_s:.2f} steps/s "
          f"{per_s * batch_size:.0f} ex/s {losses}{eta}")


class Progress:
  """Prints a progress line per loop, or updates a progress bar."""

  def __init__(self, out, batch_size, progbar=None):
    self.out = out
    self.batch_size = batch_size
    self.progbar = progbar

  def after_loop(self, loop):
    if self.progbar is not None:
      self.progbar.update(loop.step, _losses(loop.metrics))
    else:
      print(progress_line(loop, self.batch_size), file=self.out, flush=True)


def write_scalars(writer, step, values):
  with writer.as_default(step=step):
    for key, value in values.items():
      tf.summary.scalar(key, value)
  writer.flush()


class Summaries:
  """Training metrics, learning rates and speed to TensorBoard."""

  def __init__(self, writer, batch_size, learning_rates):
    self.writer = writer
    self.batch_size = batch_size
    self.learning_rates = learning_rates  # () -> {tag: float}

  def after_loop(self, loop):
    seconds = max(loop.seconds, 1e-9)
    write_scalars(self.writer, loop.step, {
        **loop.metrics, **self.learning_rates(),
        "step_time_s": seconds / loop.num_steps,
        "examples_per_s": loop.num_steps * self.batch_size / seconds})


def _due(loop, every):
  """True if a multiple of `every` lies in this loop's steps."""
  return loop.step % every < loop.num_steps


class Checkpointing:
  """Saves every `every` steps and at the end (once per step).

  With a `lock`, each save first checks that this run still owns model_dir
  (`RunLock.verify`): a run whose lock was taken or whose folder moved stops
  instead of writing checkpoints over another run's.
  """

  def __init__(self, manager, every, saved_step=None, lock=None):
    self.manager = manager
    self.every = every
    self.saved_step = saved_step
    self.lock = lock

  def save(self, step):
    if self.saved_step != step:
      verify_lock(self.lock)
      self.manager.save(checkpoint_number=step)
      self.saved_step = step
    return self.manager.latest_checkpoint

  def after_loop(self, loop):
    if _due(loop, self.every):
      self.save(loop.step)

  def finish(self, step):
    self.save(step)


class Evaluation:
  """Evaluates every `every` steps and at the end; keeps the last result."""

  def __init__(self, evaluate_fn, writer, every):
    self.evaluate_fn = evaluate_fn  # () -> {head: {metric: value}}
    self.writer = writer
    self.every = every
    self.results, self.step = None, None

  def run(self, step):
    if self.step != step:
      self.results, self.step = self.evaluate_fn(), step
      write_scalars(self.writer, step, {
          f"{head}/{name}": value for head, metrics in self.results.items()
          for name, value in metrics.items() if name != "num_examples"})
    return self.results

  def after_loop(self, loop):
    if _due(loop, self.every):
      self.run(loop.step)

  def finish(self, step):
    self.run(step)


class TimeBudget:
  """Stops cleanly (final checkpoint, evaluation, export) after `budget_s`,
  saying in one line that the budget ended the run."""

  def __init__(self, budget_s, out=None):
    self.budget_s = budget_s
    self.out = out

  def after_loop(self, loop):
    if loop.elapsed_s >= self.budget_s:
      loop.stop = True
      if self.out is not None and (loop.total_steps is None or
                                   loop.step < loop.total_steps):
        of = f" of {loop.total_steps}" if loop.total_steps else ""
        print(f"--time_budget_s={self.budget_s:g} ended the run at step "
              f"{loop.step}{of} after {loop.elapsed_s:.1f} s; a final "
              "checkpoint, evaluation and export follow; rerun with a "
              "larger budget to go on", file=self.out, flush=True)


class Preemption:
  """SIGTERM (a TPU preemption notice), SIGHUP (a closed terminal) or SIGINT
  (Ctrl-C): save and stop.

  The signal only sets a flag; the loop in flight finishes, then this
  action saves a checkpoint at its step and raises. A second SIGINT
  interrupts at once.
  """

  SIGNALS = stop_signals.STOPPING

  def __init__(self, checkpointing):
    self.checkpointing = checkpointing
    self.received = None
    self._previous = {s: signal.signal(s, self._handle)
                      for s in self.SIGNALS}

  def _handle(self, signum, frame):
    del frame
    if self.received is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.received = signal.Signals(signum).name

  def after_loop(self, loop):
    if self.received is not None:
      path = self.checkpointing.save(loop.step)
      raise TrainingError(f"{self.received} at step {loop.step}: checkpoint "
                          f"saved to {path}; rerun to resume")

  def restore(self):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)


class LockHeartbeat:
  """Checks every loop that model_dir is still the folder this run locked
  (cheap: a local stat), and renews the run lock every `every_s` seconds of
  training after checking it still carries this run's token. Goes first
  among the actions, so a moved folder or a lost lock stops the run before
  anything more is written."""

  def __init__(self, lock, every_s=300.0):
    self.lock = lock
    self.every_s = every_s
    self.last = 0.0

  def after_loop(self, loop):
    try:
      self.lock.check_folder()
      if loop.elapsed_s - self.last >= self.every_s:
        self.lock.refresh()
        self.last = loop.elapsed_s
    except run_lock.LockLost as e:
      raise TrainingError(str(e)) from None


class ProfileSteps:
  """Records a TensorBoard profiler trace of steps `first`..`last` in
  `log_dir` (TensorBoard's Profile tab reads log_dir/plugins/profile).

  The profiler starts before the loop holding step `first` and stops after
  the loop holding step `last`, so the trace covers whole loops. A run that
  resumes past `last` records nothing; one that stops early (time budget)
  stops the profiler at its end.
  """

  def __init__(self, log_dir, first, last):
    self.log_dir = log_dir
    self.first, self.last = first, last
    self.running = False

  def before_loop(self, step, num_steps):
    if not self.running and step < self.last and (
        step + num_steps >= self.first):
      tf.profiler.experimental.start(self.log_dir)
      self.running = True

  def after_loop(self, loop):
    if self.running and loop.step >= self.last:
      self.finish(loop.step)

  def finish(self, step):
    del step
    if self.running:
      self.running = False
      tf.profiler.experimental.stop()


def first_nonfinite(metrics):
  """The first metric (sorted by name) that is NaN or infinite, or None."""
  for key in sorted(metrics):
    if not math.isfinite(metrics[key]):
      return key
  return None


class NanPolicy:
  """The controller's guard against non-finite losses and gradients.

  on_nan=stop: raise (the last good checkpoint stays the latest).
  on_nan=skip: roll back to the last checkpoint and go on with the next
  batches; after `max_skips` loops in a row it stops as well.

  Args:
    policy: "stop" or "skip".
    manager: the run's `tf.train.CheckpointManager`.
    rollback: `rollback(path) -> step`: restores model and optimizers (not
      the data position, so the bad batches are skipped, not replayed) and
      returns the restored step.
    out: where the rollback lines go.
    max_skips: consecutive rolled-back loops allowed.
  """

  def __init__(self, policy, manager, rollback, out, max_skips=3):
    self.policy = policy
    self.manager = manager
    self.rollback = rollback
    self.out = out
    self.max_skips = max_skips
    self.skipped = 0

  def accept(self, step, num_steps, metrics):
    """None for a finite loop, else the step training resumes from."""
    key = first_nonfinite(metrics)
    if key is None:
      self.skipped = 0
      return None
    self.skipped += 1
    _, name = metric_names.parse_metric_name(key)
    module = key[:-len(name) - 1]  # "module_k"
    message = (f"non-finite {name} in {module} at steps {step + 1}.."
               f"{step + num_steps}")
    latest = self.manager.latest_checkpoint
    if (self.policy == "stop" or latest is None or
        self.skipped > self.max_skips):
      raise TrainingError(f"{message}; stopped, last good checkpoint: "
                          f"{latest}")
    restored = self.rollback(latest)
    print(f"{message}; skipped: rolled back to {latest}", file=self.out,
          flush=True)
    return restored
