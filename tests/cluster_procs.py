"""Real worker processes on 127.0.0.1 for the cluster tests.

Every process started here is registered with a `Procs`, whose `stop_all`
(called by the tests' fixture finalizers, also on failure) terminates it
and, if it does not exit, kills it.
"""

import os
import signal
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env():
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)


def _xdist_slot():
  """(index, count) of this pytest-xdist worker; (0, 1) without xdist."""
  name = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
  count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
  return (int(name[2:]) if name.startswith("gw") else 0), max(count, 1)


def free_ports(count):
  """`count` TCP ports on 127.0.0.1 that nothing listens on right now.

  Under pytest-xdist, worker i of n takes only ports p with p % n == i:
  two workers' tests never pick the same port between this call and the
  moment their processes bind it.
  """
  index, workers = _xdist_slot()
  socks, ports = [], []
  try:
    while len(ports) < count:  # every socket stays bound: no port twice
      s = socket.socket()
      s.bind(("127.0.0.1", 0))
      socks.append(s)
      port = s.getsockname()[1]
      if port % workers == index:
        ports.append(port)
    return ports
  finally:
    for s in socks:
      s.close()


def cluster_flag(ports):
  return ",".join(f"127.0.0.1:{p}" for p in ports)


class Procs:
  """The processes a test started; `stop_all` ends every one."""

  def __init__(self):
    self.procs = []

  def start(self, module, *flags, stdin=None, environ=None):
    """`python -m module flags...`; `environ` adds to its environment."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *flags], cwd=ROOT,
        env=dict(env(), **(environ or {})),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=stdin)
    self.procs.append(proc)
    return proc

  def start_worker(self, cluster, task):
    """Starts `train.worker` task `task`; returns it once it is ready."""
    proc = self.start("train.worker", f"--cluster={cluster}",
                      f"--task={task}")
    line = proc.stdout.readline()  # the one "ready" line (or EOF: died)
    if "ready" not in line:
      proc.kill()
      raise AssertionError(f"worker {task} did not start: {line!r} "
                           f"{proc.stderr.read()}")
    return proc

  def start_cluster(self, num_workers):
    """`num_workers` ready workers; returns (cluster flag, processes)."""
    cluster = cluster_flag(free_ports(num_workers))
    return cluster, [self.start_worker(cluster, t)
                     for t in range(num_workers)]

  def stop(self, proc):
    if proc.poll() is None:
      proc.send_signal(signal.SIGTERM)
      try:
        proc.wait(timeout=20)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)
    for stream in (proc.stdout, proc.stderr):
      if stream:
        stream.close()

  def stop_all(self):
    for proc in self.procs:
      self.stop(proc)
    self.procs = []
