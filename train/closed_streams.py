"""A closed stdout or stderr stops a binary's lines, never its work.

`python -m train.train ... | head -1` closes the pipe after one line; a
closed terminal or ssh session (SIGHUP) leaves a tty whose writes fail
with EIO. Python ignores SIGPIPE, so the next `print` raises
BrokenPipeError: before `install`, that killed a training run between two
checkpoints with "error: Broken pipe: (no path)", losing the steps since
the last one.

`install` (the error boundary calls it for every binary) wraps
`sys.stdout` and `sys.stderr`: the first write that fails because the
reader is gone points the stream's file descriptor at /dev/null (so that
no later write, of Python or of TF's C++, fails again, nor the flush at
exit), says so once on the other stream when that one still works, and
the binary goes on: training keeps training and checkpointing, and its
record stays in the run folder (checkpoints, TensorBoard summaries,
config.json). Any other write error (a full disk behind a redirect) is
raised as before.
"""

import errno
import os
import sys

# A reader that is gone: a closed pipe, a hung-up tty, a reset socket.
_GONE = (errno.EPIPE, errno.EIO, errno.ENXIO, errno.ECONNRESET)


class _Stream:
  """A text stream whose writes stop, silently, once its reader is gone."""

  def __init__(self, stream, label):
    self._stream = stream
    self._label = label
    self.gone = None  # the OSError that closed it

  def original(self):
    """The stream this one wraps."""
    return self._stream

  def _closed(self, error):
    self.gone = error
    try:
      fd = self._stream.fileno()
      null = os.open(os.devnull, os.O_WRONLY)
      os.dup2(null, fd)
      os.close(null)
    except (OSError, ValueError, AttributeError):
      pass  # no fd (a test's capture): the writes are dropped here
    _note(self._label, error)

  def write(self, text):
    if self.gone is None:
      try:
        return self._stream.write(text)
      except OSError as e:
        if e.errno not in _GONE:
          raise
        self._closed(e)
    return len(text)

  def flush(self):
    if self.gone is None:
      try:
        self._stream.flush()
      except OSError as e:
        if e.errno not in _GONE:
          raise
        self._closed(e)
      return
    try:  # what was buffered before now goes to /dev/null
      self._stream.flush()
    except OSError:
      pass

  def writelines(self, lines):
    for line in lines:
      self.write(line)

  def __getattr__(self, name):
    return getattr(self._stream, name)


def _note(label, error):
  """One line on the other stream, when it still works."""
  other = sys.stderr if label == "stdout" else None
  if not isinstance(other, _Stream) or other.gone is not None:
    return
  reason = error.strerror or errno.errorcode.get(error.errno, "closed")
  other.write(
      f"note: {label} was closed ({reason}: its reader, a pipe such as "
      f"`| head` or a terminal, is gone); this binary goes on without "
      f"printing there, and a training run keeps writing its checkpoints "
      f"and TensorBoard summaries to its --model_dir\n")
  other.flush()


def install():
  """Wraps sys.stdout and sys.stderr (once; see the module docstring)."""
  for label in ("stdout", "stderr"):
    stream = getattr(sys, label)
    if stream is not None and not isinstance(stream, _Stream):
      setattr(sys, label, _Stream(stream, label))


def uninstall():
  """Puts the original streams back (for a main called inside a test)."""
  for label in ("stdout", "stderr"):
    stream = getattr(sys, label)
    if isinstance(stream, _Stream):
      setattr(sys, label, stream.original())
