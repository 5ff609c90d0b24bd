"""A process's children and liveness, read from /proc (Linux).

test_stop_signals.py and test_compare_stops.py check that a binary's
helpers (its watchdog, compare's train.train run) go with it.
"""

import os
import time


def children(pid):
  """The children of every thread of `pid` (research.compare starts its
  runs from a thread; a binary's watchdog comes from its main thread)."""
  found = []
  for task in os.listdir(f"/proc/{pid}/task"):
    with open(f"/proc/{pid}/task/{task}/children", encoding="utf-8") as f:
      found += [int(p) for p in f.read().split()]
  return found


def cmdline(pid):
  """`pid`'s command line, words joined by spaces; "" once it is gone."""
  try:
    with open(f"/proc/{pid}/cmdline", encoding="utf-8") as f:
      return f.read().replace("\0", " ")
  except OSError:
    return ""


def alive(pid):
  """True while `pid` runs (a zombie, exited but not yet reaped, is not)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def gone_within(pid, seconds):
  """Polls until `pid` is gone or `seconds` have passed; True if gone."""
  deadline = time.monotonic() + seconds
  while alive(pid) and time.monotonic() < deadline:
    time.sleep(0.05)
  return not alive(pid)
