"""The files a user names on a command line: one reader, one writer.

A research tool reads a report or a trace (`--report`, `--measured`, a
run's `.xplane.pb`) and writes a picture or a report (`--png`,
`--json_out`, `--out`, `--out_prefix`'s files). Every such path goes
through this module, so every tool holds the same rules:

Writing (`check_output` before any work, `write_output` at the end):
  * the path is a file path: not an existing folder (`--png=DIR` once
    wrote `DIR.png` beside it), not a FIFO, socket or device;
  * no symbolic link: the path itself is `lstat`ed, never followed (a link
    to a file outside would have that file overwritten). The folder above
    is the user's choice, link or not, as a run folder's root is
    (`paths.first_link`);
  * its folder exists, is a folder, and lies under no file;
  * not in this process's memory (ram://), which is lost at exit
    (`run_dir.check_lasting`);
  * the bytes go to a temporary sibling, then one rename puts them in place
    (`paths.write_atomic`): a failure leaves the old file or none, never a
    half one; the rename replaces a link planted meanwhile, never follows it.

Reading (`read_input`, `read_json`):
  * a regular file only: a FIFO (whose read blocks forever), a device, a
    socket or a folder is refused unread;
  * at most `max_bytes` (a report is kB, a trace MB): a larger file is
    refused unread;
  * JSON through the run files' parser (`owned_dir.parse_json`): an object,
    nested at most `owned_dir.MAX_JSON_DEPTH` levels.

Each refusal is one line naming the flag and the path, ending with
"Received: flag='path'" (a ValueError, which `error_boundary.guard` prints).
"""

import os
import stat

import tensorflow as tf

from train import owned_dir
from train import paths
from train import run_dir

# A research report is kB and a profiler trace a few MB; anything far
# larger is not what the flag names (or would take minutes to parse).
MAX_JSON_BYTES = 64 << 20
MAX_TRACE_BYTES = 1 << 30

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISLNK, "a symbolic link"))


def _received(flag, path):
  return f"Received: {flag.lstrip('-')}={os.fspath(path)!r}"


def _kind(mode):
  """"a FIFO", "a directory", ... for an `lstat` mode; None: a file."""
  for test, kind in _KINDS:
    if test(mode):
      return kind
  return None


def check_output(path, flag):
  """Raises unless `path` can take a new file written by `write_output`.

  Args:
    path: local path or URL given by the user.
    flag: the flag that named it, e.g. "--png", for the message.

  Raises:
    ValueError: one line naming the flag, the path and what to give.
  """
  path = os.fspath(path or "")
  if not path.strip():
    raise ValueError(f"{flag} needs a file path. {_received(flag, path)}")
  run_dir.check_lasting(path, flag)
  if paths.is_url(path):
    if tf.io.gfile.isdir(path):
      raise ValueError(f"{flag}={path} is a directory; give a file path "
                       f"(e.g. {paths.join(path, 'out')}). "
                       f"{_received(flag, path)}")
    return
  try:
    mode = os.lstat(path).st_mode
  except (FileNotFoundError, NotADirectoryError):
    mode = None  # the folder's check below says which
  except OSError as e:
    raise ValueError(f"{flag}={path} cannot be looked at ({e.strerror}); "
                     f"give a file path in a folder you may write. "
                     f"{_received(flag, path)}") from None
  kind = None if mode is None else _kind(mode)
  if kind == "a directory":
    raise ValueError(f"{flag}={path} is a directory; give a file path "
                     f"(e.g. {os.path.join(path, 'out')}). "
                     f"{_received(flag, path)}")
  if kind == "a symbolic link":
    raise ValueError(f"{flag}={path} is a symbolic link (to "
                     f"{os.readlink(path)}): its target would be "
                     f"overwritten; nothing was written: give the file's "
                     f"own path. {_received(flag, path)}")
  if kind is not None:
    raise ValueError(f"{flag}={path} is not a regular file ({kind}, which "
                     f"would block or take the output); give a file path. "
                     f"{_received(flag, path)}")
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    blocker = paths.file_above(folder)
    why = (f"lies under the file {blocker}" if blocker else
           "does not exist; create it first")
    raise ValueError(f"{flag}={path}: its folder {folder} {why}. "
                     f"{_received(flag, path)}")


def write_output(path, data, flag):
  """Writes `data` (bytes or str) to `path` at once, after `check_output`
  again (the tool may have run for minutes since its first check)."""
  check_output(path, flag)
  paths.write_atomic(os.fspath(path), data)


def read_input(path, flag, max_bytes=MAX_JSON_BYTES):
  """The bytes of the regular file `path`, or a one-line ValueError.

  Args:
    path: local path or URL.
    flag: the flag that named it (or a description such as "the trace").
    max_bytes: larger files are refused unread.
  """
  path = os.fspath(path or "")
  where = f"{flag}={path}"
  if not path.strip():
    raise ValueError(f"{flag} needs a file path. {_received(flag, path)}")
  if not paths.is_url(path):
    try:
      info = os.stat(path)  # the target of a link: reading follows it
    except OSError as e:
      raise ValueError(f"{where} cannot be read ({e.strerror}). "
                       f"{_received(flag, path)}") from None
    kind = _kind(info.st_mode)
    if kind is not None:
      raise ValueError(f"{where} is {kind}, not a regular file; nothing was "
                       f"read. {_received(flag, path)}")
    size = info.st_size
  else:
    try:
      size = tf.io.gfile.stat(path).length
    except tf.errors.OpError as e:
      reason = (str(e).splitlines() or [""])[0][:100]
      raise ValueError(f"{where} cannot be read ({reason}). "
                       f"{_received(flag, path)}") from None
  if size > max_bytes:
    raise ValueError(f"{where} holds {size} bytes, more than the "
                     f"{max_bytes} such a file may have; nothing was read. "
                     f"{_received(flag, path)}")
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      data = f.read(max_bytes + 1)
  except tf.errors.OpError as e:
    reason = (str(e).splitlines() or [""])[0][:100]
    raise ValueError(f"{where} cannot be read ({reason}). "
                     f"{_received(flag, path)}") from None
  if len(data) > max_bytes:  # grew since it was looked at
    raise ValueError(f"{where} holds more than {max_bytes} bytes. "
                     f"{_received(flag, path)}")
  return data


def read_json(path, flag, fields=None, max_bytes=MAX_JSON_BYTES):
  """The JSON object in the file `path` (`read_input`, then the run files'
  checks: an object, nested at most 32 levels, holding `fields`)."""
  data = read_input(path, flag, max_bytes)
  try:
    return owned_dir.parse_json(data, fields)
  except ValueError as e:
    raise ValueError(f"{flag}={os.fspath(path)} {e}. "
                     f"{_received(flag, path)}") from None
