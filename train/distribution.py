"""The run's `tf.distribute` strategy: TPU, cluster, mirrored or default.

Also how many data-parallel replicas the global batch is split over, and
the one-line errors of a TPU or worker that cannot be reached.
"""

import functools
import threading

import tensorflow as tf

from tf_interlock import cluster as cluster_lib
from tf_interlock import cluster_wait
from train import cluster_checks
from train import config as config_lib
from train import multi_worker
from train import stop_watchdog

# Seconds the Cloud TPU name may take to resolve before the run gives up.
TPU_RESOLVE_TIMEOUT_S = 300
# Seconds each TPU worker address has to accept a TCP connection.
TPU_CONNECT_TIMEOUT_S = 10


def num_replicas(config):
  """Data-parallel replicas the global batch is split over.

  Known before the runtime starts except on a TPU, whose replica count
  (cores / K) is known once connected: None there, and `make_distribute`
  checks the batch then, still before anything is written.
  """
  runtime = config_lib.runtime_of(config)
  if runtime.needs_tpu:  # replicas known once connected
    return None
  gpus = tf.config.list_physical_devices("GPU")
  if multi_worker.mode(config) == "replicas":
    return multi_worker.num_tasks()
  if multi_worker.mode(config) == "mirrored":
    return multi_worker.num_tasks() * max(1, len(gpus))
  # make_distribute mirrors a data-parallel placement ("single") over every
  # GPU.
  return len(gpus) if runtime.data_parallel and len(gpus) > 1 else 1


def _unreachable(config, error):
  first = (str(error).strip().splitlines() or [""])[0][:200]
  config_lib.fail("tpu", config.devices.tpu, f"cannot reach the TPU "
                  f"({type(error).__name__}: {first})")


@functools.lru_cache(maxsize=2)
def _resolver(tpu):
  """TPUClusterResolver(tpu) or the exception it raised; None on timeout.

  The lookup asks the Cloud TPU API, which can hang without a network: it
  runs in a daemon thread that the process may leave behind. Cached, so the
  early check of `preflight.validate_for_run` and `make_distribute` resolve
  once.
  """
  result = {}

  def resolve():
    try:
      result["resolver"] = tf.distribute.cluster_resolver.TPUClusterResolver(
          tpu=tpu)
    except Exception as e:  # pylint: disable=broad-except
      result["error"] = e

  thread = threading.Thread(target=resolve, daemon=True)
  thread.start()
  thread.join(TPU_RESOLVE_TIMEOUT_S)
  return result.get("resolver", result.get("error"))


def resolve_tpu(config):
  """The TPUClusterResolver of --tpu.

  Raises:
    ValueError: one line naming --tpu when the name does not resolve
      within TPU_RESOLVE_TIMEOUT_S.
  """
  resolver = _resolver(config.devices.tpu)
  if resolver is None:
    config_lib.fail("tpu", config.devices.tpu, f"the TPU did not resolve within "
                    f"{TPU_RESOLVE_TIMEOUT_S} s; check the name or use "
                    "grpc://host:port")
  if isinstance(resolver, Exception):
    _unreachable(config, resolver)
  # TF's connect retries a silent address without end, and no signal stops
  # it (the wait is inside one C++ call): probe each worker first.
  silent = [address for tasks in resolver.cluster_spec().as_dict().values()
            for address in (tasks.values() if isinstance(tasks, dict)
                            else tasks)
            if not cluster_checks.reachable(address,
                                            TPU_CONNECT_TIMEOUT_S)]
  if silent:
    config_lib.fail("tpu", config.devices.tpu, f"cannot reach the TPU: nothing "
                    f"accepts connections at {', '.join(silent)} within "
                    f"{TPU_CONNECT_TIMEOUT_S} s")
  return resolver


def connect_cluster(config):
  """placement=cluster: connects this process to the workers.

  Raises:
    ValueError: one line naming the workers that did not come up within
      --cluster_timeout_s.
  """
  spec = cluster_lib.cluster_spec(config.devices.cluster)
  timeout_s = config.devices.cluster_timeout_s
  try:
    cluster_wait.wait_for_workers(spec, timeout_s)  # bounded by itself
    # TF's connect and first remote op have no timeout of their own.
    workers = ",".join(spec.job_tasks(cluster_lib.JOB))
    with stop_watchdog.bounded(timeout_s, f"connecting to the workers "
                               f"{workers} (--cluster_timeout_s="
                               f"{timeout_s:g})"):
      cluster_lib.connect(spec)
  except ConnectionError as e:
    raise ValueError(str(e)) from None
  # A worker that stops answering is named within --cluster_timeout_s.
  stop_watchdog.note_workers(spec.job_tasks(cluster_lib.JOB),
                             config.devices.cluster_timeout_s)


def cluster_failure(config, error):
  """The one line naming the worker a runtime error came from, or None."""
  if not config_lib.runtime_of(config).needs_cluster:
    return None
  return cluster_checks.describe_failure(
      error, cluster_lib.cluster_spec(config.devices.cluster))


def make_distribute(config):
  """TPUStrategy (with K cores per replica), Mirrored on GPUs, or default.

  placement=cluster connects to the workers first (bounded wait) and runs
  under the default strategy: the modules, not replicas, are distributed.

  Raises:
    ValueError: one line naming --tpu when the TPU cannot be reached, or
      --batch_size when it does not divide over the TPU's replicas, or the
      workers of --cluster that did not come up.
  """
  runtime = config_lib.runtime_of(config)
  if runtime.needs_cluster:
    connect_cluster(config)
  if multi_worker.mode(config) == "mirrored":
    return multi_worker.joined(config)[2]
  resolver = resolve_tpu(config) if runtime.needs_tpu else None
  try:
    distribute = runtime.strategy(config.interlock.num_modules, resolver)
  except ConnectionError as e:
    _unreachable(config, e.__cause__ or e)
  config_lib.check_batch(config, distribute.num_replicas_in_sync)
  return distribute
