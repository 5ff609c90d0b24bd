"""Modules on the workers of a cluster, through TF's gRPC distributed runtime.

One client process (the trainer) connects to W worker processes, each a
`tf.distribute.Server` (`python -m train.worker`), with
`tf.config.experimental_connect_to_cluster`. Afterwards the devices
`/job:worker/task:t/device:CPU:0` exist in the client like local ones: module
k's variables, optimizer state and ops are placed on worker t(k) with
`tf.device`, and one `tf.function` spans every worker. TF's runtime moves
the activations and cotangents between the workers as tensors; nothing here
sends a byte itself.

Which worker holds module k: t(k) = k // modules_per_worker (0-based), so
with the default of one module per worker module k is on worker k.

The cluster is a list of `host:port` (the `--cluster` flag) or the
"worker" job of the `TF_CONFIG` environment variable, the JSON that
TensorFlow's own multi-worker tools read:
`{"cluster": {"worker": ["h0:2222", "h1:2222"]}, "task": {...}}`.
"""

import ipaddress
import json
import os
import socket

import tensorflow as tf

from tf_interlock import cluster_wait

JOB = "worker"


def parse_addresses(text):
  """The `host:port` list of `--cluster`, checked.

  Args:
    text: comma-separated `host:port` entries, e.g.
      "10.0.0.1:2222,10.0.0.2:2222".

  Returns:
    The list of "host:port" strings, in task order.

  Raises:
    ValueError: one line naming the bad entry and what is allowed.
  """
  entries = [part.strip() for part in (text or "").split(",")]
  if not text or not all(entries):
    raise ValueError(
        "cluster must be a comma-separated list of host:port, one per "
        f"worker, with no empty entry. Received: cluster={text!r}")
  for entry in entries:
    host, sep, port = entry.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(
        port) < 65536:
      raise ValueError(
          f"cluster entry {entry!r} is not host:port with a port in "
          f"1..65535. Received: cluster={text!r}")
  seen = {}
  for entry in entries:
    for key in _endpoints(entry):
      if key in seen and seen[key] != entry:
        raise ValueError(
            f"cluster names one worker twice: {seen[key]} and {entry} are "
            f"the same host and port; each worker needs its own host:port. "
            f"Received: cluster={text!r}")
      if key in seen:
        raise ValueError(
            f"cluster names {entry} twice; each worker needs its own "
            f"host:port. Received: cluster={text!r}")
    seen.update(dict.fromkeys(_endpoints(entry), entry))
  return entries


def _endpoints(entry):
  """The (address, port) pairs `entry` ("host:port") reaches: its host
  resolved (all loopback addresses are one: a worker listens on every
  address of its host); the host's own name where it does not resolve."""
  host, _, port = entry.rpartition(":")
  host = host.strip("[]")
  try:
    found = {info[4][0] for info in socket.getaddrinfo(
        host, int(port), type=socket.SOCK_STREAM)}
  except (socket.gaierror, UnicodeError):
    found = {host.lower()}
  return {("loopback" if _is_loopback(a) else a, int(port)) for a in found}


def _is_loopback(address):
  try:
    return ipaddress.ip_address(address.split("%")[0]).is_loopback
  except ValueError:
    return False


def addresses_from_tf_config(environ=None):
  """The "worker" job of TF_CONFIG, or None when TF_CONFIG is unset.

  Raises:
    ValueError: one line when TF_CONFIG is not JSON or has no worker job.
  """
  text = (os.environ if environ is None else environ).get("TF_CONFIG")
  if not text:
    return None
  try:
    workers = json.loads(text)["cluster"][JOB]
  except (ValueError, KeyError, TypeError):
    raise ValueError(
        'TF_CONFIG must be JSON with a worker job: {"cluster": {"worker": '
        f'["host:port", ...]}}}}. Received: TF_CONFIG={text[:200]!r}'
    ) from None
  if not isinstance(workers, list):
    raise ValueError("TF_CONFIG's cluster.worker must be a list of "
                     f"host:port. Received: TF_CONFIG={text[:200]!r}")
  return parse_addresses(",".join(map(str, workers)))


def cluster_spec(text=None, environ=None):
  """The ClusterSpec of `--cluster` (`text`), else of TF_CONFIG.

  Raises:
    ValueError: one line when neither gives a valid worker list.
  """
  addresses = parse_addresses(text) if text else addresses_from_tf_config(
      environ)
  if not addresses:
    raise ValueError("placement=cluster needs --cluster=host:port,... or "
                     "TF_CONFIG with a worker job. Received: cluster=None")
  return tf.train.ClusterSpec({JOB: addresses})


def worker_device(task, device_type="CPU"):
  """Device 0 of `device_type` on worker `task`, as the client names it."""
  return f"/job:{JOB}/replica:0/task:{task}/device:{device_type}:0"


def module_workers(num_modules, num_workers, modules_per_worker=1):
  """t(k) for every module: k // modules_per_worker.

  Raises:
    ValueError: when the workers hold fewer than num_modules modules.
  """
  if isinstance(modules_per_worker, bool) or not isinstance(
      modules_per_worker, int) or modules_per_worker < 1:
    raise ValueError("modules_per_worker must be an int >= 1. "
                     f"Received: modules_per_worker={modules_per_worker!r}")
  needed = -(-num_modules // modules_per_worker)
  if needed > num_workers:
    raise ValueError(
        f"{num_modules} modules at {modules_per_worker} per worker need "
        f"{needed} workers; the cluster has {num_workers}. "
        f"Received: modules_per_worker={modules_per_worker}")
  return [k // modules_per_worker for k in range(num_modules)]


def connect(spec, timeout_s=cluster_wait.DEFAULT_CONNECT_TIMEOUT_S):
  """Connects this (client) process to the cluster's workers.

  Once per process and before the first op that needs a worker. Returns
  the workers' device names, in task order. TF's connect has no timeout of
  its own: a worker that is missing, or a port where another program
  answers, would hold it; every worker is checked first, in one bounded
  wait (`cluster_wait.wait_for_workers`).

  Raises:
    ConnectionError: naming the workers still missing (or not what their
      address says) after `timeout_s`, or when the client sees fewer
      workers than `spec` lists.
  """
  if len(worker_devices()) == spec.num_tasks(JOB):
    return worker_devices()  # connected already (a process connects once)
  cluster_wait.wait_for_workers(spec, timeout_s)
  # A ClusterSpec, not a resolver: a resolver without a master address is
  # taken for a local run and silently ignored. make_master_device_default
  # =False keeps the client's own CPU the default device (there is no
  # master job to make default).
  tf.config.experimental_connect_to_cluster(
      spec, make_master_device_default=False)
  devices = worker_devices()
  if len(devices) != spec.num_tasks(JOB):
    raise ConnectionError(
        f"connected, but the client sees {len(devices)} of "
        f"{spec.num_tasks(JOB)} workers' devices ({devices}). "
        f"Received: cluster={','.join(spec.job_tasks(JOB))}")
  # A first op on every worker: where the cluster is not what its workers
  # were started with, TF waits here for good (a caller with a watchdog
  # bounds it; cluster_wait refuses the cases it can see first).
  for device in devices:
    with tf.device(device):
      tf.identity(tf.constant(0)).numpy()
  return devices


def worker_devices():
  """Per worker task of the connected cluster, in task order, the device a
  module there runs on: its GPU:0 if it has one, else its CPU:0.

  Empty when this process is not connected (`connect`).
  """
  kinds = {}
  for device in tf.config.list_logical_devices():
    spec = tf.DeviceSpec.from_string(device.name)
    if spec.job == JOB and spec.task is not None:
      kinds.setdefault(spec.task, set()).add(spec.device_type)
  return [worker_device(t, "GPU" if "GPU" in kinds[t] else "CPU")
          for t in sorted(kinds)]


