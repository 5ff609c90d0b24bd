"""The outer loop as a controller plus small actions (orbit's design).

`Controller.run` calls `train_fn(n)` for `n = steps_per_loop` steps at a time
(one `tf.function` call of `InterlockTrainer.train_loop`), then hands each
loop's result to every action in order. An action is any object with
`after_loop(loop)` and optionally `finish(step)`; a new feature of the loop
is a new action, see train/actions.py. An action may also have
`before_loop(step, num_steps)`, called before each loop starts.

An action can end training early by raising (a `TrainingError` with the
reason) or ask for a clean stop, with the final actions still run, by
setting `loop.stop = True`. A guard (the NaN policy) sees every loop first
and can reject it: a rejected loop does not advance the step and the other
actions do not see it.
"""

import dataclasses
import time
from typing import Dict, Optional


@dataclasses.dataclass
class Loop:
  """What actions learn about one finished loop."""
  step: int  # the global step after the loop
  num_steps: int  # steps in this loop
  metrics: Dict[str, float]
  seconds: float  # wall time of the loop
  total_steps: Optional[int]
  first_step: int  # the step this process started (or resumed) at
  elapsed_s: float  # wall time since this process's training began
  stop: bool = False


class Controller:
  """Runs loops until `total_steps`, a stop request or an error.

  Args:
    train_fn: `train_fn(num_steps) -> {metric: float}`.
    actions: objects with `after_loop(loop)` (and optionally
      `before_loop(step, num_steps)` and `finish(step)`), called in this
      order.
    start_step: the step to start from (the restored one).
    total_steps: the last step, or None to run until an action stops it.
    steps_per_loop: steps per `train_fn` call.
    guard: optional object with `accept(step, num_steps, metrics) -> int or
      None`: None accepts the loop, an int rejects it and names the step
      training goes on from (e.g. a restored checkpoint's).
    clock: a monotonic clock (tests pass a fake one).
  """

  def __init__(self, train_fn, actions, *, start_step, total_steps,
               steps_per_loop, guard=None, clock=time.monotonic):
    self.train_fn = train_fn
    self.actions = list(actions)
    self.step = start_step
    self.total_steps = total_steps
    self.steps_per_loop = steps_per_loop
    self.guard = guard
    self.clock = clock

  def run(self):
    """Trains; then calls every action's `finish`. Returns the last step."""
    first_step, start = self.step, self.clock()
    while self.total_steps is None or self.step < self.total_steps:
      n = self.steps_per_loop if self.total_steps is None else min(
          self.steps_per_loop, self.total_steps - self.step)
      for action in self.actions:
        if hasattr(action, "before_loop"):
          action.before_loop(self.step, n)
      loop_start = self.clock()
      metrics = self.train_fn(n)
      seconds = self.clock() - loop_start
      if self.guard is not None:
        restart = self.guard.accept(self.step, n, metrics)
        if restart is not None:
          self.step = restart
          continue
      self.step += n
      loop = Loop(self.step, n, metrics, seconds, self.total_steps,
                  first_step, self.clock() - start)
      for action in self.actions:
        action.after_loop(loop)
      if loop.stop:
        break
    for action in self.actions:
      if hasattr(action, "finish"):
        action.finish(self.step)
    return self.step
