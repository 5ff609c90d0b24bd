"""Every binary stops within seconds of SIGTERM or SIGINT, in every phase.

Python runs a signal handler only between two bytecodes. While TensorFlow
is inside one long C++ call (tracing a large graph, connecting to a port
that accepts but never answers, a step waiting on a frozen worker) the
handler waits for the call to return: minutes, or forever.

The C-level handler that CPython installs for every signal with a Python
handler does run at once: it records the signal and, when a wakeup fd is
set (`signal.set_wakeup_fd`), writes the signal's number to it. `start`
points that fd at a pipe read by a small watchdog process (this file run as
a script; stdlib only, no TensorFlow, so it starts in milliseconds):

* The binary goes on handling the signal itself (the error boundary's or
  the training loop's handler: save, one line, exit 1). If it has exited
  within `grace_s` (TF_INTERLOCK_STOP_GRACE_S, default 4 s), the watchdog
  sees the pipe close and does nothing.
* Otherwise the watchdog prints the one line (the signal, that the binary
  was busy inside TensorFlow, and what was kept: the run's latest complete
  checkpoint, read from `<model_dir>/checkpoints/checkpoint`), then
  SIGKILLs the binary (exit status 137). The line comes first, so whoever
  waits for the binary has it once the binary is gone. A kill cannot tear
  a checkpoint: TF writes each into a temporary folder and renames it, and
  the pointer file is replaced atomically.
* placement=cluster: `note_workers` hands it the workers and
  --cluster_timeout_s. It asks each worker for its status over TF's own
  gRPC service every few seconds; a worker that has not answered for
  --cluster_timeout_s (frozen: SIGSTOP, a hung host) is named in one line
  and the binary is stopped the same way. A worker whose port refuses is
  left to the binary, whose TF error names it (`cluster_checks.describe_failure`).

* A wait inside TF that was given a timeout but cannot honour it (the
  first op on a cluster's workers) runs in `bounded(seconds, what)`: past
  its deadline the watchdog names it in one line and stops the binary.

The watchdog ignores SIGINT and SIGTERM itself (Ctrl-C reaches the whole
process group) and exits when the binary does: its pipes close. The
binary tells it what it knows with `note` (a JSON line on a second pipe).
No thread is added to the binary. A watchdog that dies (killed by hand, or
by the OOM killer) is found after the next training loop (`Watch`) or the
next `note`: the binary names it in one line and starts a new one.
"""

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

GRACE_ENV = "TF_INTERLOCK_STOP_GRACE_S"
# Set by a binary that launches another (research.compare): its pid. The
# launched one is stopped (SIGTERM, then the grace) once that parent is gone.
PARENT_ENV = "TF_INTERLOCK_PARENT_PID"
DEFAULT_GRACE_S = 3.0
_STOPPING = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT",
             signal.SIGHUP: "SIGHUP"}


def grace_s(environ=None):
  """Seconds a signalled binary has to stop by itself (TF_INTERLOCK_..)."""
  text = (os.environ if environ is None else environ).get(GRACE_ENV, "")
  try:
    value = float(text)
  except ValueError:
    return DEFAULT_GRACE_S
  return value if 0 < value < 3600 else DEFAULT_GRACE_S


class _Child:
  """This process's watchdog: its process, the facts it was told (for a
  replacement), and the write end of its notes pipe."""
  proc = None
  facts = {}
  notes_fd = None
  signals_fd = None
  # This process's own copy of the signal pipe's read end: with it open a
  # dead watchdog never breaks the pipe, so Python's signal wakeup write
  # never fails (it would print "Exception ignored ... BrokenPipeError"
  # with a traceback); a full pipe is dropped silently.
  signals_read_fd = None


def start(interrupted):
  """Starts the watchdog of this process (once; from the main thread).

  Args:
    interrupted: what the binary leaves when stopped (the error boundary's
      text), for the watchdog's line when it has no checkpoint to name.
  """
  if _Child.proc is not None:
    note(interrupted=interrupted)
    return
  if threading.current_thread() is not threading.main_thread():
    return  # only the main thread may set the wakeup fd
  _Child.facts = {}
  _spawn()
  note(interrupted=interrupted)
  parent = os.environ.get(PARENT_ENV, "")
  if parent.isdigit() and int(parent) == os.getppid():
    note(parent=int(parent))


def _spawn():
  """Starts a watchdog process and points the wakeup fd at it."""
  signals_r, signals_w = os.pipe()
  notes_r, notes_w = os.pipe()
  os.set_blocking(signals_w, False)  # set_wakeup_fd needs a non-blocking fd
  proc = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, os.path.abspath(__file__), str(os.getpid()),
       str(grace_s()), str(signals_r), str(notes_r)],
      pass_fds=(signals_r, notes_r), stdin=subprocess.DEVNULL,
      close_fds=True)
  os.close(notes_r)
  for fd in (signals_r, signals_w, notes_w):
    os.set_inheritable(fd, False)
  signal.set_wakeup_fd(signals_w, warn_on_full_buffer=False)
  for fd in (_Child.signals_fd, _Child.notes_fd, _Child.signals_read_fd):
    if fd is not None:
      os.close(fd)
  _Child.proc, _Child.signals_fd, _Child.notes_fd = proc, signals_w, notes_w
  _Child.signals_read_fd = signals_r
  if _Child.facts:  # a replacement: told what the last one knew
    _send(_Child.facts)


def running():
  """Whether this process started a watchdog (a binary's own main did)."""
  return _Child.proc is not None


def _send(facts):
  try:
    os.write(_Child.notes_fd, (json.dumps(facts) + "\n").encode())
    return True
  except OSError:
    return False  # the watchdog is gone (EPIPE)


def note(**facts):
  """Tells the watchdog facts for its line (model_dir=, interrupted=, said=,
  workers=, timeout_s=); nothing when none runs. A watchdog found dead is
  replaced (`ensure_running`)."""
  if _Child.proc is None:
    return
  _Child.facts.update(facts)
  if not _send(facts):
    ensure_running()


def ensure_running(out=None):
  """Replaces a watchdog that died (killed, say), with one line on `out`
  (default: stderr) naming it. Called after every training loop
  (`Watch`) and whenever a fact cannot reach it.

  Returns:
    The line, or None while the watchdog runs (or none was started).
  """
  proc = _Child.proc
  if proc is None or proc.poll() is None or threading.current_thread() is (
      not threading.main_thread()):
    return None
  code = proc.returncode
  try:
    how = f"was killed by {signal.Signals(-code).name}"
  except ValueError:
    how = f"exited with status {code}"
  _spawn()
  line = (f"warning: the stop watchdog (pid {proc.pid}) {how}; started a "
          f"new one (pid {_Child.proc.pid}), so a signal during a long "
          f"TensorFlow call is still acted on within {grace_s():g} s")
  print(line, file=out or sys.stderr, flush=True)
  return line


class Watch:
  """A training loop action (train/actions.py's protocol): after each
  loop, a watchdog that died is replaced and named (`ensure_running`)."""

  def __init__(self, out=None):
    self.out = out

  def after_loop(self, loop):
    del loop
    ensure_running(self.out)


def note_workers(addresses, timeout_s):
  """placement=cluster: the workers to watch and --cluster_timeout_s."""
  note(workers=list(addresses), timeout_s=float(timeout_s))


@contextlib.contextmanager
def bounded(seconds, what):
  """Stops this binary in one line if the block takes over `seconds`.

  For a wait inside TensorFlow's C++ that has a timeout but no way to
  honour it (TF's first remote op waits for its peers for good): the
  watchdog prints "error: <what> did not finish within <seconds> s ..."
  and kills the binary, as for a signal it holds up. Nothing when no
  watchdog runs (a main called inside a test).
  """
  note(deadline=time.time() + seconds, deadline_what=what,
       deadline_s=float(seconds))
  try:
    yield
  finally:
    note(deadline=None)


# ---- the watchdog process ------------------------------------------------


def latest_checkpoint(model_dir):
  """"<path> (step N)" of model_dir's latest complete checkpoint, or None.

  Read from the text pointer file TF's CheckpointManager writes atomically
  after a checkpoint's files are in place.
  """
  folder = os.path.join(model_dir, "checkpoints")
  try:
    with open(os.path.join(folder, "checkpoint"), encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return None
  found = re.search(r'^model_checkpoint_path:\s*"(.*)"', text, re.M)
  if not found:
    return None
  path = found.group(1)
  path = path if os.path.isabs(path) else os.path.join(folder, path)
  step = re.search(r"-(\d+)$", path)
  return path + (f" (step {step.group(1)})" if step else "")


def kept(facts):
  """What a killed binary leaves, for its line."""
  if facts.get("model_dir") and "://" in facts["model_dir"]:
    return (f"kept: the checkpoints in {facts['model_dir']} up to the "
            f"last complete one; rerun the same command to resume")
  if facts.get("model_dir"):
    latest = latest_checkpoint(facts["model_dir"])
    if latest:
      return (f"kept: the last complete checkpoint {latest}; rerun the same "
              f"command to resume from it")
    return (f"kept: no checkpoint yet in {facts['model_dir']} (the run "
            f"starts from step 0 when rerun)")
  return facts.get("interrupted") or "nothing was left half-written"


def answers(address, timeout_s):
  """None when `address` answers TF's WorkerService.GetStatus within
  timeout_s, else gRPC's status code name (DEADLINE_EXCEEDED: no answer).
  The same request as `tf_interlock.cluster_wait.worker_status`."""
  import grpc  # pylint: disable=g-import-not-at-top
  with grpc.insecure_channel(address) as channel:
    call = channel.unary_unary("/tensorflow.WorkerService/GetStatus")
    try:
      call(b"", timeout=timeout_s)
      return None
    except grpc.RpcError as e:
      return e.code().name


class Watchdog:
  """The loop of the watchdog process (see the module docstring)."""

  def __init__(self, pid, grace, signals_fd, notes_fd, out=sys.stderr):
    self.pid, self.grace, self.out = pid, grace, out
    self.signals_fd, self.notes_fd = signals_fd, notes_fd
    self.facts, self.buffer = {}, b""
    self.received, self.deadline = None, None
    self.silent_since = {}  # worker task -> when it first did not answer
    self.next_probe = time.monotonic()

  def _stop(self, line):
    """Prints `line` (unless the binary said its own), then kills it."""
    if not self.facts.get("said"):
      try:
        print(f"error: {line}", file=self.out, flush=True)
      except OSError:
        pass  # stderr is gone (a closed terminal: SIGHUP); stop it anyway
    try:
      os.kill(self.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    sys.exit(0)

  def _parent_gone(self):
    """Whether the binary's launching process (`note(parent=)`) is gone:
    the binary was handed to another parent (read from /proc), or, where
    there is no /proc, that pid no longer exists."""
    parent = self.facts.get("parent")
    if not parent:
      return False
    try:
      with open(f"/proc/{self.pid}/stat", encoding="utf-8") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1]) != parent
    except (OSError, ValueError, IndexError):
      pass
    try:
      os.kill(parent, 0)
    except ProcessLookupError:
      return True
    except OSError:
      pass
    return False

  def _read_notes(self):
    data = os.read(self.notes_fd, 65536)
    self.buffer += data
    *lines, self.buffer = self.buffer.split(b"\n")
    for line in lines:
      try:
        self.facts.update(json.loads(line))
      except ValueError:
        pass
    return bool(data)

  def _read_signals(self):
    data = os.read(self.signals_fd, 4096)
    for number in data:
      if number in _STOPPING and self.received is None:
        self.received = _STOPPING[number]
        self.deadline = time.monotonic() + self.grace
    return bool(data)

  def _probe_workers(self):
    """Names a worker that has not answered for --cluster_timeout_s."""
    workers, timeout_s = self.facts["workers"], self.facts["timeout_s"]
    interval = min(max(timeout_s / 4, 0.5), 5.0)
    now = time.monotonic()
    for task, address in enumerate(workers):
      code = answers(address, min(interval, 2.0))
      if code == "DEADLINE_EXCEEDED":
        since = self.silent_since.setdefault(task, now)
        if now - since >= timeout_s:
          self._stop(
              f"worker task {task} ({address}) has not answered for "
              f"{now - since:.0f} s (--cluster_timeout_s={timeout_s:g}): "
              f"frozen or its host hung; the run was stopped, "
              f"{kept(self.facts)}; restart the worker (python -m "
              f"train.worker --task={task}) and rerun")
      else:  # answered, or refused: a dead worker is the binary's to name
        self.silent_since.pop(task, None)
    self.next_probe = time.monotonic() + interval

  def run(self):
    while True:
      now = time.monotonic()
      waits = [1.0]
      if self.deadline is not None:
        waits.append(self.deadline - now)
      if self.facts.get("workers"):
        waits.append(self.next_probe - now)
      if self.facts.get("deadline"):
        waits.append(self.facts["deadline"] - time.time())
      ready, _, _ = select.select([self.signals_fd, self.notes_fd], [], [],
                                  max(min(waits), 0.0))
      if self.signals_fd in ready and not self._read_signals():
        return  # the binary has exited (its end of the pipe closed)
      if self.notes_fd in ready and not self._read_notes():
        return
      now = time.monotonic()
      if self.received is None and self._parent_gone():
        self.received = (f"SIGTERM: its parent process "
                         f"{self.facts['parent']} ended")
        self.deadline = now + self.grace
        os.kill(self.pid, signal.SIGTERM)
      if self.deadline is not None and now >= self.deadline:
        self._stop(
            f"stopped ({self.received}): still busy inside TensorFlow "
            f"{self.grace:g} s after the signal, so it was killed; "
            f"{kept(self.facts)}")
      if (self.facts.get("workers") and self.received is None and
          now >= self.next_probe):
        self._probe_workers()
      if (self.facts.get("deadline") and self.received is None and
          time.time() >= self.facts["deadline"]):
        self._stop(
            f"{self.facts.get('deadline_what')} did not finish within "
            f"{self.facts.get('deadline_s', 0):g} s, so the binary was "
            f"stopped; {kept(self.facts)}")


def main(argv):
  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, signal.SIG_IGN)
  pid, grace, signals_fd, notes_fd = argv[1:5]
  try:
    Watchdog(int(pid), float(grace), int(signals_fd), int(notes_fd)).run()
  except KeyboardInterrupt:
    pass


if __name__ == "__main__":
  main(sys.argv)
