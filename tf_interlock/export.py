"""Exports trained interlocking modules as a device-free TF SavedModel.

An interlocking network (Gomez et al., 2022, arXiv:2010.04116) has K modules,
each but the last with an auxiliary head A_k, and each head is a usable
classifier: serving modules 1..k then A_k is an early exit. The SavedModel
written here has one signature per head:

* `serving_default`: modules 1..K, the network's final logits;
* `exit_k` for every module k < K with an aux head: modules 1..k then A_k.

Each returns `{"logits": float32 tensor}`. The served graphs are meant to run
anywhere, e.g. on a one-CPU server, so they carry no device annotations
(training places module k on device k) and no `StopGradient` ops (the
gradient cut of `InterlockModule.forward` means nothing at inference).

Layers add StopGradients of their own: `tf.nn.moments`, behind Keras'
LayerNormalization, cuts the gradient through the mean it subtracts. In the
forward pass a StopGradient is an identity, so the export rewrites every one
into an `Identity` op, which has the same input, output and attribute.
"""

import os
import shutil
import tempfile

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.saved_model import fingerprinting_utils

SERVING_KEY = "serving_default"
_EXIT_PREFIX = "exit_"
_INPUT_NAME = "inputs"


def exit_indices(modules):
  """1-based indices k of the modules whose aux head is an early exit.

  Args:
    modules: the K `InterlockModule`s, in depth order.

  Returns:
    The sorted k < K whose module has an aux head. Module K's output is the
    final logits, so an aux head on it is not served.
  """
  return [k for k, module in enumerate(modules[:-1], start=1)
          if module.has_aux_head]


def _head_fn(modules, k, aux):
  """The Python function served by one signature: modules 1..k [+ A_k]."""
  def serve(inputs):
    # A device function returning "" overrides every device scope, the
    # caller's and any inside the layers, for each op created below it.
    with tf.compat.v1.get_default_graph().device(lambda op: ""):
      h = inputs
      for module in modules[:k]:
        # `body`, not `forward`: the latter adds a StopGradient per module.
        h = module.body(h, training=False)
      if aux:
        h = modules[k - 1].aux_head(h, training=False)
      # Mixed-precision models compute in bfloat16/float16; clients get
      # float32 whatever the training policy was.
      return {"logits": tf.cast(h, tf.float32)}
  return serve


def _nodes(graph_def):
  """The NodeDefs of a GraphDef and of every function in its library."""
  nodes = list(graph_def.node)
  for function in graph_def.library.function:
    nodes.extend(function.node_def)
  return nodes


def _check_device_free(name, concrete):
  """Raises if any op of a signature, or of a function it calls, is placed."""
  for node in _nodes(concrete.graph.as_graph_def()):
    if node.device:
      raise RuntimeError(
          f"Signature {name!r} would pin op {node.name!r} to a device. "
          f"Received: device={node.device!r}")


def _signatures(modules, input_spec):
  """Traces the concrete function of every signature, keyed by name."""
  spec = tf.TensorSpec(input_spec.shape, input_spec.dtype, name=_INPUT_NAME)
  heads = {SERVING_KEY: (len(modules), False)}
  heads.update({f"{_EXIT_PREFIX}{k}": (k, True)
                for k in exit_indices(modules)})
  signatures = {}
  for name, (k, aux) in heads.items():
    concrete = tf.function(_head_fn(modules, k, aux),
                           input_signature=[spec]).get_concrete_function()
    _check_device_free(name, concrete)
    signatures[name] = concrete
  return signatures


def _stop_gradients_to_identities(saved_model_dir):
  """Rewrites every StopGradient op of a SavedModel into an Identity op."""
  path = os.path.join(saved_model_dir, "saved_model.pb")
  proto = saved_model_pb2.SavedModel()
  with open(path, "rb") as f:
    proto.ParseFromString(f.read())
  for meta_graph in proto.meta_graphs:
    for node in _nodes(meta_graph.graph_def):
      if node.op == "StopGradient":
        node.op = "Identity"
  with open(path, "wb") as f:
    f.write(proto.SerializeToString())
  # fingerprint.pb holds a hash of saved_model.pb: recompute it, so that it
  # describes the rewritten graph.
  fingerprinting_utils.write_fingerprint(saved_model_dir)


def _replace_dir(new_dir, export_dir):
  """Moves `new_dir` to `export_dir`, swapping out any existing directory.

  `export_dir` only ever holds a complete export, old or new (between the
  two renames it briefly does not exist); the old one is deleted only once
  the new one is in place, and put back if that fails.
  """
  if not os.path.exists(export_dir):
    os.rename(new_dir, export_dir)
    return
  old_dir = new_dir + ".old"
  os.rename(export_dir, old_dir)
  try:
    os.rename(new_dir, export_dir)
  except OSError:
    os.rename(old_dir, export_dir)
    raise
  shutil.rmtree(old_dir)


def export_saved_model(modules, input_spec, export_dir, *, overwrite=False):
  """Writes the modules as a SavedModel with one signature per exit.

  The SavedModel is first written to a temporary directory next to
  `export_dir`, then renamed into place, so an interrupted export never
  leaves a half-written `export_dir` behind.

  Args:
    modules: the K built `InterlockModule`s, in depth order.
    input_spec: `tf.TensorSpec` of the network input, batch axis included
      (usually None), e.g. `tf.TensorSpec([None, 32, 32, 3], tf.float32)`.
    export_dir: directory to create.
    overwrite: replace an existing non-empty `export_dir`; otherwise that is
      an error.

  Returns:
    The absolute path of the export.
  """
  modules = list(modules)
  if not modules:
    raise ValueError("Need at least one module to export. Received: "
                     "modules=[]")
  if not isinstance(input_spec, tf.TensorSpec):
    raise TypeError(f"input_spec must be a tf.TensorSpec. Received: "
                    f"input_spec={input_spec!r}")
  export_dir = os.path.abspath(os.fspath(export_dir))
  if os.path.exists(export_dir) and not (
      os.path.isdir(export_dir) and (overwrite or not os.listdir(export_dir))):
    raise ValueError(
        f"{export_dir} exists and is not an empty directory; pass "
        f"overwrite=True to replace it. Received: export_dir={export_dir!r}")
  root = tf.Module(name="interlock_export")
  # Named attributes, not a list: Keras 3 layers in a Python list attribute
  # of a tf.Module are not tracked, and their variables would not be saved.
  for k, module in enumerate(modules, start=1):
    setattr(root, f"module_{k}", module)
  signatures = _signatures(modules, input_spec)
  parent = os.path.dirname(export_dir)
  os.makedirs(parent, exist_ok=True)
  # Same parent, so the final rename stays on one file system (atomic).
  new_dir = tempfile.mkdtemp(
      prefix=f".{os.path.basename(export_dir)}.tmp-", dir=parent)
  try:
    tf.saved_model.save(root, new_dir, signatures=signatures)
    _stop_gradients_to_identities(new_dir)
    _replace_dir(new_dir, export_dir)
  finally:
    if os.path.exists(new_dir):
      shutil.rmtree(new_dir)
  return export_dir


def load_exported(export_dir):
  """Loads an export of `export_saved_model` after checking its files.

  Args:
    export_dir: the directory given to `export_saved_model`.

  Returns:
    The object of `tf.saved_model.load`; call `loaded.signatures[name]
    (inputs=x)["logits"]` with a name of `[SERVING_KEY] + exit_names(...)`.
  """
  path = os.path.abspath(os.fspath(export_dir))
  if not os.path.isdir(path):
    raise ValueError(f"No SavedModel directory at {path}. Received: "
                     f"export_dir={export_dir!r}")
  required = {
      "saved_model.pb": os.path.isfile(os.path.join(path, "saved_model.pb")),
      "variables/variables.index": os.path.isfile(
          os.path.join(path, "variables", "variables.index")),
  }
  missing = [name for name, present in required.items() if not present]
  if missing:
    # A direct tf.saved_model.load would fail with a multi-line protobuf or
    # checkpoint error that names neither the file nor the directory.
    raise ValueError(
        f"Incomplete SavedModel at {path}: missing {', '.join(missing)}. "
        f"Received: export_dir={export_dir!r}")
  loaded = tf.saved_model.load(path)
  if SERVING_KEY not in loaded.signatures:
    raise ValueError(
        f"The SavedModel at {path} has no {SERVING_KEY!r} signature. "
        f"Received: export_dir={export_dir!r}")
  return loaded


def exit_names(loaded):
  """Names of the early-exit signatures of a loaded export, in depth order.

  Args:
    loaded: the result of `load_exported`.

  Returns:
    ["exit_1", ..., "exit_{K-1}"] (fewer if some modules had no aux head).
  """
  names = [name for name in loaded.signatures
           if name.startswith(_EXIT_PREFIX)]
  return sorted(names, key=lambda name: int(name[len(_EXIT_PREFIX):]))
