"""One error boundary for every binary: an expected fault is one line.

  @error_boundary.guard(interrupted="rerun to resume")
  def main(argv):
    ...

  if __name__ == "__main__":
    app.run(main)

Every binary's `main` is decorated with `guard`. Before `main` runs, it
refuses a stray positional argument, a list flag with an empty entry and
a numeric flag outside the bounds its help states (`train.flag_bounds`).
A fault the user can act on (a bad value, a missing or unwritable file, a full disk, a TF I/O
error, a stopped run, Ctrl-C, SIGTERM or SIGHUP) becomes
`error: <one line>` on stderr and exit status 1, never a traceback.
Anything else is a bug and keeps its traceback. Before main, every text
flag is checked (train/path_flags.py), and a binary's stdout and stderr
are wrapped so that a closed reader stops its lines, not its work
(train/closed_streams.py).

SIGTERM and SIGHUP (a closed terminal; see train/stop_signals.py) are
turned into an exception (`Terminated`) for the whole process, so that
they unwind like Ctrl-C: every `finally` runs, which releases the
run lock and removes an export's temporary folder. The training loop's own
handler (`train.actions.Preemption`) replaces it while the loop runs and
saves a checkpoint first. Python delivers a signal between two bytecodes:
inside one long TF C++ call (a graph optimizer pass) it waits for that call
to return, which is why `train.config` refuses networks whose graphs would
keep TF busy for minutes (see `config.MAX_MODULES`).

A signal that lands while TF's C++ is turning a status into a Python
exception (`tf.io.gfile.exists` on a missing path raises NotFoundError
inside pybind11) reaches us as pybind11's RuntimeError "MISMATCH of
original and normalized active exception types: ORIGINAL NotFoundError
REPLACED BY KeyboardInterrupt": `signal_in` reads the signal back out of
it, so that it is still the signal's one line.

A signal TF's C++ holds up for longer than a few seconds is the
watchdog's (train/stop_watchdog.py): it prints the line and kills the
process.

`guard(hard_exit=True)` (train.worker) leaves with `os._exit` once the
line is printed: the threads of TF's gRPC server can hold up a normal exit
of the interpreter for good.
"""

import errno
import functools
import os
import re
import signal
import sys
import traceback

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from tf_interlock import op_errors
from train import actions
from train import closed_streams
from train import flag_bounds
from train import path_flags
from train import python_private
from train import stop_signals
from train import stop_watchdog

# A longer line is cut in its middle: TF's statuses can run to many kB, while
# our own lines name up to four paths (a Bazel sandbox's run ~200 chars each)
# and end with what to do, so the head and the tail are both kept.
_MAX_CHARS = 2000
_TAIL_CHARS = 500
# A word (no blank) longer than this is shortened to its two ends first.
_LONG_WORD = re.compile(r"\S{300,}")
_WORD_KEEP = 100


class Terminated(BaseException):
  """SIGTERM or SIGHUP arrived; unwinds like KeyboardInterrupt (not an
  Exception)."""

  def __init__(self, signum):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


# The last terminating signal raised as `Terminated` (for `signal_in`).
_RAISED = [signal.SIGTERM]


def _raise_terminated(signum, frame):
  del frame
  _RAISED[0] = signum
  # A second SIGTERM while cleaning up must not cut the cleanup short.
  for each in stop_signals.TERMINATING:
    signal.signal(each, signal.SIG_IGN)
  raise Terminated(signum)


def first_line(text):
  """The first line of `text` that says what went wrong, cut to a readable
  length: in TF's "Graph execution error:" text, the kernel's own message
  after the traces of the nodes it names (`op_errors.kernel_message`)."""
  line = op_errors.kernel_message(text)
  if len(line) <= _MAX_CHARS:
    return line
  # Long words first (paths near PATH_MAX): their middles go, so that the
  # reason between them stays in the line.
  line = _LONG_WORD.sub(
      lambda m: f"{m.group()[:_WORD_KEEP]}...{m.group()[-_WORD_KEEP:]}", line)
  if len(line) <= _MAX_CHARS:
    return line
  return (line[:_MAX_CHARS - _TAIL_CHARS - 5] + " ... " +
          line[-_TAIL_CHARS:])


def _os_error_line(e):
  """An OSError as `what: path` (its text without the errno prefix)."""
  what = e.strerror or type(e).__name__
  hints = {errno.ENOSPC: "free space and rerun",
           errno.EDQUOT: "free space and rerun",
           errno.EROFS: "the file system is read-only",
           errno.EBUSY: "it is in use (a mount point?); pick another path",
           errno.ENAMETOOLONG: "shorten the path",
           errno.ELOOP: "a symlink loop; fix the link",
           errno.EACCES: "check its permissions",
           errno.EPERM: "check its permissions (immutable?)"}
  where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f)
  hint = hints.get(e.errno)
  return f"{what}: {where or '(no path)'}" + (f" ({hint})" if hint else "")


def _cwd_gone():
  """Whether this process's working directory was removed."""
  try:
    os.getcwd()
    return False
  except FileNotFoundError:
    return True


# pybind11's text when a signal's exception replaced the one a C++ call
# was raising (its error_already_set, "MISMATCH ... REPLACED BY <type>").
_REPLACED_BY = re.compile(
    r"REPLACED BY (?:[\w.]+\.)?(KeyboardInterrupt|Terminated)\b")


def signal_in(e):
  """"SIGINT", "SIGTERM" or "SIGHUP" when `e` is pybind11's RuntimeError
  for a signal's exception (KeyboardInterrupt or `Terminated`) that
  replaced the one a TF C++ call was raising, else None."""
  if not isinstance(e, RuntimeError):
    return None
  found = _REPLACED_BY.search(str(e))
  if not found:
    return None
  if found.group(1) == "KeyboardInterrupt":
    return "SIGINT"
  return stop_signals.name(_RAISED[0])


def describe(e):
  """The one line that reports expected fault `e`, or None for a bug.

  Args:
    e: the exception that left `main`.

  Returns:
    The text after "error: ", or None when `e` should keep its traceback.
  """
  if isinstance(e, tf.errors.OpError):
    # TF's status texts carry the path; drop its multi-line context.
    line = f"{type(e).__name__}: {first_line(e.message)}"
    if isinstance(e, tf.errors.ResourceExhaustedError) and (
        "No space left" in line or "space" in line.lower()):
      line += (" (the disk is full: free space and rerun; checkpoints "
               "written before are intact and the rerun resumes from the "
               "latest)")
    if "Too many levels of symbolic links" in line:
      line += " (a symlink loop: fix the link or pick another folder)"
    return line
  if isinstance(e, OSError) and e.strerror:
    if not e.filename and e.errno == errno.ENOENT and _cwd_gone():
      return ("the working directory no longer exists (it was deleted or "
              "moved while this binary ran or before it started), and "
              "relative paths are read from it: cd to an existing folder, "
              "or give absolute paths, and rerun")
    return _os_error_line(e)
  if isinstance(e, (ValueError, OSError, actions.TrainingError)):
    return first_line(e)
  return None


def empty_list_entry():
  """The line refusing a list flag given with an empty entry
  (--strategies=e2e,,local), or None. absl keeps the empty string as an
  entry, which a binary would otherwise drop or misread in silence."""
  for name in flags.FLAGS:
    flag = flags.FLAGS[name]
    if (flag.present and isinstance(flag.parser, flags.ListParser) and
        any(not str(entry).strip() for entry in flag.value or ())):
      text = ",".join(flag.value)
      return (f"--{name}={text!r} has an empty entry: give one value "
              f"between each two commas. Received: {name}={text!r}")
  return None


def guard(interrupted="nothing was left half-written", hard_exit=False):
  """Decorates a binary's `main(argv)` with the boundary (for `app.run`).

    @error_boundary.guard(interrupted="rerun to resume")
    def main(argv):
      ...

  Args:
    interrupted: what an interrupted run leaves, for the signal's line
      (e.g. "rerun to resume from the latest checkpoint").
    hard_exit: leave with `os._exit(1)` right after the line (a bug: after
      its traceback), not `sys.exit(1)`; for a process whose TF threads
      (a gRPC server's) would hold up the interpreter's exit.

  Returns:
    The decorator.
  """

  def decorate(main):

    @functools.wraps(main)
    def guarded(argv):
      previous = {s: signal.signal(s, _raise_terminated)
                  for s in stop_signals.TERMINATING}
      previous_int = signal.getsignal(signal.SIGINT)
      if previous_int is not signal.default_int_handler and (
          main.__module__ == "__main__"):  # runtime_env's start-up handler
        signal.signal(signal.SIGINT, signal.default_int_handler)
      # Stops this process within seconds of a signal even when TF's C++
      # holds the handler up (see train/stop_watchdog.py).
      # Only for a binary's own main (not a main called inside a test).
      if main.__module__ == "__main__":
        stop_watchdog.start(interrupted)
        # A closed stdout (`| head -1`) or terminal stops the lines, not
        # the run (train/closed_streams.py).
        closed_streams.install()
      try:
        flag_line = path_flags.problem_in_flags()
        if flag_line:
          _fail(flag_line)
        if len(argv) > 1:  # before main: a stray word must not start a run
          _fail(f"Unexpected arguments: {argv[1:]}: this binary takes no "
                f"positional arguments, only --name=value flags (see "
                f"--helpshort). Received: arguments={argv[1:]!r}")
        empty = empty_list_entry() or flag_bounds.out_of_bounds()
        if empty:
          _fail(empty)
        return main(argv)
      except app.UsageError as e:  # absl would print its whole usage text
        _fail(str(e))
      except KeyboardInterrupt:
        _fail(f"interrupted (SIGINT); {interrupted}", _STOPPED)
      except Terminated as e:
        _fail(f"stopped ({e}); {interrupted}", _STOPPED)
      except Exception as e:  # pylint: disable=broad-except
        signum = signal_in(e)
        if signum == "SIGINT":
          _fail(f"interrupted (SIGINT); {interrupted}", _STOPPED)
        if signum:
          _fail(f"stopped ({signum}); {interrupted}", _STOPPED)
        line = describe(e)
        if isinstance(e, actions.TrainingError) and str(e).startswith(
            tuple(f"{stop_signals.name(signum)} at step "
                  for signum in stop_signals.STOPPING)):
          _fail(line, _STOPPED)  # the training loop saved and stopped
        if line is None:
          if not hard_exit:
            raise
          traceback.print_exc()  # a bug keeps its traceback
          _leave(1)
        _fail(line, hard_exit)
      finally:
        for signum, handler in previous.items():
          signal.signal(signum, handler)

    return guarded

  return decorate


# `_fail`'s mode after a signal: the `finally` blocks have run (lock
# released, temporary folders removed), the atexit functions run, then the
# process leaves at once: tearing down TF's objects can take longer than
# the few seconds a stopped binary has (train/stop_watchdog.py).
_STOPPED = "stopped"


def _fail(line, hard_exit=False):
  """Prints the line and exits 1, quietly: the objects freed at exit (a
  checkpoint whose restore failed, say) would log warnings about what the
  error already said. With `hard_exit`, at once (`os._exit`); with
  `_STOPPED`, after the atexit functions."""
  sys.stdout.flush()
  stop_watchdog.note(said=True)  # the watchdog adds no line of its own
  print(f"error: {line}", file=sys.stderr, flush=True)
  if hard_exit == _STOPPED:
    if not stop_watchdog.running():
      # A main called inside another program (a test): leave it by
      # SystemExit, as any other fault; only a binary leaves at once.
      hard_exit = False
    else:
      python_private.run_exit_functions()
  if hard_exit:
    _leave(1)
  logging.set_verbosity(logging.ERROR)
  tf.get_logger().setLevel("ERROR")
  sys.exit(1)


def _leave(code):
  """Exits with `code` now, without waiting for other threads (TF's)."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access
