"""Diagnostics of a cluster's workers, before the connect and after a fault.

The binaries' side of `tf_interlock.cluster`: one bounded wait until every
worker answers as a TF worker (and is the task its address says), and after
a runtime error, one line naming the worker it came from. TF's own connect
and errors do neither.
"""

import re
import socket
import time

import tensorflow as tf

from tf_interlock import cluster as cluster_lib

JOB = cluster_lib.JOB
# Seconds the client waits for every worker to accept connections.
DEFAULT_CONNECT_TIMEOUT_S = 60.0
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


def worker_status(address, timeout_s):
  """Whether `address` is a TF worker: a bounded gRPC handshake.

  Asks TF's own WorkerService for its status (an empty GetStatusRequest),
  the request a client's connect starts with. A port that accepts TCP
  connections is not enough: an HTTP server or a listener that never
  answers there would hold TF's connect forever.

  Args:
    address: the worker's host:port.
    timeout_s: seconds to wait for the answer.

  Returns:
    (its GetStatusResponse as bytes, None) when it answers as a TF worker,
    else (None, why not: a few words).
  """
  import grpc  # pylint: disable=g-import-not-at-top
  try:
    with grpc.insecure_channel(address) as channel:
      return channel.unary_unary("/tensorflow.WorkerService/GetStatus")(
          b"", timeout=timeout_s), None
  except grpc.RpcError as e:
    code, details = e.code(), e.details() or ""
  return None, _why_not(code, details)


def _why_not(code, details):
  """Why a GetStatus answered with gRPC's `code` is not a TF worker's."""
  import grpc  # pylint: disable=g-import-not-at-top
  if code == grpc.StatusCode.DEADLINE_EXCEEDED:
    return ("accepts connections but does not answer (frozen, or another "
            "program listens there)")
  if code == grpc.StatusCode.UNAVAILABLE and "refused" in details:
    return "refuses connections"
  if code == grpc.StatusCode.UNAVAILABLE:
    return ("accepts connections but speaks no gRPC (another program, e.g. "
            "an HTTP server, listens there)")
  if code == grpc.StatusCode.UNIMPLEMENTED:
    return "speaks gRPC but is not a TF worker"
  return f"answers {code.name}, not as a TF worker"


def wait_for_workers(spec, timeout_s=DEFAULT_CONNECT_TIMEOUT_S):
  """Waits until every worker answers as a TF worker, at most `timeout_s`.

  A bounded wait: TF's own connect would retry a missing worker for a long
  time without saying which one is missing, and would wait forever on a
  port where something else accepts connections (`worker_status`).

  Raises:
    ConnectionError: one line naming every worker still missing.
  """
  addresses = spec.job_tasks(JOB)
  missing = {t: "" for t in range(len(addresses))}
  statuses = {}
  deadline = time.monotonic() + timeout_s
  while True:
    for t in list(missing):
      left = max(deadline - time.monotonic(), 0.5)
      statuses[t], missing[t] = worker_status(addresses[t], min(left, 5.0))
      if missing[t] is None:
        del missing[t]
    if not missing or time.monotonic() >= deadline:
      break
    time.sleep(0.5)
  if all(why == "refuses connections" for why in missing.values()) and (
      missing):
    names = ", ".join(f"task {t} ({addresses[t]})" for t in missing)
    raise ConnectionError(
        f"no worker listening at {names} after {timeout_s:g} s; start it "
        f"with python -m train.worker --cluster=... --task=N. "
        f"Received: cluster={','.join(addresses)}")
  if missing:
    names = "; ".join(f"task {t} ({addresses[t]}) {why}"
                      for t, why in missing.items())
    raise ConnectionError(
        f"not a TF worker after {timeout_s:g} s: {names}; stop what holds "
        f"that port or pick another, and start python -m train.worker "
        f"--cluster=... --task=N there. "
        f"Received: cluster={','.join(addresses)}")
  check_identities(addresses, statuses)


# A worker's own device names in its GetStatus answer (a DeviceAttributes
# proto per device; its name field holds the task the worker was started as).
_OWN_TASK = re.compile(rb"/job:worker/replica:\d+/task:(\d+)/")


def check_identities(addresses, statuses):
  """Raises unless the worker answering at task t's address is task t.

  One worker reached under two spellings (127.0.0.1:P and localhost:P,
  which no resolution of the names may reveal: a worker listens on every
  address of its host), or workers started with the list in another
  order, would make TF's runtime wait for good on the first op that
  crosses them: refused here, within the connect's bounded wait.

  Args:
    addresses: the cluster's host:port, in task order.
    statuses: {task: the worker's GetStatusResponse bytes}.

  Raises:
    ConnectionError: one line naming the address and the task it is.
  """
  for t, address in enumerate(addresses):
    found = _OWN_TASK.search(statuses.get(t) or b"")
    own = int(found.group(1)) if found else t
    if own == t:
      continue
    same = [u for u in range(len(addresses))
            if u != t and statuses.get(u) == statuses[t]]
    what = (f"the same worker as task {same[0]} ({addresses[same[0]]})"
            if same else f"a worker started as --task={own}")
    raise ConnectionError(
        f"the cluster lists {address} as task {t}, but {what} answers "
        f"there; list each worker once, in the order of the workers' own "
        f"--cluster and --task. Received: cluster={','.join(addresses)}")


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
