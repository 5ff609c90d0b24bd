"""A bounded wait for a cluster's workers, before TF's connect.

TF's connect has no timeout of its own: it retries a missing worker for a
long time without saying which, and waits for good on a port where another
program accepts connections, or on a worker reached under two names. Here
each worker is asked for its status over TF's own gRPC WorkerService
(bounded), and the ones that do not answer as the task their address says
are named in one line. `tf_interlock.cluster.connect` waits so first.
"""

import re
import time

# Seconds the client waits for every worker to accept connections.
DEFAULT_CONNECT_TIMEOUT_S = 60.0


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

  Args:
    spec: the cluster's `tf.train.ClusterSpec` (`cluster.cluster_spec`).
    timeout_s: seconds to wait in all.

  A bounded wait: TF's own connect would retry a missing worker for a long
  time without saying which one is missing, and would wait forever on a
  port where something else accepts connections (`worker_status`).

  Raises:
    ConnectionError: one line naming every worker still missing.
  """
  addresses = spec.job_tasks(_JOB)
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


# The workers' job name (`tf_interlock.cluster.JOB`).
_JOB = "worker"
