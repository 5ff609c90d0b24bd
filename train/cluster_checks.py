"""Diagnostics of a cluster's workers after a fault.

The binaries' side of `tf_interlock.cluster`: after a runtime error, one
line naming the worker it came from, which TF's errors do not; and the
plain TCP probe the binaries try an address with (`reachable`). (The
bounded wait before the connect is the library's: `cluster_wait`, which
`connect` runs.)
"""

import re
import socket
import time

import tensorflow as tf

from tf_interlock import cluster as cluster_lib

JOB = cluster_lib.JOB
# A task named in TF's error messages, e.g. "/job:worker/replica:0/task:1".
_TASK_IN_ERROR = re.compile(r"/job:worker/(?:replica:\d+/)?task:(\d+)")
_PORT_IN_ERROR = re.compile(r"ipv[46]:\[?([^\s\]]+?)\]?:(\d+)")
# Seconds a runtime error naming no worker waits for one to refuse
# connections: a worker that is still going down may accept for a moment.
DEAD_WORKER_WINDOW_S = 10.0


def reachable(address, timeout_s):
  """Whether host:port `address` accepts a TCP connection within timeout_s."""
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)),
                                  timeout=timeout_s):
      return True
  except OSError:
    return False


def refusing_tasks(addresses, window_s=DEAD_WORKER_WINDOW_S):
  """The tasks whose `host:port` refuses TCP connections.

  Every address is tried; while none refuses, all are tried again every
  half second for up to `window_s` (a killed worker's port may still accept
  until its process is gone).

  Args:
    addresses: the workers' `host:port`, in task order.
    window_s: how long to keep trying while every worker accepts.

  Returns:
    The refusing tasks, possibly none.
  """
  deadline = time.monotonic() + window_s
  while True:
    tasks = [t for t, address in enumerate(addresses)
             if not reachable(address, 2.0)]
    if tasks or time.monotonic() >= deadline:
      return tasks
    time.sleep(0.5)


def describe_failure(error, spec, window_s=DEAD_WORKER_WINDOW_S):
  """One line naming the worker an error of TF's runtime came from.

  TF reports a dead worker as "remote target has been disconnected",
  "failed to connect to all addresses" or "Connection reset by peer",
  sometimes with the task (`/job:worker/replica:0/task:1`) or its address
  in a long message, sometimes with neither: then the workers whose ports
  refuse connections are named (see `refusing_tasks`). If an
  UnavailableError or AbortedError still names no worker, the line says
  that every worker accepts connections, with TF's own first line.

  Args:
    error: a `tf.errors.OpError`.
    spec: the cluster's ClusterSpec.
    window_s: see `refusing_tasks`.

  Returns:
    The line, or None when the error is not a lost worker of `spec`.
  """
  text = str(error)
  addresses = spec.job_tasks(JOB)
  tasks = []
  match = _TASK_IN_ERROR.search(text)
  if match and int(match.group(1)) < len(addresses):
    tasks = [int(match.group(1))]
  else:
    for host, port in _PORT_IN_ERROR.findall(text):
      tasks += [t for t, address in enumerate(addresses)
                if address.rsplit(":", 1)[1] == port and (
                    host in address or address.startswith(("localhost", "[")))]
  lost = isinstance(error, (tf.errors.UnavailableError,
                            tf.errors.AbortedError))
  if not tasks and lost:
    tasks = refusing_tasks(addresses, window_s)
  resume = "(python -m train.worker --task=N) and rerun to resume"
  if tasks:
    names = ", ".join(f"task {t} ({addresses[t]})" for t in sorted(set(tasks)))
    return (f"worker {names} failed or became unreachable "
            f"({type(error).__name__}); the last checkpoint is intact: "
            f"restart it {resume}")
  if lost:
    first = (text.strip().splitlines() or [""])[0]
    return (f"a worker failed or became unreachable ({type(error).__name__}: "
            f"{first}), but every worker ({', '.join(addresses)}) still "
            f"accepts connections after {window_s:g} s, so TF's error names "
            f"none; the last checkpoint is intact: restart the worker that "
            f"stopped {resume}")
  return None


def _placeholder(address):
  """A plain listener on this task's own `address`, or None when the port
  cannot be bound (TF's server names that fault itself)."""
  host, _, port = address.rpartition(":")
  try:
    info = socket.getaddrinfo(host.strip("[]"), int(port),
                              type=socket.SOCK_STREAM)[0]
    listener = socket.socket(info[0], socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(info[4])
    listener.listen(64)
    listener.setblocking(False)
    return listener
  except OSError:
    return None


def wait_for_peers(peers, own, timeout_s, sleep=time.sleep):
  """Waits, in Python, until every peer task's port accepts connections.

  A task of a TF_CONFIG job cannot be stopped while TF's C++ joins the job:
  creating a `MultiWorkerMirroredStrategy` waits for every task for an
  hour, and replaces the SIGTERM handler (see train/stop_signals.py). So
  each task first waits here, where the deadline holds and a signal is
  acted on between two tries. Every task runs this before its TF server
  starts, so each listens meanwhile on its own address with a plain socket
  (closed on return, before TF binds the port), else two tasks would wait
  for each other for good.

  Args:
    peers: {name: "host:port"} of the other tasks ("worker 0" -> address).
    own: this task's "host:port".
    timeout_s: --cluster_timeout_s.
    sleep: waits between tries (time.sleep).

  Raises:
    ConnectionError: one line naming every task not listening in time.
  """
  listener = _placeholder(own)
  waiting = dict(peers)
  deadline = time.monotonic() + timeout_s
  try:
    while waiting:
      if listener is not None:  # drop the peers' probes: a clean backlog
        try:
          while True:
            listener.accept()[0].close()
        except OSError:
          pass
      for name, address in list(waiting.items()):
        if reachable(address, min(1.0, max(deadline - time.monotonic(),
                                               0.1))):
          del waiting[name]
      if not waiting:
        break
      if time.monotonic() >= deadline:
        names = ", ".join(f"{name} ({address})"
                          for name, address in waiting.items())
        raise ConnectionError(
            f"TF_CONFIG's {names} did not listen within "
            f"--cluster_timeout_s={timeout_s:g} s: every task of the job "
            f"runs the same command with its own TF_CONFIG task; start it, "
            f"or fix its address, and rerun; nothing was written. "
            f"Received: TF_CONFIG cluster="
            f"{','.join([own, *peers.values()])}")
      sleep(0.25)
    # A peer that saw this task's placeholder may still be waiting for
    # another: keep listening a moment, so that it sees this task too.
    sleep(0.5)
  finally:
    if listener is not None:
      listener.close()
