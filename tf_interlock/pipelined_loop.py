"""Local learning's steps as a software pipeline in a graph loop.

Under local learning (window 1: every module trained by its own loss
alone, no gradient crossing a module) module k's step t needs two things:
h_{k-1} of step t, which module k - 1 computed, and module k's own weights
after its step t - 1 (Gomez et al., 2022, arXiv:2010.04116, Sec. 3: the
modules are decoupled in their backward passes). Nothing of module k + 1.
So module k may work on step t - k while module 0 works on step t: one
iteration of a loop then holds every module once, each on another step,

  iteration i:  module 0 on step i, module 1 on step i - 1, ...,
                module K-1 on step i - K + 1,

with h_k of step i - k (and its batch's labels) carried to the next
iteration as loop variables, where module k + 1 takes it. The modules of one
iteration share no tensor, so they run side by side, as the unrolled steps'
dataflow lets them; the loop's barrier at each iteration's end (TF's
automatic control dependencies: `step_loop`) only waits for the slowest
module, which bounds the unrolled steps too once the pipeline is full.
The first call traces each module about K times (the fill, one loop body
and the drain below) instead of once per step of the call.

A call of S steps runs S + K - 1 iterations: the first K - 1 fill the
pipeline (module k starts at iteration k), the last K - 1 drain it (module
k ends at iteration S - 1 + k). Those are written out, each with only its
working modules; the S - K + 1 iterations where every module works are one
`tf.while_loop` body, traced once. Every step's weights, batches and
updates are the unrolled steps' (tests/test_pipelined_loop.py), and each
call ends with every module done, as an unrolled call does: checkpoints
and metrics see whole steps.

Where a gradient crosses a module (n-wise, n >= 2), module k's update at
step t waits for module k + 1's step t, and module k's step t + 1 for that
update: the stages are not independent, and this loop is refused
(`step_loop.pipeline_refusal`).
"""

import tensorflow as tf


def iterations(num_modules, num_steps):
  """Per iteration, the modules at work: module k on step i - k.

  Args:
    num_modules: K >= 1.
    num_steps: S >= 1, the call's steps.

  Returns:
    A list of S + K - 1 tuples of 0-based modules.
  """
  return [tuple(k for k in range(num_modules) if 0 <= i - k < num_steps)
          for i in range(num_steps + num_modules - 1)]


def traced_copies(num_modules, num_steps, block=1):
  """How many times the pipelined loop writes one module's step into its
  graph: its K - 1 fill and drain iterations, the U iterations of the loop
  body and the r full iterations left over (`make_pipelined_loop`), or S
  where no iteration of the S steps has every module at work."""
  full = num_steps - num_modules + 1
  if full <= 0:
    return num_steps
  trips, rest = divmod(full, block)
  return num_modules - 1 + rest + min(trips * block, block)


def make_pipelined_loop(run_stages, num_modules, num_steps, before_trace,
                        block=1):
  """A `tf.function(iterator) -> mean metrics` over `num_steps` steps.

  Args:
    run_stages: `run_stages(inputs, active) -> (outputs, metrics)`: runs
      one step of each module k in `active` (0-based, ascending) on
      `inputs[k]`, a batch `(features, labels)` for module 0 and for
      module k > 0 what `outputs[k - 1]` held (module k - 1's h and the
      batch's labels); returns `outputs[k]` for every active k < K - 1 and
      the metrics of those steps (module-keyed scalars, disjoint between
      modules).
    num_modules: K >= 1.
    num_steps: S >= 1.
    before_trace: called before tracing with how often the graph holds a
      module's step (`traced_copies`).
    block: U >= 1, the iterations one trip through the loop runs, written
      out one after another: the barrier comes every U iterations, and the
      graph holds U more copies of each module's step (of the full
      iterations, the r = (S - K + 1) mod U left over are written out).

  Returns:
    The loop `tf.function`.
  """
  schedule = iterations(num_modules, num_steps)
  fill = schedule[:num_modules - 1]
  full = max(0, num_steps - num_modules + 1)
  drain = schedule[num_modules - 1 + full:]

  def work(iterator, carry, active):
    """One iteration: the modules in `active`, each on its own step."""
    inputs = dict(carry)
    if 0 in active:
      inputs[0] = next(iterator)
    outputs, metrics = run_stages(inputs, active)
    return {k + 1: outputs[k] for k in active if k + 1 < num_modules}, metrics

  def add(totals, metrics):
    for key, value in metrics.items():
      totals[key] = value if key not in totals else totals[key] + value

  every = tuple(range(num_modules))
  trips, rest = divmod(full, block)

  def run_block(iterator, carry):
    totals = {}
    for _ in range(block):
      carry, metrics = work(iterator, carry, every)
      add(totals, metrics)
    return carry, totals

  # The body's graph, traced once: the loop below calls it, and its
  # outputs' structure gives the sums their start.
  body_fn = tf.function(run_block, autograph=False)

  def loop(iterator):
    before_trace(traced_copies(num_modules, num_steps, block))
    carry, totals = {}, {}
    for active in fill + [every] * rest:
      carry, metrics = work(iterator, carry, active)
      add(totals, metrics)
    if trips == 1:
      carry, metrics = body_fn(iterator, carry)
      add(totals, metrics)
    elif trips > 1:
      outputs = body_fn.get_concrete_function(iterator,
                                              carry).structured_outputs[1]
      start = {key: totals[key] if key in totals else
               tf.zeros(value.shape, value.dtype)
               for key, value in outputs.items()}

      def body(n, carry, sums):
        carry, metrics = body_fn(iterator, carry)
        return n + 1, carry, {key: sums[key] + metrics[key] for key in sums}

      _, carry, totals = tf.while_loop(
          lambda n, *_: n < trips, body, (tf.constant(0), carry, start))
      totals = dict(totals)
    for active in drain:
      carry, metrics = work(iterator, carry, active)
      add(totals, metrics)
    return {key: value / num_steps for key, value in totals.items()}

  # autograph=False: the fill and drain are plain dataflow, as unrolled.
  return tf.function(loop, autograph=False)
