"""The one place our packages touch TensorFlow's private names.

Everything our packages (tf_interlock/, layers/, step_model/, train/,
research/) need from `tensorflow.python`, `tensorflow.core` (TF's protocol
buffers, outside the public `tf.*` API) or a private attribute of a TF object
goes through a function here, whose docstring names what it touches and why
no public API does the job; Keras's private names have their own adapter,
`tf_interlock/keras_private.py`. tests/test_tf_private.py walks every
package file's syntax tree and fails on a private name anywhere else.

Graph optimisation per call. TF has no public way to give one `tf.function` its own graph-optimisation
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
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.core.protobuf import trackable_object_graph_pb2
from tensorflow.python.eager import context as eager_context
from tensorflow.python.framework import config as tf_config
from tensorflow.python.saved_model import fingerprinting_utils
from tensorflow.python.training import checkpoint_state_pb2
from tensorflow.tsl.profiler.protobuf import xplane_pb2

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


def op_determinism_enabled():
  """Whether `tf.config.experimental.enable_op_determinism` is in force.

  Reads `tensorflow.python.framework.config.is_op_determinism_enabled`: the
  public API can switch determinism on but not ask whether it is on. XLA's
  "auto" stays off under it (`module_functions.resolve_jit_compile`).
  """
  return tf_config.is_op_determinism_enabled()


def profiler_xspace(data):
  """A profiler trace file's bytes (`*.xplane.pb`, what
  `tf.profiler.experimental` writes) as TSL's `XSpace` proto.

  TF ships no public reader: the proto module lives in tensorflow.tsl
  (research.trace_reader reads each device's ops from it).
  """
  space = xplane_pb2.XSpace()
  space.ParseFromString(data)
  return space


def saved_model_proto():
  """An empty `SavedModel` protocol buffer (`saved_model.pb`'s format).

  From `tensorflow.core.protobuf.saved_model_pb2`: TF's public API loads a
  SavedModel as objects, never as its graph proto, which the export rewrites
  in place (its StopGradient ops become Identity ops).
  """
  return saved_model_pb2.SavedModel()


def write_saved_model_fingerprint(saved_model_dir):
  """Writes `fingerprint.pb` for the SavedModel in `saved_model_dir`.

  Calls `tensorflow.python.saved_model.fingerprinting_utils
  .write_fingerprint`, what `tf.saved_model.save` calls last: the
  fingerprint holds a hash of `saved_model.pb`, so a rewritten graph needs a
  new one, and only `save` writes it publicly.
  """
  fingerprinting_utils.write_fingerprint(saved_model_dir)


def checkpoint_state(**fields):
  """A `CheckpointState` proto: the text format of a checkpoint folder's
  "checkpoint" pointer file that `tf.train.CheckpointManager` and
  `tf.train.latest_checkpoint` read.

  From `tensorflow.python.training.checkpoint_state_pb2`. The run folder
  parses the pointer to check it before TF trusts it, and writes it
  atomically itself; TF's public functions read or write it without either.

  Args:
    **fields: the proto's fields (`model_checkpoint_path`,
      `all_model_checkpoint_paths`); none for an empty proto to parse into.
  """
  return checkpoint_state_pb2.CheckpointState(**fields)


# The key under which a TF2 checkpoint stores its object graph (TF's
# `base.OBJECT_GRAPH_PROTO_KEY`).
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def checkpoint_object_graph(reader):
  """The `TrackableObjectGraph` proto of a TF2 checkpoint.

  Reads the tensor TF keeps under "_CHECKPOINTABLE_OBJECT_GRAPH" and parses
  it with `tensorflow.core.protobuf.trackable_object_graph_pb2`: the public
  reader lists checkpoint keys and shapes, not the object path each
  variable was saved under, which `checkpoint_match` compares.

  Args:
    reader: a checkpoint reader (`tf.train.load_checkpoint`'s kind).
  """
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
  return graph
