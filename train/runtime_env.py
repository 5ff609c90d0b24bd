"""Process settings every binary needs before TensorFlow loads: import first.

  from train import runtime_env  # pylint: disable=unused-import  (first!)

Quiet by default: a run prints its progress lines, warnings that matter and
errors. TensorFlow's C++ INFO and WARNING lines (TF_CPP_MIN_LOG_LEVEL=2), the
lines it prints while its libraries load, absl INFO lines (checkpoint
"sharding callback", TFDS preparation) and TFDS progress bars are left out.
absl's own `--verbosity` flag (or `-v`) at 0 or more brings all of them
back; an explicit TF_CPP_MIN_LOG_LEVEL in the environment is kept. The flag
is read from sys.argv here, since the C++ settings must be in the
environment before TensorFlow is imported, long before flags are parsed.
"""

import os
import platform
import signal
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging

from train import stop_signals

# absl's verbosity of INFO; below it (WARNING = -1) is quiet.
_INFO = 0


def requested_verbosity(argv):
  """The value of --verbosity / -v in `argv`, or None when absent.

  Args:
    argv: command-line arguments (sys.argv).

  Returns:
    The last value given, as an int, or None (also for a value absl would
    refuse: absl reports that itself).
  """
  value = None
  names = ("--verbosity", "-verbosity", "--v", "-v")
  for i, arg in enumerate(argv[1:], start=1):
    name, eq, text = arg.partition("=")
    if name not in names:
      continue
    text = text if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    try:
      value = int(text)
    except ValueError:
      value = None
  return value


def is_verbose(argv=None):
  """Whether the command line asked for INFO lines (--verbosity >= 0)."""
  verbosity = requested_verbosity(sys.argv if argv is None else argv)
  return verbosity is not None and verbosity >= _INFO


def environment_defaults(verbose):
  """Environment variables a run sets unless the user set them.

  Args:
    verbose: whether the command line asked for INFO lines.

  Returns:
    {name: value}, applied with os.environ.setdefault before TF loads.
  """
  defaults = {}
  if not verbose:
    # 2: C++ errors only (1 would keep warnings, 0 everything).
    defaults["TF_CPP_MIN_LOG_LEVEL"] = "2"
  if onednn_supported():
    defaults["TF_ENABLE_ONEDNN_OPTS"] = "1"
  return defaults


def onednn_supported(machine=None):
  """Whether oneDNN's CPU kernels can run here: x86-64.

  TF's x86-64 wheels need AVX, above oneDNN's SSE4.1 minimum. Elsewhere TF's
  own default is kept. Some TF builds leave oneDNN off by default; it made
  dense steps 1.3-1.5x faster on such a machine, and runs with
  --deterministic=true stay bitwise reproducible with it (tested).

  Args:
    machine: platform.machine() (None reads it).
  """
  machine = platform.machine() if machine is None else machine
  return machine.lower() in ("x86_64", "amd64")


def onednn_state():
  """TF_ENABLE_ONEDNN_OPTS as this process has it ("unset": TF's default)."""
  return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset")


def has_nvidia_driver():
  """Whether an NVIDIA kernel driver is loaded (GPUs may exist)."""
  return os.path.exists("/proc/driver/nvidia/version")


def _whole(low, high=None):
  """A check of text that must be a whole number in [low, high]."""
  def check(text):
    try:
      value = int(text)
    except ValueError:
      return False
    return value >= low and (high is None or value <= high)
  return check


def _grace(text):
  try:
    return 0 < float(text) < 3600
  except ValueError:
    return False


_BOOL = ("0", "1", "true", "false")
# Variables that TensorFlow, OpenMP or our watchdog read as the process
# starts: {name: (check of the text, what it takes)}. TF aborts with a
# stack dump on TF_NUM_INTRAOP_THREADS=-5 and ignores most other bad
# values in silence; either way the user's setting is lost.
ENVIRONMENT = {
    "TF_NUM_INTRAOP_THREADS": (_whole(0), "a whole number >= 0 (0: TF's "
                               "default)"),
    "TF_NUM_INTEROP_THREADS": (_whole(0), "a whole number >= 0 (0: TF's "
                               "default)"),
    "OMP_NUM_THREADS": (lambda t: all(_whole(1)(p) for p in t.split(",")),
                        "whole numbers >= 1, comma-separated"),
    "TF_CPP_MIN_LOG_LEVEL": (_whole(0, 3), "0, 1, 2 or 3"),
    "TF_CPP_MAX_VLOG_LEVEL": (_whole(0), "a whole number >= 0"),
    "TF_ENABLE_ONEDNN_OPTS": (lambda t: t.lower() in _BOOL, "0 or 1"),
    "TF_OVERRIDE_GLOBAL_THREADPOOL": (lambda t: t.lower() in _BOOL, "0 or 1"),
    "TF_DETERMINISTIC_OPS": (lambda t: t.lower() in _BOOL, "0 or 1"),
    "TF_INTERLOCK_STOP_GRACE_S": (_grace, "seconds, more than 0 and less "
                                  "than 3600"),
}


def environment_problem(environ=None):
  """The line refusing a bad start-up variable of `environ`, or None.

  Args:
    environ: the environment (None: os.environ). An empty value counts as
      unset.
  """
  environ = os.environ if environ is None else environ
  for name, (check, takes) in ENVIRONMENT.items():
    text = environ.get(name, "")
    if text.strip() and not check(text.strip()):
      return (f"{name}={text!r} in the environment is not {takes}; it is "
              f"read as the process starts, before any flag: unset it or "
              f"fix it. Received: {name}={text!r}")
  return None


def _check_environment():
  """Leaves with one line (exit 1) if a start-up variable is bad: before
  TensorFlow is imported, since TF may abort on it."""
  problem = environment_problem()
  if problem:
    os.write(2, f"error: {problem}\n".encode())
    sys.exit(1)


def _import_tensorflow_quietly():
  """Imports TensorFlow with stderr (fd 2) captured.

  Its libraries print a few C++ lines while they load, before
  TF_CPP_MIN_LOG_LEVEL takes effect. On a machine without an NVIDIA driver
  the devices are listed here too: the CUDA-enabled wheel logs a "failed
  call to cuInit" error line the first time it looks for GPUs, which says
  nothing on a CPU machine. The captured text is replayed if this fails, so
  a broken install still explains itself.
  """
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow  # pylint: disable=g-import-not-at-top
      if not has_nvidia_driver():
        tensorflow.config.list_physical_devices()
    except BaseException:
      os.dup2(saved, 2)
      captured.seek(0)
      sys.stderr.write(captured.read().decode("utf-8", "replace"))
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def _quiet_python_logging():
  """After flags are parsed: absl (and with it TF's Python logger) at
  WARNING, unless --verbosity was given. app.run raises an unset
  verbosity to INFO, hence a callback that runs after it."""
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
    try:
      import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    except ImportError:
      return
    tfds.disable_progress_bar()


_START_STDERR = []  # a copy of the original stderr's fd


def _stopped_while_starting(signum, frame):
  """SIGTERM/SIGHUP/SIGINT before the binary's main: nothing is written
  yet."""
  del frame
  # fd 2 may be captured while TF loads (_import_tensorflow_quietly).
  line = (f"error: stopped ({signal.Signals(signum).name}) while starting; "
          f"nothing was written\n")
  try:
    os.write(_START_STDERR[0], line.encode())
  except OSError:
    pass  # stderr is gone (a closed terminal: SIGHUP)
  os._exit(1)  # pylint: disable=protected-access


def _guard_start_up():
  """A binary's first import (`python -m train.x` / `research.x`): a signal
  while TF loads is one line, not a silent death or a traceback; the error
  boundary takes over when main starts."""
  main = sys.modules.get("__main__")
  if getattr(main, "__package__", None) in ("train", "research"):
    _START_STDERR.append(os.dup(2))
    for signum in stop_signals.STOPPING:
      signal.signal(signum, _stopped_while_starting)


def configure(argv=None):
  """Applies the settings above; runs once, when this module is imported.

  Args:
    argv: command-line arguments; None reads sys.argv.
  """
  _guard_start_up()
  _check_environment()
  verbose = is_verbose(argv)
  defaults = environment_defaults(verbose)
  if not verbose and "--placement=cluster" in (sys.argv if argv is None
                                               else argv):
    # A lost worker is reported in one line (cluster_checks.describe_failure);
    # TF's C++ errors about it ("E0000 ... Failed to register function
    # remotely", from its own threads) would only repeat it.
    defaults["TF_CPP_MIN_LOG_LEVEL"] = "3"
  for name, value in defaults.items():
    os.environ.setdefault(name, value)
  if not verbose:
    _import_tensorflow_quietly()
    app.call_after_init(_quiet_python_logging)


configure()
