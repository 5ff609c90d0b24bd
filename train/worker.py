r"""One worker of a cluster: `python -m train.worker --cluster=... --task=i`.

  python -m train.worker --cluster=10.0.0.1:2222,10.0.0.2:2222 --task=0

Starts TensorFlow's gRPC server (`tf.distribute.Server`) for task i of the
"worker" job, prints one line when it accepts work, and serves until
SIGTERM, SIGHUP or SIGINT (exit 0). The trainer (`python -m train.train
--placement=cluster --cluster=...`) connects to every worker and places
module k's variables and ops on worker t(k); the workers keep no state of
their own between runs, so a worker that died is simply started again. Without --cluster the worker
list and (without --task) this task's index come from TF_CONFIG.

Threads: every op a module runs on this worker uses --intra_op_threads
threads (default 1) and at most --inter_op_threads ops run at once (default
1): one core per module for one module per worker. Give a worker holding m
modules (--modules_per_worker=m on the trainer) --inter_op_threads=m.

Bad input gets one line and exit 1: an invalid cluster list, a task that is
not in it, a host that is not this machine's, a port already in use. The
shared boundary (`train.error_boundary`) prints it and, with hard_exit,
leaves at once: TF's server threads could hold up a normal exit.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import errno
import json
import os
import signal
import socket
import time

from absl import app
from absl import flags

from train import error_boundary
from train import stop_signals

_CLUSTER = flags.DEFINE_string(
    "cluster", None, "Comma-separated host:port of every worker, in task "
    "order (the same list on every host and on the trainer); default: the "
    "worker job of TF_CONFIG.")
_TASK = flags.DEFINE_integer(
    "task", None, "This worker's index in --cluster (0-based); default: "
    "TF_CONFIG's task.index.")
_INTRA = flags.DEFINE_integer(
    "intra_op_threads", 1, "Threads (>= 1) one op may use on this worker "
    "(1: one core per op).")
_INTER = flags.DEFINE_integer(
    "inter_op_threads", 1, "Ops (>= 1) this worker runs at once: the "
    "number of modules it holds, for one core per module.")


class WorkerError(ValueError):
  """A bad flag or environment: one line for the user, exit 1 (a
  ValueError, which the error boundary reports as its line)."""


def _task_index():
  if _TASK.value is not None:
    return _TASK.value
  try:
    return int(json.loads(os.environ.get("TF_CONFIG", "{}"))["task"]["index"])
  except (ValueError, KeyError, TypeError):
    raise WorkerError("--task is required (or TF_CONFIG with task.index). "
                      "Received: task=None") from None


def check_address(address, task):
  """Raises WorkerError unless this machine can listen on `address`.

  A host that is not one of this machine's addresses, or a port another
  process already holds, is found here by binding a socket once (and
  closing it), before TF starts its server.
  """
  host, _, port = address.rpartition(":")
  host = host.strip("[]")
  try:
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
  except socket.gaierror:
    raise WorkerError(f"cannot resolve host {host!r} of task {task}. "
                      f"Received: cluster entry {address}") from None
  family, _, _, _, sockaddr = infos[0]
  with socket.socket(family, socket.SOCK_STREAM) as probe:
    # As gRPC does: connections of a worker that died on this port linger
    # in TIME_WAIT and must not count as "in use"; a listener does.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(sockaddr)
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        raise WorkerError(
            f"port {port} is already in use on this host; stop the process "
            f"holding it or give task {task} another port. "
            f"Received: cluster entry {address}") from None
      if e.errno == errno.EADDRNOTAVAIL:
        raise WorkerError(
            f"host {host} of task {task} is not an address of this machine; "
            f"run task {task} on {host}, or pass the --task whose entry "
            f"names this host. Received: task={task}") from None
      raise WorkerError(f"cannot listen on {address} ({e.strerror}). "
                        f"Received: task={task}") from None


def start_server(addresses, task, intra_op_threads, inter_op_threads):
  """Starts task `task`'s gRPC server; returns the `tf.distribute.Server`."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  config = tf.compat.v1.ConfigProto(
      intra_op_parallelism_threads=intra_op_threads,
      inter_op_parallelism_threads=inter_op_threads)
  return tf.distribute.Server(
      tf.train.ClusterSpec({"worker": addresses}), job_name="worker",
      task_index=task, protocol="grpc", config=config, start=True)


def _stop(signum, frame):
  del frame
  raise SystemExit(f"worker stopped ({signal.Signals(signum).name})")


def run():
  """Checks the flags, starts the server, serves until a signal."""
  from tf_interlock import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  for name, flag in (("intra_op_threads", _INTRA),
                     ("inter_op_threads", _INTER)):
    if flag.value < 1:
      raise WorkerError(f"--{name} must be an int >= 1. "
                        f"Received: {name}={flag.value}")
  try:
    addresses = (cluster_lib.parse_addresses(_CLUSTER.value)
                 if _CLUSTER.value is not None
                 else cluster_lib.addresses_from_tf_config())
  except ValueError as e:
    raise WorkerError(str(e)) from None
  if not addresses:
    raise WorkerError("--cluster is required (or TF_CONFIG with a worker "
                      "job). Received: cluster=None")
  task = _task_index()
  if not 0 <= task < len(addresses):
    raise WorkerError(
        f"--task must name one of the {len(addresses)} workers of the "
        f"cluster (0..{len(addresses) - 1}). Received: task={task}")
  check_address(addresses[task], task)
  for signum in stop_signals.STOPPING:  # SIGHUP: a closed terminal
    signal.signal(signum, _stop)
  server = start_server(addresses, task, _INTRA.value, _INTER.value)
  print(f"worker task {task} of {len(addresses)} ready at {addresses[task]} "
        f"({server.target}; intra_op_threads={_INTRA.value}, "
        f"inter_op_threads={_INTER.value})", flush=True)
  while True:
    # Not signal.pause(): the kernel may deliver SIGTERM to one of TF's
    # threads, which leaves pause() asleep; Python runs the handler in the
    # main thread at its next bytecode, at most a second later.
    time.sleep(1)


@error_boundary.guard(interrupted="the worker had not started serving",
                      hard_exit=True)
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  try:
    run()
  except SystemExit as e:
    if isinstance(e.code, str):  # stopped by a signal: a clean exit
      print(e.code, flush=True)
      os._exit(0)  # pylint: disable=protected-access
    raise


if __name__ == "__main__":
  app.run(main)
