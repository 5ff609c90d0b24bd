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

Each module's forward (`tf_interlock.exits`) cuts its input with a
StopGradient, and layers add their own: `tf.nn.moments`, behind Keras'
LayerNormalization, cuts the gradient through the mean it subtracts. In the
forward pass a StopGradient is an identity, so the export rewrites every one
into an `Identity` op, which has the same input, output and attribute.

The export is a plain SavedModel, written into a missing or empty folder.
Who owns a folder, and replacing an earlier export safely, is the training
binaries' policy (`train.export_dir`): they write through
`saved_model_writer` into a folder of their own and move it into place.
"""

import os

import tensorflow as tf

from tf_interlock import exits as exits_lib
from tf_interlock import metric_names
from tf_interlock import tf_private

SERVING_KEY = "serving_default"

# TF reads a SavedModel's variables (and a checkpoint prefix) as a file
# pattern: "exp[1]" matches "exp1", never itself, and no escape helps, since
# the same string is then opened literally. An export there is written but
# `tf.saved_model.load` fails. The training binaries refuse the same
# characters in their run and export folders (`train.run_dir`).
PATTERN_CHARS = "*?[]{}\\"


def pattern_chars(path):
  """The characters of `path` that TF reads as a file pattern ('' if none)."""
  return "".join(c for c in PATTERN_CHARS if c in os.fspath(path))


def _check_literal(export_dir, done):
  bad = pattern_chars(export_dir)
  if bad:
    raise ValueError(
        f"export_dir={export_dir} contains {bad!r}, which TensorFlow reads "
        f"as a file pattern when it loads a SavedModel; {done}: use a name "
        f"without {' '.join(PATTERN_CHARS)}. Received: "
        f"export_dir={export_dir!r}")
_EXIT_PREFIX = "exit_"
_INPUT_NAME = "inputs"


def _named_specs(input_spec):
  """(flat named specs, inputs from the flat arguments) of the network input.

  One tensor is the argument "inputs"; a dict of inputs is one argument
  per key, named by it (sorted), and a list one per input, "inputs_{i}".
  """
  if isinstance(input_spec, dict):
    keys = sorted(input_spec)
    return ([tf.TensorSpec(input_spec[key].shape, input_spec[key].dtype,
                           name=key) for key in keys],
            lambda args: dict(zip(keys, args)))
  if isinstance(input_spec, (list, tuple)):
    return ([tf.TensorSpec(s.shape, s.dtype, name=f"{_INPUT_NAME}_{i}")
             for i, s in enumerate(input_spec)], list)
  return ([tf.TensorSpec(input_spec.shape, input_spec.dtype,
                         name=_INPUT_NAME)], lambda args: args[0])


def _head_fn(modules, k, rebuild):
  """The Python function served by one signature: exit k (None: K)."""
  def serve(*args):
    inputs = rebuild(args)
    # A device function returning "" overrides every device scope, the
    # caller's and any inside the layers, for each op created below it.
    with tf.compat.v1.get_default_graph().device(lambda op: ""):
      logits = exits_lib.exit_logits(modules, inputs, k, training=False)
      # Mixed-precision models compute in bfloat16/float16; clients get
      # float32 whatever the training policy was.
      return {"logits": tf.cast(logits, tf.float32)}
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
  specs, rebuild = _named_specs(input_spec)
  heads = {SERVING_KEY: None}
  heads.update({f"{_EXIT_PREFIX}{k}": k
                for k in exits_lib.exit_indices(modules)})
  signatures = {}
  for name, k in heads.items():
    concrete = tf.function(_head_fn(modules, k, rebuild),
                           input_signature=specs).get_concrete_function()
    _check_device_free(name, concrete)
    signatures[name] = concrete
  return signatures


def _stop_gradients_to_identities(saved_model_dir):
  """Rewrites every StopGradient op of a SavedModel into an Identity op."""
  path = os.path.join(saved_model_dir, "saved_model.pb")
  proto = tf_private.saved_model_proto()
  with tf.io.gfile.GFile(path, "rb") as f:
    proto.ParseFromString(f.read())
  for meta_graph in proto.meta_graphs:
    for node in _nodes(meta_graph.graph_def):
      if node.op == "StopGradient":
        node.op = "Identity"
  # Removed first: some file systems (TF's ram://) append on "w".
  tf.io.gfile.remove(path)
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(proto.SerializeToString())
  # fingerprint.pb holds a hash of saved_model.pb: recompute it, so that it
  # describes the rewritten graph.
  fingerprint = os.path.join(saved_model_dir, "fingerprint.pb")
  if tf.io.gfile.exists(fingerprint):
    tf.io.gfile.remove(fingerprint)
  tf_private.write_saved_model_fingerprint(saved_model_dir)


def saved_model_writer(modules, input_spec):
  """Traces every signature now; returns `write(directory)`, which saves.

  The mechanism under `export_saved_model`, for a caller that decides
  itself where the SavedModel may go: `write` saves into `directory`
  whatever it holds already (the training binaries write into a temporary
  folder of their own, `train.export_dir`).

  Args:
    modules: the K built `InterlockModule`s, in depth order.
    input_spec: see `export_saved_model`.

  Returns:
    `write(directory)`: writes the SavedModel into `directory` (made if
    missing; local path or URL).
  """
  modules = list(modules)
  if not modules:
    raise ValueError("Need at least one module to export. Received: "
                     "modules=[]")
  if not all(isinstance(s, tf.TensorSpec)
             for s in tf.nest.flatten(input_spec)):
    raise TypeError(f"input_spec must be a tf.TensorSpec (or a dict or list "
                    f"of them). Received: input_spec={input_spec!r}")
  root = tf.Module(name="interlock_export")
  # Named attributes, not a list: Keras 3 layers in a Python list attribute
  # of a tf.Module are not tracked, and their variables would not be saved.
  for k, module in enumerate(modules, start=1):
    setattr(root, f"module_{k}", module)
  # K, so that a reader names serving_default's head module_K even when
  # modules before K have no exit (`signature_heads`).
  root.num_modules = tf.Variable(len(modules), trainable=False,
                                 dtype=tf.int64, name="num_modules")
  signatures = _signatures(modules, input_spec)
  # Every variable of every module, as Keras's own `model.export` tracks
  # them: a random augmentation layer (RandomFlip, RandomRotation; inactive
  # at inference) holds a seed generator whose state Keras lists in
  # `layer.variables` but keeps out of the layer's saved children, and a
  # signature may only capture what is reachable from the root.
  root.module_variables = [v for module in modules for v in module.variables]

  def write(directory):
    tf.saved_model.save(root, directory, signatures=signatures)
    _stop_gradients_to_identities(directory)

  return write


def _check_target(export_dir):
  """Raises unless `export_dir` is missing or an empty folder, and no file
  is in its way (a deep NotADirectoryError after tracing, else)."""
  _check_literal(export_dir, "the export could never be loaded, so nothing "
                 "was written")
  received = f"Received: export_dir={export_dir!r}"
  target = export_dir if "://" in export_dir else os.path.abspath(
      export_dir)
  blocker = target
  while "://" not in blocker and not os.path.exists(blocker):
    blocker = os.path.dirname(blocker)  # a URL's store has no files above
  if tf.io.gfile.exists(blocker) and not tf.io.gfile.isdir(blocker):
    where = ("is a file, not a folder" if blocker == target else
             f"lies under the file {blocker}")
    raise ValueError(f"export_dir={export_dir} {where}; nothing was "
                     f"written: pick a new folder. {received}")
  if not tf.io.gfile.exists(export_dir):
    return
  if tf.io.gfile.listdir(export_dir):
    raise ValueError(
        f"export_dir={export_dir} is not empty; nothing was written: an "
        f"export goes into a new or empty folder, so remove the old one or "
        f"pick another. {received}")


def export_saved_model(modules, input_spec, export_dir):
  """Writes the modules as a SavedModel with one signature per exit.

  Args:
    modules: the K built `InterlockModule`s, in depth order.
    input_spec: `tf.TensorSpec` of the network input, batch axis included
      (usually None), e.g. `tf.TensorSpec([None, 32, 32, 3], tf.float32)`;
      for a model of several inputs a dict (or list) of them, served as
      one named argument each.
    export_dir: the folder to write (local path or URL): missing or empty,
      its name free of the characters TF reads as a file pattern
      (`PATTERN_CHARS`). Anything else is refused before tracing, and
      nothing is written.

  Returns:
    `export_dir`, as a string.
  """
  export_dir = os.fspath(export_dir)
  _check_target(export_dir)  # before tracing
  saved_model_writer(modules, input_spec)(export_dir)
  return export_dir


def load_exported(export_dir):
  """Loads an export of `export_saved_model` after checking its files.

  Args:
    export_dir: the directory given to `export_saved_model`.

  Returns:
    The object of `tf.saved_model.load`; call `loaded.signatures[name]
    (inputs=x)["logits"]` with a name of `[SERVING_KEY] + exit_names(...)`.
  """
  path = os.fspath(export_dir)
  received = f"Received: export_dir={path!r}"
  _check_literal(path, "rename the folder to load it")
  if not tf.io.gfile.isdir(path):
    raise ValueError(f"No SavedModel directory at {path}. {received}")
  variables = os.path.join(path, "variables")
  has_data = tf.io.gfile.isdir(variables) and any(
      name.startswith("variables.data-")
      for name in tf.io.gfile.listdir(variables))
  required = {
      "saved_model.pb": tf.io.gfile.exists(os.path.join(path,
                                                         "saved_model.pb")),
      "variables/variables.index": tf.io.gfile.exists(
          os.path.join(variables, "variables.index")),
      "variables/variables.data-*": has_data,
  }
  missing = [name for name, present in required.items() if not present]
  if missing:
    # A direct tf.saved_model.load would fail with a multi-line protobuf or
    # checkpoint error that names neither the file nor the directory.
    raise ValueError(
        f"Incomplete SavedModel at {path}: missing {', '.join(missing)}. "
        f"{received}")
  try:
    loaded = tf.saved_model.load(path)
  except (tf.errors.OpError, ValueError, OSError, IndexError) as e:
    first = (str(e).strip().splitlines() or [""])[0][:160]
    raise ValueError(
        f"Cannot load the SavedModel at {path}: its files are damaged or "
        f"truncated ({type(e).__name__}: {first}). {received}") from None
  if SERVING_KEY not in loaded.signatures:
    raise ValueError(
        f"The SavedModel at {path} has no {SERVING_KEY!r} signature. "
        f"{received}")
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


def signature_heads(loaded):
  """{head: signature name} of a loaded export, heads named as metrics are.

  Args:
    loaded: the result of `load_exported`.

  Returns:
    {"module_k": "exit_k", ..., "module_K": SERVING_KEY}, in depth order.
    An export written before it recorded K takes module K to follow its
    deepest exit.
  """
  exits = {metric_names.module_name(int(name[len(_EXIT_PREFIX):]) - 1): name
           for name in exit_names(loaded)}
  count = getattr(loaded, "num_modules", None)
  last = (int(count.numpy()) if count is not None else
          1 + max([metric_names.head_index(h) + 1 for h in exits],
                  default=0))
  return {**exits, metric_names.module_name(last - 1): SERVING_KEY}
