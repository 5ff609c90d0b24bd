"""The training call's steps as a graph loop: one step traced, looped.

`InterlockTrainer.train_loop` runs `steps_per_loop` steps in one
`tf.function`. Unrolled (the default), the Python loop writes every step into
the graph: the first call traces, optimises and instantiates `steps_per_loop`
copies of the step. Here the step is one `tf.function`, traced once, and a
`tf.while_loop` calls it `steps_per_loop - 1` more times after a first call
outside the loop (whose metrics give the loop's accumulators their
structure): the first call's tracing and graph are one step's, whatever
`steps_per_loop` is.

The weights are the unrolled loop's, bit for bit (tests/test_step_loop.py):
the same step function runs on the same batches in the same order. The
reported means (the per-step metrics summed in the same order, divided by
`num_steps` once) may differ in their last bit: TF's graph optimiser
rewrites the two graphs' arithmetic differently.

What it costs: TF's automatic control dependencies make the loop body's
returned loop variables wait for every stateful op of the iteration (this
orders one iteration's variable reads and writes before the next's), so
iteration t + 1 starts once all of step t is done. Module k of step t + 1
can then no longer start while later modules still work on step t, the
overlap the unrolled graph gives (see `trainer`). `resolve_loop` loops only
where the steps have no such slack; docs/results/tracing/firstcall.md
measures what the loop saves on the first call.
"""

import tensorflow as tf

LOOPS = ("unrolled", "while")

# Where "auto" may loop: one process, one replica (measured and tested
# there). TPU, cluster and replicated runs keep the unrolled steps they
# were written and checked with.
def resolve_loop(loop, strategy, num_modules, one_process=True,
                 replicas=1):
  """"unrolled" or "while" for a trainer's `loop` setting.

  "auto" is "while" where the steps have no slack to overlap: a window
  n >= K (end-to-end, or n-wise over K <= n modules), where module 1's
  forward at step t + 1 waits for module 1's update at step t, which waits
  for the backward of every module; the loop then costs at most the
  overlap of the last modules' updates with module 1's next forward. Local
  and n-wise with n < K keep the unrolled steps, whose overlap across steps
  is their speed.

  Args:
    loop: "auto", "unrolled" or "while".
    strategy: the trainer's `strategy.InterlockStrategy`.
    num_modules: K.
    one_process: the trainer's placement runs every module in this process
      (`Placement.one_process`).
    replicas: replicas in sync (times the trainer's collective replicas).

  Returns:
    "unrolled" or "while".

  Raises:
    ValueError: an unknown `loop`, in one line.
  """
  if loop == "auto":
    no_slack = strategy.effective_window(num_modules) >= num_modules
    return ("while" if no_slack and one_process
            and replicas == 1 else "unrolled")
  if loop not in LOOPS:
    raise ValueError(f"loop must be 'auto' or one of {LOOPS}. "
                     f"Received: loop={loop!r}")
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
