"""How a trainer runs its steps, fixed when it is made: `ExecutionOptions`.

None of these changes what is computed (the weights after a step are the
same, bit for bit, under every choice; tests/test_step_loop.py and
tests/test_tf_private.py check it): they trade the first call's tracing
time against the steady step time, and were chosen by measurement on a
2-core CPU host shared with other sessions.

  import tf_interlock as ti
  options = ti.ExecutionOptions(loop="unrolled", graph_optimization="default")
  trainer = ti.InterlockTrainer(modules, "adam", "2wise", options=options)
  model.compile("adam", execution_options=options)   # InterlockModel
"""

import dataclasses

from tf_interlock import int_args

LOOPS = ("auto", "unrolled", "while", "pipelined")
GRAPH_OPTIMIZATIONS = ("auto", "default", "light")


@dataclasses.dataclass(frozen=True)
class ExecutionOptions:
  """How `InterlockTrainer.train_loop` runs its steps.

  Attributes:
    loop: how one call runs its `steps_per_loop` steps. "unrolled": every
      step written into the graph (module k can start step t + 1 while
      later modules finish step t). "while": one step traced and called by
      a `tf.while_loop` (`step_loop`; the first call traces one step).
      "pipelined", local learning only: module k on step t - k, one
      iteration of every module traced and looped (`pipelined_loop`: the
      first call traces each module about K times, and modules still work
      on different steps at once). "auto" (default): "while" in one
      process and one replica where the window covers every module (no
      overlap across steps to lose), and on CPUs also where a tied weight
      such as a CausalLM's embedding couples module 1 to module K; on
      CPUs "pipelined" for local learning where it can run
      (`step_loop.resolve_loop`); else "unrolled". Measured:
      docs/results/tracing/firstcall.md (first call, e2e ResNet-20, K = 2,
      8 steps: 12.0 -> 4.1 CPU-s, light both),
      docs/results/real_models/README.md (GPT-2, local) and
      docs/results/tracing/pipelined.md (local).
    loop_block: U >= 1, the steps one iteration of a "while" loop runs,
      written out one after another (`step_loop`): the first call traces U
      steps, and modules overlap across the steps of a block, not across
      blocks; for "pipelined", the iterations one trip through its loop
      runs. Default 1. Local and n-wise with n < K trade first-call time
      against steady step time with it: docs/results/tracing/blocks.md
      and pipelined.md. Under "auto" it applies to the end-to-end and tie
      loops; n-wise blocks are `max_block_weights`'s.
    max_block_weights: "auto"'s bound on what n-wise (1 < n < K) steps,
      and local steps where the pipeline cannot run (`memory_lean`, a tie
      between two modules), write out in one traced block, on CPUs in one
      process and one replica: U steps a block, U the largest divisor of the call's steps
      with U x M x W <= max_block_weights (W the trainable weights of
      every module and aux head, M the microbatches a step runs), at least
      1; a call whose every step fits stays unrolled
      (`step_loop.auto_block`). Default 256: research.benchmark's MLP
      (16 weights, 16 steps a call) keeps its unrolled steps, worth 15% a
      step there; BERT (79 weights) runs blocks of 2 steps and
      MobileNetV2 (164) of 1, whose first calls the unrolled steps made
      2.3-2.6x plain Keras's, for no measurable steady cost
      (docs/results/tracing/blocks.md).
    graph_optimization: the training call's graph optimisation. "light":
      the lighter rewriter config of `tf_private.light_graph_optimization`;
      "default": TF's own; "auto" (default): light where every module runs
      on a CPU of this process (measured there, same graph after the passes
      it drops: docs/results/tracing/grappler.md and firstcall.md), TF's
      own elsewhere.
    min_traced_calls: a loop traces each module's work as one
      `tf.function` (`module_functions`) only where it calls it at least
      this often (steps x microbatches); below, op by op is cheaper to
      trace. Default 4, where the functions paid for themselves:
      docs/results/tracing/report.md.
    data_autotune: False (default): `InterlockModel.fit`'s training data
      runs with tf.data's autotuning off unless the dataset's own options
      set it (`keras_fit.without_autotune`; with it on, each `fit` call
      lasted until the next 10 ms x 2^n: docs/results/fit_speed/README.md).
      True: the dataset as given.

  Raises:
    ValueError: one line naming the bad value.
  """

  loop: str = "auto"
  loop_block: int = 1
  max_block_weights: int = 256
  graph_optimization: str = "auto"
  min_traced_calls: int = 4
  data_autotune: bool = False

  def __post_init__(self):
    if self.loop not in LOOPS:
      raise ValueError(f"loop must be one of {LOOPS}. "
                       f"Received: loop={self.loop!r}")
    block = self.loop_block
    if not int_args.is_int(block) or block < 1:
      raise ValueError(f"loop_block must be an int >= 1. "
                       f"Received: loop_block={block!r}")
    # Frozen: a numpy integer is kept as the Python int it is.
    object.__setattr__(self, "loop_block", int(block))
    if block > 1 and self.loop == "unrolled":
      raise ValueError(f"loop_block > 1 runs blocks of steps in a while "
                       f"loop; loop='unrolled' writes every step out. "
                       f"Received: loop_block={block}, loop='unrolled'")
    weights = self.max_block_weights
    if not int_args.is_int(weights) or weights < 1:
      raise ValueError(f"max_block_weights must be an int >= 1. "
                       f"Received: max_block_weights={weights!r}")
    object.__setattr__(self, "max_block_weights", int(weights))
    if self.graph_optimization not in GRAPH_OPTIMIZATIONS:
      raise ValueError(
          f"graph_optimization must be one of {GRAPH_OPTIMIZATIONS}. "
          f"Received: graph_optimization={self.graph_optimization!r}")
    calls = self.min_traced_calls
    if not int_args.is_int(calls) or calls < 1:
      raise ValueError(f"min_traced_calls must be an int >= 1. "
                       f"Received: min_traced_calls={calls!r}")
    object.__setattr__(self, "min_traced_calls", int(calls))
    if not isinstance(self.data_autotune, bool):
      raise ValueError(f"data_autotune must be True or False. "
                       f"Received: data_autotune={self.data_autotune!r}")


def resolve(options):
  """`options`, or the defaults for None.

  Raises:
    ValueError: when `options` is neither None nor an `ExecutionOptions`.
  """
  if options is None:
    return ExecutionOptions()
  if not isinstance(options, ExecutionOptions):
    raise ValueError(f"options must be a tf_interlock.ExecutionOptions or "
                     f"None. Received: options={options!r}")
  return options
