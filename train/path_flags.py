"""What a binary's text flags may hold, checked for every binary at once.

The error boundary (`error_boundary.guard`) runs `problem_in_flags` before
a binary's main, so that each of these is one line naming the flag before
anything is written:

* A control character (a newline, a tab, an escape: a pasted line or a
  script's variable) in any text flag. A path with a newline was made as
  given, then printed, logged and read back cut at the newline.
* Text that is not UTF-8: bytes the locale could not decode reach Python
  as surrogates (`os.fsdecode`'s surrogateescape), which TensorFlow's
  C++ cannot take ("'utf-8' codec can't encode character '\\udcff'"). The
  same happens to `rün` under LC_ALL=C when Python is not in UTF-8 mode.
* A path flag longer than the file system allows (ENAMETOOLONG): a name
  over NAME_MAX bytes or a path over PATH_MAX. Without the check the fault
  came from the first file the run wrote, named after that file.
"""

import os
import sys

from absl import flags

# Flags that name files or folders, by name: every binary's.
_PATH_NAMES = frozenset((
    "checkpoint", "saved_model", "png", "report", "out", "measured",
    "profile", "repredict", "data"))
_PATH_ENDINGS = ("_dir", "_out", "_from", "_prefix", "_path", "_file")
# Fallbacks where pathconf cannot say (Linux's values).
_NAME_MAX, _PATH_MAX = 255, 4096


def is_path_flag(name):
  """Whether flag `name` names a file or folder."""
  return name in _PATH_NAMES or name.endswith(_PATH_ENDINGS)


def _shown(value):
  """`value`'s repr, its middle cut when long (a line stays readable)."""
  text = ascii(value) if any("\udc80" <= c <= "\udcff" for c in value) else (
      repr(value))
  return text if len(text) <= 240 else f"{text[:120]}...{text[-100:]}"


def _limits(path):
  """(NAME_MAX, PATH_MAX) of the file system holding `path`'s nearest
  existing folder."""
  folder = path
  while folder and not os.path.isdir(folder):
    up = os.path.dirname(folder)
    if up == folder:
      break
    folder = up
  try:
    return (os.pathconf(folder or "/", "PC_NAME_MAX"),
            os.pathconf(folder or "/", "PC_PATH_MAX"))
  except (OSError, ValueError):
    return _NAME_MAX, _PATH_MAX


def _too_long(name, value):
  if "://" in value:
    return None  # a URL: its service's limits
  data = os.fsencode(value)
  name_max, path_max = _limits(value if os.path.isabs(value) else ".")
  longest = max(data.split(b"/"), key=len)
  if len(longest) > name_max:
    what = (f"its part {_shown(os.fsdecode(longest[:40]))}... is "
            f"{len(longest)} bytes, over the file system's limit of "
            f"{name_max} for one name")
  elif len(data) >= path_max:
    what = (f"it is {len(data)} bytes, over the file system's limit of "
            f"{path_max - 1} for a whole path")
  else:
    return None
  return (f"--{name} is too long: {what} (File name too long, "
          f"ENAMETOOLONG); nothing was written: pick a shorter path. "
          f"Received: {name}={_shown(value)}")


def problem(name, value):
  """The line refusing text flag `name`'s `value`, or None.

  Args:
    name: the flag's name, without dashes.
    value: its text (one entry of a list flag).

  Returns:
    One line ending with "Received: name=<repr>", or None.
  """
  undecoded = sorted({c for c in value if "\udc80" <= c <= "\udcff"})
  if undecoded:
    raw = bytes(ord(c) - 0xDC00 for c in undecoded)
    try:
      os.fsencode(value).decode("utf-8")
      why = (f"it is UTF-8, but this process's locale could not decode it "
             f"(file system encoding {sys.getfilesystemencoding()}): run "
             f"under a UTF-8 locale (LC_ALL=C.UTF-8) or with PYTHONUTF8=1")
    except UnicodeDecodeError:
      why = (f"it holds bytes {raw!r} that are not UTF-8, which TensorFlow "
             f"reads every path and name as: use UTF-8 characters only")
    return (f"--{name} is not readable text: {why}; nothing was written. "
            f"Received: {name}={_shown(value)}")
  control = next((c for c in value if ord(c) < 32 or ord(c) == 127), None)
  if control is not None:
    return (f"--{name} contains the control character {control!r} (a "
            f"newline, tab or escape, e.g. from a pasted line): a name "
            f"holding one is cut or misread wherever it is printed, logged "
            f"or read back; nothing was written: remove it. "
            f"Received: {name}={_shown(value)}")
  if is_path_flag(name):
    return _too_long(name, value)
  return None


def problem_in_flags(flag_values=None):
  """The line refusing the first bad text flag given, or None.

  Args:
    flag_values: absl's FlagValues; default: `flags.FLAGS`.
  """
  flag_values = flags.FLAGS if flag_values is None else flag_values
  for name in flag_values:
    flag = flag_values[name]
    if not flag.present:
      continue
    value = flag.value
    for entry in value if isinstance(value, (list, tuple)) else [value]:
      if isinstance(entry, str):
        line = problem(name, entry)
        if line:
          return line
  return None
