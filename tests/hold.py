r"""Runs a binary held at a known point, so a test's signal lands there.

  python -m tests.hold READY TARGET N MODULE [FLAG ...]

runs `python -m MODULE FLAG ...` (its own `main`, error boundary and all)
with one change: once the N-th call of TARGET (a dotted name such as
`train.run_lock.RunLock.acquire`) has returned, the process writes
the file READY and waits there. It waits until a signal's exception
unwinds it (SIGINT, or SIGTERM through `train.error_boundary`), or until
the file READY + ".go" appears; then it carries on as the binary would.

A test of a race (a signal during an export, a worker killed mid-run)
thereby knows the window is open when it acts: it waits for READY (the
binary cannot have moved past the point), sends its signal or does its
damage, and, if the binary must go on, writes READY.go. Nothing waits
for a time and hopes.
"""

import functools
import importlib
import os
import runpy
import sys
import time

# Gives up after this long without a signal or READY.go: a test that never
# acts must not leave a process behind for good.
MAX_HOLD_S = 600.0
_POLL_S = 0.02


def _resolve(target):
  """(owner object, attribute name) of a dotted `module[.Class].attr`."""
  parts = target.split(".")
  for i in range(len(parts) - 1, 0, -1):
    try:
      owner = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for name in parts[i:-1]:
      owner = getattr(owner, name)
    return owner, parts[-1]
  raise ValueError(f"cannot import {target!r}. Received: target={target!r}")


def hold(ready):
  """Writes `ready`, then waits for a signal's exception or `ready`.go."""
  with open(ready + ".tmp", "w") as f:
    f.write(str(os.getpid()))
  os.replace(ready + ".tmp", ready)  # whole when the test sees it
  # time.sleep returns early when a signal arrives, and a handler's
  # exception (KeyboardInterrupt, Terminated) leaves from here.
  deadline = time.monotonic() + MAX_HOLD_S
  while not os.path.exists(ready + ".go"):
    if time.monotonic() > deadline:
      raise SystemExit(f"tests.hold: nothing came for {MAX_HOLD_S:g} s")
    time.sleep(_POLL_S)


def patch(target, calls, ready):
  """Makes the `calls`-th call of `target` hold once it has returned."""
  owner, name = _resolve(target)
  original = getattr(owner, name)
  count = [0]

  @functools.wraps(original)
  def held(*args, **kwargs):
    result = original(*args, **kwargs)
    count[0] += 1
    if count[0] == calls:
      hold(ready)
    return result

  setattr(owner, name, held)


def command(ready, target, calls, module, *flags):
  """The command line of `python -m tests.hold` (see the module's text)."""
  return [sys.executable, "-m", "tests.hold", os.fspath(ready), target,
          str(calls), module, *flags]


def wait_until_held(ready, proc):
  """Returns once `proc` (run through `command`) holds at its point.

  Raises:
    AssertionError: `proc` ended first (its stderr's tail).
  """
  # Polls a file the held process writes before it waits: whenever this
  # returns, the process is at the point, whatever the load.
  while not os.path.exists(ready):
    if proc.poll() is not None:
      _, err = proc.communicate()
      raise AssertionError(f"ended (code {proc.returncode}) before holding "
                           f"at its point: {(err or '')[-2000:]}")
    time.sleep(_POLL_S)


def main(argv):
  ready, target, calls, module, *flags = argv[1:]
  sys.argv = [module, *flags]
  # As the binary itself does first: its environment defaults before
  # TensorFlow loads (the target's module may import TensorFlow).
  importlib.import_module("train.runtime_env")
  patch(target, int(calls), ready)
  runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  main(sys.argv)
