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

Never lose what we did not write: each export carries a marker file,
`interlock_export.json`, naming its owner (a training run's id) and listing
every file the export wrote. An existing `export_dir` is replaced only when
it is empty, or its marker names the same owner and it holds nothing but
the listed files (say, a run someone started inside it); anything else is
refused. Every file operation goes through
`tf.io.gfile`, so `export_dir` may be local or a URL (gs://, ram://).
"""

import json
import os
import uuid

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.saved_model import fingerprinting_utils

from tf_interlock import paths

SERVING_KEY = "serving_default"
_EXIT_PREFIX = "exit_"
_INPUT_NAME = "inputs"
MARKER = "interlock_export.json"
# What a SavedModel holds at its top level: an export whose marker predates
# the file list may hold these and nothing else.
_SAVED_MODEL_ENTRIES = frozenset({
    "saved_model.pb", "saved_model.pbtxt", "variables", "assets",
    "assets.extra", "fingerprint.pb", "keras_metadata.pb", MARKER})


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
  path = paths.join(saved_model_dir, "saved_model.pb")
  proto = saved_model_pb2.SavedModel()
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
  fingerprint = paths.join(saved_model_dir, "fingerprint.pb")
  if tf.io.gfile.exists(fingerprint):
    tf.io.gfile.remove(fingerprint)
  fingerprinting_utils.write_fingerprint(saved_model_dir)


def read_marker(export_dir):
  """The marker of an export: {"owner": ..., ...}, or None if absent/bad."""
  path = paths.join(os.fspath(export_dir), MARKER)
  if paths.special_kind(path) is not None:
    return None  # a FIFO would block the read: no marker of ours
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      marker = json.loads(f.read().decode("utf-8"))
  except (tf.errors.OpError, ValueError):
    return None
  return marker if isinstance(marker, dict) else None


def _files(directory):
  """Every file and folder under `directory`, as sorted relative paths."""
  found = []
  for root, dirs, files in tf.io.gfile.walk(directory):
    rel = root[len(directory):].strip("/")
    found.extend(paths.join(rel, name.rstrip("/")) if rel else
                 name.rstrip("/") for name in list(dirs) + list(files))
  return sorted(found)


def foreign_entries(directory, marker):
  """What `directory` holds that the export of `marker` did not write.

  Args:
    directory: an existing export directory.
    marker: its marker (`read_marker`).

  Returns:
    Sorted relative paths; [] when everything there is the export's.
  """
  if isinstance(marker.get("files"), list):
    return sorted(set(_files(directory)) - set(marker["files"]))
  return sorted(name.rstrip("/") for name in tf.io.gfile.listdir(directory)
                if name.rstrip("/") not in _SAVED_MODEL_ENTRIES)


def _owned(directory, owner):
  """True if `directory` is an export of `owner` (a non-None id) holding
  only what that export wrote."""
  marker = read_marker(directory)
  return (owner is not None and marker is not None and
          marker.get("owner") == owner and
          not foreign_entries(directory, marker))


def check_export_target(export_dir, owner=None, name="export_dir"):
  """Raises unless an export may write `export_dir`; writes nothing.

  Allowed: a path that does not exist (its parents are created), an empty
  directory, or an earlier export whose marker names `owner`.

  Args:
    export_dir: the target path.
    owner: the id of the run exporting (None: nothing is replaceable).
    name: how errors name the target, e.g. "--export_dir".

  Raises:
    ValueError: naming the path and what is wrong with it.
  """
  export_dir = paths.normalize(export_dir)
  received = f"Received: {name.lstrip('-')}={export_dir!r}"
  blocker = paths.file_above(export_dir)
  if blocker == export_dir:
    raise ValueError(f"{name}={export_dir} is a file, not a directory; pick "
                     f"a new directory. {received}")
  if blocker is not None:
    raise ValueError(f"{name}={export_dir} lies under the file {blocker}; "
                     f"pick a directory path. {received}")
  if not tf.io.gfile.exists(export_dir):
    return
  marker = read_marker(export_dir)
  foreign = (foreign_entries(export_dir, marker)
             if marker is not None and owner is not None and
             marker.get("owner") == owner else [])
  if foreign:
    shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
    raise ValueError(
        f"{name}={export_dir} is an earlier export of this run but also "
        f"holds entries the export did not write ({shown}); nothing was "
        f"changed: move them away or pick another directory. {received}")
  if tf.io.gfile.listdir(export_dir) and not _owned(export_dir, owner):
    raise ValueError(
        f"{name}={export_dir} holds files that are not an export of this "
        f"run (no {MARKER} naming it); nothing was changed: move them away "
        f"or pick another directory. {received}")


def _write_marker(directory, marker):
  """Writes `marker` plus the list of files `directory` holds (itself
  included), so a later export can tell its own files from others'."""
  path = paths.join(directory, MARKER)
  files = sorted(set(_files(directory)) | {MARKER})
  if tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)  # ram:// appends on "w"
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(json.dumps(dict(marker, files=files), indent=2, sort_keys=True))


def _siblings(export_dir, kind):
  """Temporary siblings of `export_dir` of one kind ("tmp" or "old")."""
  prefix = f".{paths.basename(export_dir)}.{kind}-"
  parent = paths.parent(export_dir)
  return [paths.join(parent, entry.rstrip("/"))
          for entry in tf.io.gfile.listdir(parent)
          if entry.startswith(prefix)]


def _remove_stale(export_dir, owner):
  """Deletes what an export of `owner` killed midway left next to the target.

  Only our own names (`.<name>.tmp-*`, `.<name>.old-*`) that are empty or
  carry `owner`'s marker; anything else stays. An `.old-*` export while
  `export_dir` is missing (killed between the two moves) is the only
  complete export: it is put back, not deleted.
  """
  for path in _siblings(export_dir, "old"):
    if not tf.io.gfile.exists(export_dir) and _owned(path, owner):
      paths.move_dir(path, export_dir, last=MARKER)
  for path in _siblings(export_dir, "tmp") + _siblings(export_dir, "old"):
    if tf.io.gfile.isdir(path) and (
        not tf.io.gfile.listdir(path) or _owned(path, owner)):
      tf.io.gfile.rmtree(path)


def _replace_dir(new_dir, export_dir, old_dir):
  """Moves `new_dir` to `export_dir`, swapping out any existing directory.

  `export_dir` only ever holds a complete export, old or new (between the
  two moves it briefly does not exist); the old one is deleted only once
  the new one is in place, and put back if that fails.
  """
  if tf.io.gfile.exists(export_dir) and not tf.io.gfile.listdir(export_dir):
    tf.io.gfile.rmtree(export_dir)  # empty: nothing to keep
  if not tf.io.gfile.exists(export_dir):
    paths.move_dir(new_dir, export_dir, last=MARKER)
    return
  paths.move_dir(export_dir, old_dir, last=MARKER)
  # Checked again once it is out of the way: a file added to the old export
  # since `check_export_target` would otherwise be deleted with it.
  marker = read_marker(old_dir)
  late = ([MARKER] if marker is None else foreign_entries(old_dir, marker))
  if late:
    paths.move_dir(old_dir, export_dir, last=MARKER)
    raise ValueError(
        f"export_dir={export_dir} changed during the export: it now holds "
        f"entries the earlier export did not write ({', '.join(late[:3])}); "
        f"nothing was replaced. Received: export_dir={export_dir!r}")
  try:
    paths.move_dir(new_dir, export_dir, last=MARKER)
  except BaseException:  # also Ctrl-C or SIGTERM between the two moves
    if tf.io.gfile.exists(export_dir):
      tf.io.gfile.rmtree(export_dir)  # a partial copy (URLs) of new_dir
    paths.move_dir(old_dir, export_dir, last=MARKER)
    raise
  tf.io.gfile.rmtree(old_dir)


def export_saved_model(modules, input_spec, export_dir, *, owner=None,
                       metadata=None):
  """Writes the modules as a SavedModel with one signature per exit.

  The SavedModel is first written to a temporary directory next to
  `export_dir` (`.<name>.tmp-<id>`, holding the marker from the start), then
  moved into place, so an interrupted export never leaves a half-written
  `export_dir` behind; the next export of the same owner deletes such
  leftovers.

  Args:
    modules: the K built `InterlockModule`s, in depth order.
    input_spec: `tf.TensorSpec` of the network input, batch axis included
      (usually None), e.g. `tf.TensorSpec([None, 32, 32, 3], tf.float32)`.
    export_dir: directory to create (local path or URL).
    owner: an id (e.g. a training run's) written into the marker; an
      existing export is replaced only if its marker names the same owner.
      None: only a missing or empty `export_dir` is written.
    metadata: JSON-serializable dict stored in the marker (e.g. the run's
      model_dir and config), read back by `read_marker`.

  Returns:
    The normalized path of the export.
  """
  modules = list(modules)
  if not modules:
    raise ValueError("Need at least one module to export. Received: "
                     "modules=[]")
  if not isinstance(input_spec, tf.TensorSpec):
    raise TypeError(f"input_spec must be a tf.TensorSpec. Received: "
                    f"input_spec={input_spec!r}")
  export_dir = paths.normalize(export_dir)
  check_export_target(export_dir, owner)
  root = tf.Module(name="interlock_export")
  # Named attributes, not a list: Keras 3 layers in a Python list attribute
  # of a tf.Module are not tracked, and their variables would not be saved.
  for k, module in enumerate(modules, start=1):
    setattr(root, f"module_{k}", module)
  signatures = _signatures(modules, input_spec)
  tf.io.gfile.makedirs(paths.parent(export_dir))
  if owner is not None:
    _remove_stale(export_dir, owner)
  # Same parent, so the final rename stays on one file system (atomic).
  token = uuid.uuid4().hex[:12]
  new_dir, old_dir = (
      paths.join(paths.parent(export_dir),
                 f".{paths.basename(export_dir)}.{kind}-{token}")
      for kind in ("tmp", "old"))
  tf.io.gfile.makedirs(new_dir)
  try:
    _write_marker(new_dir, {"owner": owner, **(metadata or {})})
    tf.saved_model.save(root, new_dir, signatures=signatures)
    _stop_gradients_to_identities(new_dir)
    _write_marker(new_dir, {"owner": owner, **(metadata or {})})
    _replace_dir(new_dir, export_dir, old_dir)
  finally:
    if tf.io.gfile.exists(new_dir):
      tf.io.gfile.rmtree(new_dir)
  return export_dir


def load_exported(export_dir):
  """Loads an export of `export_saved_model` after checking its files.

  Args:
    export_dir: the directory given to `export_saved_model`.

  Returns:
    The object of `tf.saved_model.load`; call `loaded.signatures[name]
    (inputs=x)["logits"]` with a name of `[SERVING_KEY] + exit_names(...)`.
  """
  path = paths.normalize(export_dir)
  received = f"Received: export_dir={os.fspath(export_dir)!r}"
  if not tf.io.gfile.isdir(path):
    raise ValueError(f"No SavedModel directory at {path}. {received}")
  variables = paths.join(path, "variables")
  has_data = tf.io.gfile.isdir(variables) and any(
      name.startswith("variables.data-")
      for name in tf.io.gfile.listdir(variables))
  required = {
      "saved_model.pb": tf.io.gfile.exists(paths.join(path,
                                                      "saved_model.pb")),
      "variables/variables.index": tf.io.gfile.exists(
          paths.join(variables, "variables.index")),
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
