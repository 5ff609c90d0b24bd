"""Keras callbacks for the habits of a `fit` user: a wall-clock budget.

  budget = ti.callbacks.TimeBudget(600)   # ten minutes of training
  history = model.fit(data, epochs=10**6, steps_per_epoch=100,
                      callbacks=[budget])
  history.history["time_budget_stopped"]  # [0.0, ..., 0.0, 1.0]

`TimeBudget` works with any `keras.Model`; with `InterlockModel` it is the
way to give e2e, n-wise and local the same time instead of the same steps.
"""

import math
import time

import keras

# What a budget counts (see `TimeBudget`).
COUNTS = ("wall", "batches")
# The per-epoch log (and so History) entry: 1.0 in the epoch the budget
# ended, 0.0 in the others.
STOPPED_LOG = "time_budget_stopped"


class TimeBudget(keras.callbacks.Callback):
  """Stops `fit` once `seconds` of training are spent.

  The budget is checked in `on_train_batch_end`, which Keras calls once per
  call of the train function, i.e. once per `steps_per_execution` steps
  (`compile(steps_per_execution=N)`; `InterlockModel` unrolls those N steps
  in one `tf.function`). So the run stops at the end of the first call that
  ends at or past the budget: never inside a call, and at most one call
  (N steps) over the budget. With a large N, give the budget room for one
  call more. When it stops, Keras still runs that epoch's validation and
  `on_epoch_end` (so that epoch is in History, with the budget's flag),
  then ends `fit`.

  `count` says which seconds are spent:
  * "wall" (default): the wall clock since `fit` began (`on_train_begin`):
    the first call's tracing, validation and every callback's work count,
    as on the user's own clock.
  * "batches": only the time inside the train function's calls
    (`on_train_batch_begin` to `on_train_batch_end`), and not the first
    call, which traces and compiles the step function: validation,
    evaluations other callbacks run and their other work do not count. This
    is the training clock that `research.user_study` gives every strategy.

  Each `fit` call starts a new budget. After `fit`: `stopped` (whether the
  budget ended it), `elapsed_s` (seconds counted) and `steps` (training
  steps run, all epochs).

  Args:
    seconds: the budget, a finite number > 0.
    count: "wall" or "batches".
  """

  def __init__(self, seconds, count="wall"):
    super().__init__()
    if (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds) or seconds <= 0):
      raise ValueError(f"TimeBudget needs seconds, a finite number > 0. "
                       f"Received: seconds={seconds!r}")
    if count not in COUNTS:
      raise ValueError(f"TimeBudget's count must be one of {COUNTS}. "
                       f"Received: count={count!r}")
    self.seconds = float(seconds)
    self.count = count
    self._reset()

  def _reset(self):
    self.stopped = False
    self.elapsed_s = 0.0
    self.steps = 0
    self._calls = 0
    self._fit_start = time.perf_counter()
    self._call_start = None
    self._call_first_step = 0
    self._stopped_epoch = None

  def on_train_begin(self, logs=None):
    self._reset()

  def on_train_batch_begin(self, batch, logs=None):
    self._call_start = time.perf_counter()
    self._call_first_step = batch

  def on_train_batch_end(self, batch, logs=None):
    now = time.perf_counter()
    # Keras numbers the steps of an epoch from 0; one call ran the steps
    # from the index passed to on_train_batch_begin up to `batch`.
    self.steps += batch - self._call_first_step + 1
    self._calls += 1
    if self.count == "wall":
      self.elapsed_s = now - self._fit_start
    elif self._calls > 1:  # the first call traces: not counted
      self.elapsed_s += now - self._call_start
    if self.elapsed_s >= self.seconds and not self.stopped:
      self.stopped = True
      self.model.stop_training = True

  def on_epoch_end(self, epoch, logs=None):
    if self.stopped and self._stopped_epoch is None:
      self._stopped_epoch = epoch
    if logs is not None:
      # History (added after the user's callbacks) reads this same dict.
      logs[STOPPED_LOG] = float(self._stopped_epoch == epoch)
