"""The signals that stop a binary, in one place for every handler.

  SIGTERM  a scheduler's stop or a TPU preemption notice
  SIGHUP   the terminal or ssh session that started the binary closed
  SIGINT   Ctrl-C

SIGHUP is handled as SIGTERM everywhere: its default action kills the
process at once, with no line, no checkpoint at the stop step and the run
lock left behind. Every place that handles SIGTERM (the start-up guard in
`runtime_env`, the error boundary, the training loop's `Preemption`, the
worker, the watchdog's wakeup pipe) takes its signals from here.

TensorFlow's C++ installs its own SIGTERM handler when it creates a
`MultiWorkerMirroredStrategy` (its preemption notifier), which swallows the
signal: Python's handler never runs, and the watchdog never hears of it.
`reinstall` points the C-level handlers back at Python's.
"""

import signal

# Unwind like SIGTERM: the error boundary's `Terminated`.
TERMINATING = (signal.SIGTERM, signal.SIGHUP)
# Every signal that stops a binary (SIGINT: KeyboardInterrupt).
STOPPING = TERMINATING + (signal.SIGINT,)


def name(signum):
  """"SIGTERM", "SIGHUP" or "SIGINT"."""
  return signal.Signals(signum).name


def reinstall():
  """Re-installs Python's handler of every stopping signal at the C level.

  `signal.signal` installs CPython's C handler again, the one that runs the
  Python handler and writes the watchdog's wakeup pipe; TF's C++ may have
  replaced it (see the module docstring). From the main thread only.
  """
  for signum in STOPPING:
    handler = signal.getsignal(signum)
    if handler is not None:  # None: installed outside Python, left alone
      signal.signal(signum, handler)
