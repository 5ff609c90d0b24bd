"""Owned folders: the one scheme by which the project deletes only its own.

Every folder that the project may later empty, replace or delete carries a
marker, a JSON object that names its owner:

  folder                          marker (the fields that make it ours)
  a run directory (model_dir)     run.json {"run_id"}
  an export                       interlock_export.json {"owner", "files"}
  research.compare's out_dir      compare_study.json {"owner"}
  one run folder of a compare     compare_run.json {"owner", "strategy",
                                  "seed"}

The rules, the same for all of them:

1. A folder is ours only when its marker names us (`names`); a missing,
   unreadable or foreign marker refuses the operation, in one line naming
   the folder, before anything is written.
2. Even then only entries we write are touched: `foreign_entries` lists
   the others, and any of them refuses (a user's notes put in an export).
3. A marker is created once (`create_marker`), atomically, and never
   overwritten: of two processes creating it one gets False.
4. Deleting removes the marker last (`remove_marked`), so a deletion
   killed midway leaves a folder that is still recognisably ours, and the
   next run of the same owner finishes it. Such leftovers are removed only
   by their owner: an export's `.<name>.tmp-*`/`.old-*` siblings
   (`export_dir.remove_stale`), a run's `ckpt-N_temp` folders
   (`RunDir.remove_unfinished_checkpoints`), a dead holder's lock (taken
   over by `RunLock.acquire`).
5. Every delete, rename or overwrite goes through one check,
   `check_contained` (`remove`, `clear`, `remove_marked`, `move`): the
   entry lies inside the owned folder, and no component from that folder
   down to it, nor anything inside it, is a symbolic link (`lstat`, never
   followed: TF's recursive delete follows links, and so would empty a
   user's folder that a link in our tree points to). A link is refused in
   one line naming it, before anything is deleted.
6. While a process writes a folder it holds the folder's lock
   (`train.run_lock`: an OS flock plus a token in lock.json or
   compare_lock.json).

The scheme is the binaries' policy, so it lives with them (`train/`); the
library (`tf_interlock`) writes only into new or empty folders and owns
none.

Every file access goes through `tf.io.gfile`: local folders, gs:// or ram://.
"""

import json
import os

import tensorflow as tf

from train import paths


# Run files hold a few levels of objects; deeper nesting is hostile (it
# would exhaust Python's recursion in json or in a later comparison).
MAX_JSON_DEPTH = 32


def _depth_problem(value):
  """Why `value` nests too deeply, or None (an iterative walk: a recursive
  one would fail on the very input it checks)."""
  stack = [(value, 1)]
  while stack:
    item, depth = stack.pop()
    if depth > MAX_JSON_DEPTH:
      return f"nested deeper than {MAX_JSON_DEPTH} levels"
    children = (item.values() if isinstance(item, dict) else
                item if isinstance(item, list) else ())
    stack.extend((child, depth + 1) for child in children
                 if isinstance(child, (dict, list)))
  return None


def load_json(path, fields=None, received=None):
  """The JSON object at `path`, or ValueError saying why it is none.

  The one reader of the JSON files we read back (run files, markers,
  locks, a study's records, a vocabulary): it checks their shape. A FIFO
  (whose read would block forever), a socket or a device is refused
  unread; a missing file, bad JSON, JSON nested deeper than
  MAX_JSON_DEPTH, a value that is not an object, or one whose `fields`
  lack or mistype an entry is "not a readable JSON object".

  Args:
    path: the file.
    fields: optional {name: type or tuple of types} the object must hold.
    received: None: the error is the reason alone ("is ..."), for the
      caller's line; else the whole line, "<path> is ... Received:
      <received>" (e.g. "report_dir='x'").

  Raises:
    ValueError: see `received`.
  """
  if received is not None:
    try:
      return load_json(path, fields)
    except ValueError as e:
      raise ValueError(f"{path} {e}. Received: {received}") from None
  kind = paths.special_kind(path)
  if kind is not None:
    raise ValueError(f"is {kind}, not a regular file")
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      data = f.read()
  except tf.errors.OpError as e:
    reason = (str(e).splitlines() or [""])[0][:100]
    raise ValueError(f"is not a readable JSON object ({reason})") from None
  return parse_json(data, fields)


def parse_json(data, fields=None):
  """The JSON object in `data` (bytes), or ValueError saying why it is
  none: `load_json`'s checks, for a caller that read the bytes itself
  (`train.user_files`)."""
  try:
    value = json.loads(data.decode("utf-8"))
    problem = _depth_problem(value) or (
        None if isinstance(value, dict) else "not a JSON object")
    if problem is None:
      for name, kind in (fields or {}).items():
        kinds = kind if isinstance(kind, tuple) else (kind,)
        found = value.get(name)
        if not isinstance(found, kinds) or (isinstance(found, bool) and
                                            bool not in kinds):
          problem = (f"its {name!r} is {str(found)[:40]!r}, not "
                     f"{' or '.join(k.__name__ for k in kinds)}")
          break
    if problem:
      raise ValueError(problem)
  except RecursionError:
    raise ValueError("is not a readable JSON object (nested too deeply)"
                     ) from None
  except ValueError as e:  # UnicodeDecodeError and JSONDecodeError too
    reason = (str(e).splitlines() or [""])[0][:100]
    raise ValueError(f"is not a readable JSON object ({reason})") from None
  return value


def read_json(path, fields=None):
  """The JSON object at `path`: None when absent, {} when unreadable (or
  of another shape: see `load_json`)."""
  if not tf.io.gfile.exists(path):
    return None
  try:
    return load_json(path, fields)
  except ValueError:
    return {}


def check_folder_path(folder, name):
  """Raises unless a folder can be at `folder`: it is no file, and lies
  under none (which would give a deep NotADirectoryError later).

  Args:
    folder: a normalized local path or URL.
    name: the flag that set it, e.g. "--export_dir", for the message.

  Raises:
    ValueError: naming the path and the file in the way.
  """
  blocker = paths.file_above(folder)
  where = ("is a file, not a directory; pick a new directory"
           if blocker == folder else
           f"lies under the file {blocker}; pick a directory path")
  if blocker is not None:
    raise ValueError(f"{name}={folder} {where}. Received: "
                     f"{name.lstrip('-')}={folder!r}")


def read_marker(folder, marker):
  """The marker file `marker` of `folder` as a dict, or None (absent or
  unreadable: no marker of ours)."""
  return read_json(paths.join(os.fspath(folder), marker)) or None


def names(marker, **fields):
  """True if the marker dict `marker` holds every one of `fields`.

  A field asked for as None never matches: an owner not known yet owns
  nothing.
  """
  return marker is not None and all(
      value is not None and marker.get(key) == value
      for key, value in fields.items())


def create_marker(folder, marker, fields):
  """Writes a new marker file; False if one appeared there meanwhile.

  Args:
    folder: the folder (made if missing).
    marker: the marker's file name.
    fields: the JSON-serializable dict it holds.
  """
  tf.io.gfile.makedirs(folder)
  try:
    paths.write_atomic(paths.join(folder, marker),
                       json.dumps(fields, indent=2, sort_keys=True),
                       overwrite=False)
  except tf.errors.AlreadyExistsError:
    return False
  return True


def entries(folder):
  """Every file and folder under `folder`, as sorted relative paths."""
  found = []
  for root, dirs, files in tf.io.gfile.walk(folder):
    rel = root[len(folder):].strip("/")
    found.extend(paths.join(rel, name.rstrip("/")) if rel else
                 name.rstrip("/") for name in list(dirs) + list(files))
  return sorted(found)


def foreign_entries(folder, ours, recursive=False):
  """What `folder` holds that its owner did not write, sorted.

  Args:
    folder: an existing folder.
    ours: ours(relative_path) is True for an entry the owner writes.
    recursive: look at every entry below `folder`, not only its own.
  """
  found = (entries(folder) if recursive else
           [name.rstrip("/") for name in tf.io.gfile.listdir(folder)])
  return sorted(name for name in found if not ours(name))


def check_contained(root, path, received=None):
  """Raises unless deleting or replacing `path` touches nothing outside
  `root`: the project's one rule for every delete, rename and overwrite.

  `path` must be `root` or lie below it once normalized ("../" leaves
  it), no component from `root` down to `path` may be a symbolic link, and
  neither may anything inside `path`. `root` itself may be a link: the
  user named it. URLs (gs://, ram://) have no links.

  Args:
    root: the owned folder (a run, an export's parent, a study's out_dir).
    path: the entry about to be deleted, renamed or overwritten.
    received: the message's closing "Received: name=value" (default: the
      path).

  Raises:
    ValueError: naming the entry, before anything is changed.
  """
  root, path = paths.normalize(root), paths.normalize(path)
  received = received or f"Received: path={path!r}"
  if not paths.is_within(path, root):
    raise ValueError(
        f"{path} lies outside {root}, the folder we own; nothing "
        f"was deleted or replaced: it is not ours to change. {received}")
  link = paths.first_link(root, path) or paths.link_inside(path)
  if link is not None:
    raise ValueError(
        f"{link} is a symbolic link (to {os.readlink(link)}) inside {root}, "
        f"the folder we own; nothing was deleted or replaced: a "
        f"delete would follow it out of the folder, so replace the link "
        f"with a folder of its own or move it away. {received}")


def remove(root, path):
  """Deletes the file or folder `path` of the owned folder `root`, once
  `check_contained` allowed it; a missing `path` is no error."""
  check_contained(root, path)
  if tf.io.gfile.isdir(path):
    tf.io.gfile.rmtree(path)
  elif tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)


def move(root, src, dst, last=None):
  """`paths.move_dir(src, dst)` of two entries of the owned folder `root`,
  once `check_contained` allowed both."""
  check_contained(root, src)
  check_contained(root, dst)
  paths.move_dir(src, dst, last=last)


def clear(folder, keep=()):
  """Deletes every entry of `folder` but those named in `keep`; nothing
  when one of them is refused by `check_contained`."""
  doomed = [paths.join(folder, entry.rstrip("/"))
            for entry in tf.io.gfile.listdir(folder)
            if entry.rstrip("/") not in keep]
  for path in [folder] + doomed:  # all checked before the first delete
    check_contained(folder, path)
  for path in doomed:
    remove(folder, path)


def remove_marked(folder, marker, root=None):
  """Deletes an owned folder, its marker last: a deletion killed midway
  leaves the marker, by which the owner knows the rest as its own.

  Args:
    folder: the folder to delete.
    marker: its marker's file name.
    root: the owned folder it lies in (default: its parent).
  """
  check_contained(root or paths.parent(folder), folder)
  clear(folder, keep=(marker,))
  remove(folder, paths.join(folder, marker))
  remove(root or paths.parent(folder), folder)
