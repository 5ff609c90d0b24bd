"""Who owns an export directory, and how an export replaces it safely.

Never lose what we did not write: an export is an owned folder
(`train.owned_dir`, the project's one ownership scheme). Its marker,
`interlock_export.json`, names its owner (a training run's id) and lists
every file the export wrote. An existing export directory is replaced only
when it is empty, or its marker names the same owner and it holds nothing
but the listed files (say, a run someone started inside it); anything else
is refused.

`write_owned` is the replace protocol: the new content is written into a
temporary sibling `.<name>.tmp-<id>` (holding the marker from the start),
then moved into place; an existing export is first moved aside to
`.<name>.old-<id>` and deleted only once the new one is in place. An
interrupted export therefore never leaves a half-written directory behind,
and the next export of the same owner removes (or, for a complete export
left aside, puts back) what it left. Every file operation goes through
`tf.io.gfile`, so the directory may be local or a URL (gs://, ram://).

The library's `tf_interlock.export.export_saved_model` writes a plain
SavedModel into a new folder and knows no owner; `export_owned` is the
binaries' export: the same SavedModel, through the protocol above.
"""

import errno
import json
import os
import uuid

import tensorflow as tf

from tf_interlock import export as export_lib
from train import owned_dir
from train import paths

MARKER = "interlock_export.json"
# What a SavedModel holds at its top level: an export whose marker predates
# the file list may hold these and nothing else.
_SAVED_MODEL_ENTRIES = frozenset({
    "saved_model.pb", "saved_model.pbtxt", "variables", "assets",
    "assets.extra", "fingerprint.pb", "keras_metadata.pb", MARKER})


def read_marker(export_dir):
  """The marker of an export: {"owner": ..., ...}, or None if absent/bad."""
  return owned_dir.read_marker(export_dir, MARKER)


def foreign_entries(directory, marker):
  """What `directory` holds that the export of `marker` did not write.

  Args:
    directory: an existing export directory.
    marker: its marker (`read_marker`).

  Returns:
    Sorted relative paths; [] when everything there is the export's.
  """
  if isinstance(marker.get("files"), list):
    return owned_dir.foreign_entries(
        directory, set(marker["files"]).__contains__, recursive=True)
  return owned_dir.foreign_entries(directory,
                                   _SAVED_MODEL_ENTRIES.__contains__)


def _owned(directory, owner):
  """True if `directory` is an export of `owner` (a non-None id) holding
  only what that export wrote."""
  marker = read_marker(directory)
  return (owned_dir.names(marker, owner=owner) and
          not foreign_entries(directory, marker))


# Characters the temporary sibling `.<name>.tmp-<12 hex>` adds to the name.
_SIBLING_EXTRA = len("..tmp-") + 12
# The deepest file a SavedModel writes below the export, with its "/":
# TF's temporary shard while it saves the variables (a 19-digit random
# number ends it).
_DEEPEST = len("/variables/variables_temp/part-00000-of-00001.data-00000-of-"
               "00001.tempstate") + 20


def _check_local_path(export_dir, name, received):
  """Raises if the export would fail after training, or write through a
  link: its temporary sibling's name or deepest file over the file
  system's limits, or `export_dir` a symbolic link (replacing it would
  replace the link, never the folder it points to)."""
  if paths.is_url(export_dir):
    return
  if os.path.islink(export_dir):
    raise ValueError(
        f"{name}={export_dir} is a symbolic link (to "
        f"{os.readlink(export_dir)}); an export replaces its folder, so it "
        f"is never written through a link; nothing was written: name the "
        f"folder itself or a new one. {received}")
  existing = export_dir
  while not os.path.isdir(existing):
    existing = os.path.dirname(existing)
  name_max = os.pathconf(existing, "PC_NAME_MAX")
  path_max = os.pathconf(existing, "PC_PATH_MAX")
  longest = len(paths.basename(export_dir)) + _SIBLING_EXTRA
  deepest = len(export_dir) + _SIBLING_EXTRA + _DEEPEST
  if longest > name_max or deepest >= path_max:
    what, size, limit = (("name", longest, name_max) if longest > name_max
                         else ("deepest path", deepest, path_max))
    raise ValueError(
        f"{name}={export_dir} is too long: the export's temporary folder "
        f"beside it (.<name>.tmp-<12 hex>) would have a {what} of {size} "
        f"characters, over the file system's limit of {limit}; nothing was "
        f"written: pick a shorter path. {received}")


def _check_sibling_links(export_dir, name, received):
  """Raises if a `.<name>.tmp-*` or `.old-*` beside the target is a link.

  Those names are an export's own leftovers, which the next export removes
  (`remove_stale`), and never through a link (`owned_dir.check_contained`).
  Found only then, at the end of training, the link would stop the run
  after its last steps; found here, the run (whose preflight calls this
  through `RunDir.check_export_dir`) stops before anything is written.
  """
  parent = paths.parent(export_dir)
  if paths.is_url(export_dir) or not os.path.isdir(parent):
    return
  for path in sorted(_siblings(export_dir, "tmp") +
                     _siblings(export_dir, "old")):
    if os.path.islink(path):
      raise ValueError(
          f"{path} is a symbolic link (to {os.readlink(path)}) named like "
          f"a temporary folder of the export {name}={export_dir}, which an "
          f"export removes, never through a link; nothing was written: "
          f"move it away. {received}")


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
  owned_dir.check_folder_path(export_dir, name)
  _check_local_path(export_dir, name, received)
  _check_sibling_links(export_dir, name, received)
  if not tf.io.gfile.exists(export_dir):
    return
  marker = read_marker(export_dir)
  foreign = (foreign_entries(export_dir, marker)
             if owned_dir.names(marker, owner=owner) else [])
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
  files = sorted(set(owned_dir.entries(directory)) | {MARKER})
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


def remove_stale(export_dir, owner):
  """Deletes what an export of `owner` killed midway left next to the target.

  Only our own names (`.<name>.tmp-*`, `.<name>.old-*`) that are empty or
  carry `owner`'s marker; anything else stays. An `.old-*` export while
  `export_dir` is missing (killed between the two moves) is the only
  complete export: it is put back, not deleted.
  """
  for path in _siblings(export_dir, "old"):
    if not tf.io.gfile.exists(export_dir) and _owned(path, owner):
      owned_dir.move(paths.parent(export_dir), path, export_dir,
                     last=MARKER)
  for path in _siblings(export_dir, "tmp") + _siblings(export_dir, "old"):
    if tf.io.gfile.isdir(path) and (
        not tf.io.gfile.listdir(path) or _owned(path, owner) or
        _killed_write(path, owner)):
      owned_dir.remove_marked(path, MARKER)


def _killed_write(directory, owner):
  """True if `directory` is a `.tmp-*` of `owner` killed while the SavedModel
  was written: its first marker (listing only itself) and SavedModel
  entries, nothing else."""
  marker = read_marker(directory)
  return (owner is not None and marker is not None and
          marker.get("owner") == owner and marker.get("files") == [MARKER]
          and all(name.rstrip("/") in _SAVED_MODEL_ENTRIES
                  for name in tf.io.gfile.listdir(directory)))


def _move_into_place(new_dir, export_dir):
  """Moves the finished `new_dir` to the missing or empty `export_dir`.

  Create-exclusive: locally one rename(2), which fails when another export
  filled `export_dir` since it was checked, so that one is never replaced.

  Raises:
    ValueError: another process wrote `export_dir` meanwhile.
    OSError: the move failed otherwise (e.g. EBUSY: a mount point).
  """
  try:
    owned_dir.move(paths.parent(export_dir), new_dir, export_dir,
                   last=MARKER)
  except OSError as e:
    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
      raise  # not a race: a mount point (EBUSY), permissions, ...
    raise ValueError(
        f"export_dir={export_dir} was written by another process while "
        f"this export ran; nothing was replaced: export again into another "
        f"directory. Received: export_dir={export_dir!r}") from None


def _replace_dir(new_dir, export_dir, old_dir, owner):
  """Moves `new_dir` to `export_dir`, swapping out an export of `owner`.

  `export_dir` only ever holds a complete export, old or new (between the
  two moves it briefly does not exist); the old one is deleted only once
  the new one is in place, and put back if that fails. An export found
  there that is not `owner`'s (another process's, written since
  `check_export_target`) is put back untouched.
  """
  parent = paths.parent(export_dir)
  if not tf.io.gfile.exists(export_dir) or not tf.io.gfile.listdir(
      export_dir):
    _move_into_place(new_dir, export_dir)
    return
  owned_dir.move(parent, export_dir, old_dir, last=MARKER)
  # A signal is raised at the first bytecode after a C call returns, so the
  # try starts right after the move (a SIGTERM during it lands here).
  try:
    # Checked again once it is out of the way: an export or a file added
    # since `check_export_target` would otherwise be deleted with it.
    marker = read_marker(old_dir)
    late = ([MARKER] if not owned_dir.names(marker, owner=owner)
            else foreign_entries(old_dir, marker))
    if not late:
      _move_into_place(new_dir, export_dir)
  except BaseException:  # also Ctrl-C or SIGTERM between the two moves
    if paths.is_url(export_dir) and tf.io.gfile.exists(export_dir):
      owned_dir.remove(parent, export_dir)  # a partial copy of new_dir
    if not tf.io.gfile.exists(export_dir):
      owned_dir.move(parent, old_dir, export_dir, last=MARKER)
    raise
  if late:
    owned_dir.move(parent, old_dir, export_dir, last=MARKER)
    what = ("an export of another owner" if late == [MARKER] else
            f"entries the earlier export did not write ({', '.join(late[:3])})")
    raise ValueError(
        f"export_dir={export_dir} changed during the export: it now holds "
        f"{what}; nothing was replaced. Received: export_dir={export_dir!r}")
  owned_dir.remove_marked(old_dir, MARKER)


def write_owned(export_dir, write, *, owner=None, metadata=None):
  """Writes a directory through `write(tmp_dir)`, then moves it into place.

  Args:
    export_dir: the target (local path or URL); checked first with
      `check_export_target`, so nothing is written when it is refused.
    write: `write(tmp_dir)` fills the fresh temporary sibling directory.
    owner: an id (e.g. a training run's) written into the marker; an
      existing export is replaced only if its marker names the same owner.
      None: only a missing or empty `export_dir` is written.
    metadata: JSON-serializable dict stored in the marker, read back by
      `read_marker`.

  Returns:
    The normalized `export_dir`.
  """
  export_dir = paths.normalize(export_dir)
  check_export_target(export_dir, owner)
  tf.io.gfile.makedirs(paths.parent(export_dir))
  if owner is not None:
    remove_stale(export_dir, owner)
  # Same parent, so the final rename stays on one file system (atomic).
  token = uuid.uuid4().hex[:12]
  new_dir, old_dir = (
      paths.join(paths.parent(export_dir),
                 f".{paths.basename(export_dir)}.{kind}-{token}")
      for kind in ("tmp", "old"))
  marker = {"owner": owner, **(metadata or {})}
  try:  # made inside: a SIGTERM during makedirs is raised just after it
    tf.io.gfile.makedirs(new_dir)
    _write_marker(new_dir, marker)  # a killed write is still recognisable
    write(new_dir)
    _write_marker(new_dir, marker)  # now listing every file written
    _replace_dir(new_dir, export_dir, old_dir, owner)
  finally:
    if tf.io.gfile.exists(new_dir):
      owned_dir.remove(paths.parent(export_dir), new_dir)
  return export_dir


def export_owned(modules, input_spec, export_dir, *, owner, metadata=None):
  """Exports the modules (`tf_interlock.export`) as an owned export.

  The target is checked before tracing (`check_export_target`), then the
  SavedModel is written into a temporary sibling and moved into place
  (`write_owned`): an interrupted export never leaves a half-written
  `export_dir`, and an existing one is replaced only when it is `owner`'s.

  Args:
    modules: the K built `InterlockModule`s, in depth order.
    input_spec: the network input's `tf.TensorSpec` (or a dict or list).
    export_dir: the target (local path or URL).
    owner: the run's id, written into the marker.
    metadata: JSON-serializable dict stored in the marker (the run's
      model_dir, config and step), read back by `read_marker`.

  Returns:
    The normalized `export_dir`.
  """
  check_export_target(export_dir, owner)  # before tracing
  write = export_lib.saved_model_writer(modules, input_spec)
  return write_owned(export_dir, write, owner=owner, metadata=metadata)
