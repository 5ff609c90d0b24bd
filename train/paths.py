"""Path helpers over `tf.io.gfile`: local folders and URLs (gs://, ram://).

`os.path.abspath("gs://b/x")` turns a URL into a local relative folder, and
`os.rename` or `shutil` do not speak remote file systems; every function here
works on both kinds of path.
"""

import os
import posixpath
import stat
import uuid

import tensorflow as tf


def is_url(path):
  """True for paths with a scheme such as gs:// or ram://."""
  return "://" in path


def normalize(path):
  """A canonical spelling of `path` for comparisons (not for a URL's host).

  Args:
    path: a local path (made absolute) or a URL (its path part normalized).

  Returns:
    The normalized path, without a trailing separator.
  """
  path = os.fspath(path)
  if not is_url(path):
    return os.path.abspath(path)
  scheme, rest = path.split("://", 1)
  rest = posixpath.normpath("/" + rest).lstrip("/") if rest else rest
  return f"{scheme}://{rest}"


def is_within(path, root):
  """True if `path` is `root` or lies below it (both normalized)."""
  path, root = normalize(path), normalize(root)
  return path == root or path.startswith(root.rstrip("/") + "/")


def join(*parts):
  return posixpath.join(*parts) if is_url(parts[0]) else os.path.join(*parts)


def parent(path):
  path = normalize(path)
  if is_url(path):
    scheme, rest = path.split("://", 1)
    return f"{scheme}://{posixpath.dirname(rest)}"
  return os.path.dirname(path)


def basename(path):
  return posixpath.basename(normalize(path))


def file_above(path):
  """The nearest existing ancestor of `path` (or itself) that is a file.

  A path under a file cannot be created; finding it early turns a deep
  `NotADirectoryError` traceback into a one-line error.

  Args:
    path: local path or URL.

  Returns:
    That file's path, or None.
  """
  current = normalize(path)
  while True:
    if tf.io.gfile.exists(current):
      return None if tf.io.gfile.isdir(current) else current
    up = parent(current)
    if up == current or up.endswith("://"):
      return None
    current = up


def special_kind(path):
  """What `path` is when it is neither a regular file nor missing, or None.

  Opening a FIFO blocks until someone writes to it, and a device or socket
  is no file of ours: readers call this first, so that a run directory
  with such an entry gets a one-line error instead of a hang. URLs (object
  stores) hold only regular objects.

  Args:
    path: local path or URL.

  Returns:
    "a FIFO", "a socket", "a character device", "a block device",
    "a directory", or None.
  """
  if is_url(path):
    return None
  try:
    mode = os.stat(path).st_mode
  except OSError:
    return None  # missing or unreadable: the reader reports it
  for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                     (stat.S_ISCHR, "a character device"),
                     (stat.S_ISBLK, "a block device"),
                     (stat.S_ISDIR, "a directory")):
    if test(mode):
      return kind
  return None


def first_link(root, path):
  """The first symbolic link met going from `root` down to `path`, or None.

  `root` itself is not looked at (the user chose it, link or not); each
  component below it, `path` included, is `lstat`ed, never followed. URLs
  have no links: None.

  Args:
    root: a folder (local path or URL).
    path: `root` or a path below it (both normalized here).
  """
  root, path = normalize(root), normalize(path)
  if is_url(path) or path == root:
    return None
  current = root
  for part in os.path.relpath(path, root).split(os.sep):
    current = os.path.join(current, part)
    if os.path.islink(current):
      return current
  return None


def link_inside(path):
  """A symbolic link found inside the folder `path` (never followed), or
  None: what a recursive delete of `path` would follow out of it."""
  if is_url(path) or not os.path.isdir(path) or os.path.islink(path):
    return None
  for top, dirs, files in os.walk(path):  # os.walk does not follow links
    for name in sorted(dirs + files):
      if os.path.islink(os.path.join(top, name)):
        return os.path.join(top, name)
  return None


def copy_tree(src, dst, last=None):
  """Copies directory `src` to a new `dst`, file by file, through gfile.

  Args:
    src: existing directory.
    dst: directory to create (must not exist).
    last: name of a top-level file of `src` copied after all the others, so
      that its presence in `dst` means the copy is complete.
  """
  tf.io.gfile.makedirs(dst)
  deferred = None
  for root, dirs, files in tf.io.gfile.walk(src):
    rel = root[len(src):].lstrip("/")
    target = join(dst, rel) if rel else dst
    for name in dirs:
      tf.io.gfile.makedirs(join(target, name))
    for name in files:
      if not rel and name == last:
        deferred = (join(root, name), join(target, name))
        continue
      tf.io.gfile.copy(join(root, name), join(target, name))
  if deferred:
    tf.io.gfile.copy(*deferred)


def write_atomic(path, text, overwrite=True):
  """Writes `text` to `path` so that a reader sees the old file or the new.

  The text goes to a temporary sibling of our own, then one rename puts it
  in place; an interrupted write leaves at most that temporary file, never a
  partial `path`. The temporary name is a prefix (`.tmp-<id>-<name>`), not a
  suffix: TF's ram:// reports "x" as existing while "x.anything" does.

  Args:
    path: the file to write (local path or URL).
    text: its new contents (str).
    overwrite: False refuses to replace an existing `path`.

  Raises:
    tf.errors.AlreadyExistsError: `path` exists and overwrite is False (the
      temporary file is removed first).
  """
  tmp = join(parent(path), f".tmp-{uuid.uuid4().hex[:8]}-{basename(path)}")
  try:
    with tf.io.gfile.GFile(tmp, "w") as f:
      f.write(text)
  except BaseException:  # a full disk, a signal: no partial file stays
    if tf.io.gfile.exists(tmp):
      tf.io.gfile.remove(tmp)
    raise
  try:
    tf.io.gfile.rename(tmp, path, overwrite=overwrite)
  except tf.errors.AlreadyExistsError:
    tf.io.gfile.remove(tmp)
    raise


def move_dir(src, dst, last=None):
  """Moves directory `src` to the new path `dst`.

  On a local disk this is one atomic rename. Object stores have no directory
  rename (and TF's ram:// renames only the directory entry, not its files),
  so there the files are copied, `last` at the end, then `src` is deleted.

  Args:
    src: existing directory.
    dst: path that must not exist (locally: or be an empty folder).
    last: see `copy_tree`.

  Raises:
    OSError: locally, `dst` is a file or a non-empty folder.
  """
  if not is_url(src):
    # rename(2) itself, not TF's exists-then-rename: it fails (OSError)
    # when `dst` is a non-empty folder, atomically, so a folder another
    # process filled meanwhile is never replaced; an empty one is.
    os.rename(src, dst)
    return
  copy_tree(src, dst, last=last)
  tf.io.gfile.rmtree(src)
