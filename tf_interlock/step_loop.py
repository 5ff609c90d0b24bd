"""The training call's steps as a graph loop: one step traced, looped.

`InterlockTrainer.train_loop` runs `steps_per_loop` steps in one
`tf.function`. Unrolled (the default), the Python loop writes every step into
the graph: the first call traces, optimises and instantiates `steps_per_loop`
copies of the step. Here the step is one `tf.function`, traced once, and a
`tf.while_loop` calls it `steps_per_loop - 1` more times after a first call
outside the loop (whose metrics give the loop's accumulators their
structure): the first call's tracing and graph are one step's, whatever
`steps_per_loop` is.

The numbers are the unrolled loop's: the same step function runs on the
same batches in the same order, and the per-step metrics are summed in the
same order and divided by `num_steps` once.

What it costs: TF lowers the while loop into a frame whose iteration t + 1
starts once iteration t's loop variables and its stateful ops are done
(variable reads and writes of one iteration are ordered with the next's
through the loop). Module k of step t + 1 can then no longer start while
later modules still work on step t, the overlap the unrolled graph gives
(see `trainer`). docs/results/tracing/looped.md measures what this costs in
steady state against what it saves on the first call.
"""

import tensorflow as tf

LOOPS = ("unrolled", "while")


def check_loop(loop):
  """Refuses an unknown loop kind in one line."""
  if loop not in LOOPS:
    raise ValueError(f"loop must be one of {LOOPS}. Received: loop={loop!r}")
  return loop


def make_while_loop(step, num_steps, before_trace):
  """A `tf.function(iterator) -> mean metrics` over `num_steps` steps.

  Args:
    step: `step(features, labels) -> {name: scalar tensor}`, one training
      step on every replica (the trainer's `_step_metrics`, or its XLA
      program); wrapped here in a `tf.function` unless it is one.
    num_steps: steps per call (>= 1).
    before_trace: called with the number of times the traced graph calls
      the step (1) while the loop is traced (the trainer's per-module
      functions choose op by op or traced from it).

  Returns:
    The loop `tf.function`.
  """
  if not isinstance(step, tf.types.experimental.GenericFunction):
    # autograph=False: the step is plain dataflow, as in the unrolled loop.
    step = tf.function(step, autograph=False)

  def loop(iterator):
    before_trace(1)
    features, labels = next(iterator)
    first = step(features, labels)
    if num_steps == 1:
      return first
    keys = sorted(first)

    def body(i, *totals):
      features, labels = next(iterator)
      metrics = step(features, labels)
      return (i + 1,) + tuple(t + metrics[key]
                              for t, key in zip(totals, keys))

    _, *totals = tf.while_loop(
        lambda i, *_: i < num_steps, body,
        (tf.constant(1),) + tuple(first[key] for key in keys))
    return {key: t / num_steps for key, t in zip(keys, totals)}

  return tf.function(loop, autograph=False)
