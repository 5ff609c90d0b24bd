"""The training call's steps as a graph loop: U steps traced, looped.

`InterlockTrainer.train_loop` runs `steps_per_loop` steps in one
`tf.function`. Unrolled, the Python loop writes every step into the graph:
the first call traces, optimises and instantiates `steps_per_loop` copies
of the step. Here a block of U steps (`ExecutionOptions.loop_block`,
default 1) is one `tf.function`, traced once, and a `tf.while_loop` calls it
`steps_per_loop // U` times: the first call's tracing and graph are U
steps' (plus one block of the remainder), whatever `steps_per_loop` is.

The weights are the unrolled loop's, bit for bit (tests/test_step_loop.py):
the same steps run on the same batches in the same order. The reported
means (the per-step metrics summed, divided by `num_steps` once) may
differ in their last bit: the sums are taken in another order, and TF's
graph optimiser rewrites the two graphs' arithmetic differently.

What it costs: TF's automatic control dependencies make the loop body's
returned loop variables wait for every stateful op of the iteration (this
orders one iteration's variable reads and writes before the next's), so
iteration i + 1 starts once all of iteration i's steps are done. Module k
of the block's first step can then no longer start while later modules
still work on the step before, the overlap the unrolled graph gives (see
`trainer`); inside a block of U > 1 steps the overlap stays. Unless
asked, `resolve_call` loops where the steps have no such slack, runs
`pipelined_loop`'s pipeline (local learning), which keeps it, and loops
n-wise steps in blocks only where writing them all out would cost the
first call more than their overlap buys (`auto_block`);
docs/results/tracing/firstcall.md measures what the loop saves on the
first call, and docs/results/tracing/blocks.md what a block of U steps
keeps of the overlap.
"""

import tensorflow as tf

LOOPS = ("unrolled", "while", "pipelined")

# Where "auto" may loop: one process, one replica (measured and tested
# there). TPU, cluster and replicated runs keep the unrolled steps they
# were written and checked with.
def resolve_loop(loop, plan, one_process=True, replicas=1, ties=(),
                 on_accelerator=False, memory_lean=False,
                 compiles_step=False, block_weights=0, num_steps=1,
                 max_block_weights=None):
  """"unrolled", "while" or "pipelined" for a trainer's `loop` setting.

  "auto" is "while" where the steps have no slack to overlap: the final
  loss alone trains every module (`RoutingPlan.end_to_end`: a window
  n >= K), where module 1's forward at step t + 1 waits for module 1's
  update at step t, which waits for the backward of every module; the
  loop then costs at most the overlap of the last modules' updates with
  module 1's next forward. The same on CPUs where a tied weight couples
  module 1 to the last module (`first_waits_for_last`, a keras_hub
  CausalLM's embedding and head): module 1's update then waits for the
  last module's forward and the tie's gradient there, and only the rest
  of the backward can overlap the next step; on CPU devices that share
  cores it bought nothing measurable (GPT-2, local and 2-wise, K = 2 and
  4: docs/results/real_models), while the unrolled steps cost a 3x longer
  first call. On CPUs, local learning (window 1, no gradient crossing a
  module) runs "pipelined" (`pipelined_loop`: module k on step t - k, one
  traced iteration, the overlap across steps kept;
  docs/results/tracing/pipelined.md); n-wise with 1 < n < K keeps the
  unrolled steps, whose overlap across steps is their speed, where the
  call's steps are small: on CPUs, in one process and one replica, a
  call whose written-out steps would hold more than `max_block_weights`
  weight-steps (`auto_block`) runs "while" in blocks of U steps instead,
  the overlap kept inside each block (`resolve_call` gives U). On
  accelerators local and n-wise keep the unrolled steps (the pipeline and
  the blocks were measured on CPUs only).

  Args:
    loop: "auto", "unrolled", "while" or "pipelined".
    plan: the trainer's `routing.RoutingPlan` (which loss trains which
      module; the strategy is read only through it).
    one_process: the trainer's placement runs every module in this process
      (`Placement.one_process`).
    replicas: replicas in sync (times the trainer's collective replicas).
    ties: per tied weight that trains, the 0-based modules holding a copy
      (`tied_gradients.TiedGradients.modules`).
    on_accelerator: the modules run on GPUs or TPUs
      (`Placement.on_accelerator`).
    memory_lean: the trainer runs local learning's memory-lean order.
    compiles_step: the trainer compiles each whole replica step with XLA.
    block_weights: what one step writes out, in weights: the trainable
      weights of every module (aux heads included) times the microbatches
      a step runs (`auto_block`).
    num_steps: the steps of the call.
    max_block_weights: "auto"'s bound on a traced block of n-wise steps
      (`ExecutionOptions.max_block_weights`); None: no bound.

  Returns:
    "unrolled", "while" or "pipelined".

  Raises:
    ValueError: an unknown `loop`, or "pipelined" where it cannot run, in
      one line.
  """
  return resolve_call(loop, 1, plan, one_process, replicas, ties,
                      on_accelerator, memory_lean, compiles_step,
                      block_weights, num_steps, max_block_weights)[0]


def resolve_call(loop, loop_block, plan, one_process=True, replicas=1,
                 ties=(), on_accelerator=False, memory_lean=False,
                 compiles_step=False, block_weights=0, num_steps=1,
                 max_block_weights=None):
  """(`resolve_loop`'s loop, U): how a call runs its steps, and the steps
  of one traced block (`make_while_loop`; the iterations of a trip for
  "pipelined"; 1 for "unrolled", whose call is one block).

  U is `loop_block` (`ExecutionOptions.loop_block`) but where "auto" chose
  blocks for n-wise steps: `auto_block`'s. The end-to-end and tie loops of
  "auto" run `loop_block` steps a block (default 1: no overlap across
  steps to keep). Arguments as `resolve_loop`'s.
  """
  refusal = pipeline_refusal(plan, one_process, replicas, ties, memory_lean,
                             compiles_step)
  if loop == "auto":
    one = one_process and replicas == 1
    if one and (plan.end_to_end or (
        not on_accelerator and first_waits_for_last(plan, ties))):
      return "while", loop_block
    if refusal is None and not on_accelerator:
      return "pipelined", loop_block
    block = auto_block(num_steps, block_weights, max_block_weights)
    if one and not on_accelerator and not compiles_step and (
        block < num_steps):
      return "while", block
    return "unrolled", 1
  if loop not in LOOPS:
    raise ValueError(f"loop must be 'auto' or one of {LOOPS}. "
                     f"Received: loop={loop!r}")
  if loop == "pipelined" and refusal is not None:
    raise ValueError(f"loop='pipelined' runs local learning only, in one "
                     f"process and one replica: {refusal}. "
                     f"Received: loop='pipelined'")
  return loop, 1 if loop == "unrolled" else loop_block


def auto_block(num_steps, block_weights, max_block_weights):
  """The steps "auto" writes out in one traced block of n-wise steps (and
  of local steps that cannot run `pipelined_loop`'s pipeline).

  A call's first run traces, optimises and instantiates every step it
  writes out: a cost that grows with the ops of a step, which grow with
  its weights (each weight's forward op, its gradient and its update).
  The written-out steps buy overlap across steps (module k on step t + 1
  while later modules finish step t), most on a model of a few large ops
  (research.benchmark's MLP: 15% a step at K = 4) and nothing measurable
  on BERT and MobileNetV2 at K = 4 on 2 cores, whose first call they made
  2.3-2.6x plain Keras's (docs/results/tracing/blocks.md). So a block
  holds the most steps U that divide the call (one block traced, no
  remainder block) with U x `block_weights` <= `max_block_weights`.

  Args:
    num_steps: the steps of the call (>= 1).
    block_weights: a step's weights written out (`resolve_loop`).
    max_block_weights: the bound; None: none.

  Returns:
    U in 1..num_steps, a divisor of num_steps; num_steps where every step
    fits (the call stays unrolled).
  """
  if max_block_weights is None:
    return num_steps
  fits = [u for u in range(1, num_steps + 1)
          if num_steps % u == 0 and u * block_weights <= max_block_weights]
  return max(fits, default=1)


def pipeline_refusal(plan, one_process=True, replicas=1, ties=(),
                     memory_lean=False, compiles_step=False):
  """Why a trainer's steps cannot run as `pipelined_loop`'s pipeline, or
  None where they can: module k's step t must need nothing of a later
  module's step t (local learning, no tie between modules) and the
  stages must be this process's one replica's."""
  if any(plan.vjp_keys):
    return (f"a gradient crosses a module (a window of {plan.window} "
            f"over {plan.num_modules} modules)")
  if any(len(set(modules)) > 1 for modules in ties):
    return "a tied weight couples two modules' updates"
  if not one_process or replicas != 1:
    return f"the steps run on {replicas} replicas or several processes"
  if memory_lean:
    return "memory_lean=True runs one module at a time"
  if compiles_step:
    return "jit_compile compiles each whole step as one XLA program"
  return None


def first_waits_for_last(plan, ties=()):
  """Whether module 1's update at step t waits for module K's step t.

  Module k's gradient at step t needs the forward of every module up to
  the highest loss L_j that trains theta_k. A tied weight adds its other
  copies' gradients (`tied_gradients`: every copy applies the sum), so
  module k also waits for the losses that train each copy. End-to-end
  (window n >= K) the final loss trains module 1; under local learning a
  keras_hub CausalLM's tie of the token embedding (module 1) to the output
  head (module K) makes module 1 wait for the final loss's gradient of
  the head.

  Args:
    plan: a `routing.RoutingPlan`.
    ties: per tie, the 0-based modules holding a copy.

  Returns:
    True when a loss that module 1's update reads is the final loss.
  """
  last = plan.num_modules - 1
  coupled = {0}
  for modules in ties:
    if 0 in modules:
      coupled.update(modules)
  return any(last in plan.losses_training(k) for k in coupled)


def make_while_loop(run_steps, num_steps, before_trace, block=1):
  """A `tf.function(iterator) -> mean metrics` over `num_steps` steps.

  Each iteration of the `tf.while_loop` runs one block of `block` = U
  steps, written out one after another into one `tf.function` (traced once,
  called by every iteration): inside a block, module k of step t + 1 may
  run while later modules still work on step t, as in the unrolled graph;
  at the block's end every module waits (the loop's barrier, above). U = 1
  is one step traced, looped. When U does not divide `num_steps`, the last
  r = num_steps mod U steps are one more block of r steps, traced once.

  Args:
    run_steps: `run_steps(iterator, n) -> {name: scalar tensor}`, the sums
      of `n` training steps' metrics, each step taking its batch from
      `iterator` (the trainer's steps, written out one after another).
    num_steps: steps per call (>= 1).
    before_trace: called with the number of steps a traced block holds
      before it is traced (the trainer's per-module functions choose op by
      op or traced from it).
    block: U >= 1, the steps of one iteration.

  Returns:
    The loop `tf.function`.
  """
  full, rest = divmod(num_steps, block)

  def make_block(n):
    def run(iterator):
      before_trace(n)
      return run_steps(iterator, n)
    # autograph=False: the steps are plain dataflow, as in the unrolled loop.
    return tf.function(run, autograph=False)

  blocks = make_block(block) if full else None
  last = make_block(rest) if rest else None

  def loop(iterator):
    totals = last(iterator) if last is not None else None
    if full == 1 and totals is None:  # One block: no loop.
      totals = blocks(iterator)
    elif full == 1:
      totals = {key: value + totals[key]
                for key, value in blocks(iterator).items()}
    elif blocks is not None:
      # The sums start at zero, in the structure the block returns.
      outputs = blocks.get_concrete_function(iterator).structured_outputs
      keys = sorted(outputs)
      start = tuple(tf.zeros(outputs[key].shape, outputs[key].dtype)
                    if totals is None else totals[key] for key in keys)

      def body(i, *sums):
        metrics = blocks(iterator)
        return (i + 1,) + tuple(s + metrics[key]
                                for s, key in zip(sums, keys))

      _, *sums = tf.while_loop(lambda i, *_: i < full, body,
                               (tf.constant(0),) + start)
      totals = dict(zip(keys, sums))
    return {key: value / num_steps for key, value in totals.items()}

  return tf.function(loop, autograph=False)
