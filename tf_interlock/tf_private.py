"""The one place our packages touch TensorFlow's private names.

TF has no public way to give one `tf.function` its own graph-optimisation
settings: `tf.config.optimizer.set_experimental_options` holds for every
function of the process, the user's included. The runtime does take them
per call: a function call carries a `config_proto` attribute, read from the
eager context's `function_call_options` when the call is made, and the
runtime instantiates (optimises and places) a function once per distinct
attribute set. `light_graph_optimization` sets that attribute for the calls
made inside its block, and nothing else.

Checked against the TF versions in `CHECKED_TF_VERSIONS`;
tests/test_tf_private.py fails naming the installed TF when it differs, and
checks that a call inside the block gets the settings and a call after it
does not.
"""

import contextlib

from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.eager import context as eager_context

# TF versions whose private names below were read in the source and
# exercised by tests/test_tf_private.py.
CHECKED_TF_VERSIONS = ("2.21.0",)

_OFF = rewriter_config_pb2.RewriterConfig.OFF


def light_rewrites(rewrite_options):
  """Switches off, in a `RewriterConfig`, the graph optimiser's passes that
  left the unrolled training loop's graph unchanged on CPU, and its second
  round (docs/results/tracing/grappler.md): TFG's shape inference and
  attribute pass, the layout optimiser (NCHW/NHWC transposes, for GPU
  convolutions), the memory optimiser (swapping and recomputation under
  memory pressure) and the loop optimiser. Constant folding, the
  arithmetic, dependency and remapping (op fusion) passes, pruning and
  common-subgraph elimination stay on, once."""
  rewrite_options.disable_tfg_optimizer = True
  rewrite_options.meta_optimizer_iterations = (
      rewriter_config_pb2.RewriterConfig.ONE)
  rewrite_options.layout_optimizer = _OFF
  rewrite_options.loop_optimization = _OFF
  rewrite_options.memory_optimization = (
      rewriter_config_pb2.RewriterConfig.NO_MEM_OPT)


@contextlib.contextmanager
def light_graph_optimization():
  """Function calls made in the block are optimised with `light_rewrites`.

  Touches `context.context().function_call_options` (TF's
  `FunctionCallOptions`, its `config_proto_serialized` and
  `executor_type`): the per-thread options every `tf.function` call reads
  when it is made. A copy with the lighter `RewriterConfig` replaces them
  inside the block; the previous options come back after it, so calls
  outside the block (and every other thread's) keep the process's settings.
  A function first called inside the block is instantiated once for these
  settings and reused by later calls inside it.
  """
  ctx = eager_context.context()
  old = ctx.function_call_options
  config = config_pb2.ConfigProto()
  config.ParseFromString(old.config_proto_serialized)
  light_rewrites(config.graph_options.rewrite_options)
  ctx.function_call_options = eager_context.FunctionCallOptions(
      executor_type=old.executor_type, config_proto=config)
  try:
    yield
  finally:
    ctx.function_call_options = old
