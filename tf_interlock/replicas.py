"""Replicas x modules across hosts: R pipelines of K modules, one per process.

Each of R processes (hosts) holds a whole copy of the K-module pipeline, with
module k on its local device k (a logical CPU or GPU k). Process r trains on
rows [r B/R, (r+1) B/R) of every global batch of B examples. Every loss is
averaged over the *global* batch, so process r's routed gradient of module k
is g_k^(r) = (1/B) sum over its rows of the per-example gradient, and

  g_k = sum over r of g_k^(r)

is exactly the gradient of one replica on the whole batch. Before module k's
optimizer applies it, g_k is summed over the R processes by one TensorFlow
collective all-reduce (`CollectiveReduceV2`) that runs *on module k's
device*: the group of module k is device k of every process, so the K
all-reduces of a step are K independent groups, and module k can all-reduce
and update while module k + 1 still computes. All copies start from the
same weights and apply the same summed gradients, so they stay identical.

The collective runtime is TensorFlow's: `connect` builds a
`tf.distribute.MultiWorkerMirroredStrategy` from the cluster (TF_CONFIG or a
resolver), which starts this process's gRPC server, waits for its peers and
enables collective ops. The trainer then runs under the default strategy with
this process's own K devices; no thread, queue or RPC of our own.

Data parallelism alone (K modules on one device, R hosts) needs none of
this: run `InterlockTrainer` under the MultiWorkerMirroredStrategy itself
with placement "single".
"""

import collections
import itertools

import tensorflow as tf

from tf_interlock import int_args
from tf_interlock import metric_names
from tf_interlock import placement as placement_lib

# Group and instance keys of our collectives, far from those that
# MultiWorkerMirroredStrategy hands out (it counts from 1).
_GROUP_KEY_BASE = 1_000_000
# Instance keys: module k's n-th traced collective in this process gets
# 2_000_000 + k * _KEYS_PER_MODULE + n. Every process traces module k's
# step the same number of times in the same order, so the key matches on
# every process (this is how collectives find their peers), whatever the
# other modules traced; unique per process, so two trainers in one process
# never share a key. A count per module, not one for the whole process.
_INSTANCE_KEY_BASE = 2_000_000
_KEYS_PER_MODULE = 100_000
_INSTANCE_KEYS = collections.defaultdict(itertools.count)


def _instance_key(k):
  """The next instance key of module k's collective group."""
  n = next(_INSTANCE_KEYS[k])
  if n >= _KEYS_PER_MODULE:
    raise ValueError(f"module {k} traced more than {_KEYS_PER_MODULE} "
                     f"collectives in one process. Received: traces={n + 1}")
  return _INSTANCE_KEY_BASE + k * _KEYS_PER_MODULE + n


class CollectiveReplicas:
  """This process is replica `replica_id` of `num_replicas` pipelines.

  Args:
    num_replicas: R, the processes that each hold all K modules.
    replica_id: this process's index r in [0, R).
    timeout_s: seconds a collective waits for its peers before it fails
      (a dead peer then stops the step instead of hanging it); None waits.
  """

  def __init__(self, num_replicas, replica_id, timeout_s=None):
    for name, value, low in (("num_replicas", num_replicas, 1),
                             ("replica_id", replica_id, 0)):
      if not int_args.is_int(value) or value < low:
        raise ValueError(f"{name} must be an int >= {low}. "
                         f"Received: {name}={value!r}")
    if replica_id >= num_replicas:
      raise ValueError(f"replica_id must be < num_replicas "
                       f"({num_replicas}). Received: replica_id={replica_id}")
    num_replicas, replica_id = int(num_replicas), int(replica_id)
    self.num_replicas = num_replicas
    self.replica_id = replica_id
    self.timeout_s = timeout_s

  def check_trainer(self, distribute, float16):
    """Raises unless a trainer with these settings can use the replicas."""
    if self.num_replicas == 1:
      return
    if distribute.num_replicas_in_sync > 1:
      raise ValueError(
          f"replicas sums gradients over processes itself; run the trainer "
          f"under the default strategy, not one with "
          f"{distribute.num_replicas_in_sync} replicas. Received: "
          f"replicas={self}")
    if float16:
      raise ValueError(
          "mixed_float16 is not supported with replicas across processes "
          "(the loss-scale skip decision is not shared); use float32 or "
          f"mixed_bfloat16. Received: replicas={self}")

  def all_reduce(self, k, tensors):
    """Sums `tensors` over the R replicas, on the current device.

    Call it under module k's device scope. Every tensor is flattened into
    one float32 vector, so module k needs one collective per step whatever
    its number of variables.

    Args:
      k: the 0-based module index: the collective group of module k.
      tensors: a list of tensors (module k's gradients and metrics).

    Returns:
      The summed tensors, same shapes and dtypes.
    """
    if self.num_replicas == 1:
      return list(tensors)
    flat = tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1])
                      for t in tensors], axis=0)
    summed = tf.raw_ops.CollectiveReduceV2(
        input=flat, group_size=self.num_replicas,
        group_key=_GROUP_KEY_BASE + k, instance_key=_instance_key(k),
        ordering_token=[], merge_op="Add", final_op="Id",
        communication_hint="ring",
        timeout_seconds=float(self.timeout_s or 0))
    sizes = [int(t.shape.num_elements()) for t in tensors]
    return [tf.cast(tf.reshape(part, t.shape), t.dtype)
            for part, t in zip(tf.split(summed, sizes), tensors)]

  def sum_module(self, k, grads, metrics):
    """Module k's gradients summed over the replicas, with its metrics.

    One collective on module k's device carries the gradients and module
    k's entries of `metrics` (each already this replica's share of the
    global mean), which are replaced by their sums: every process then
    reports the whole batch's loss and accuracy.

    Args:
      k: the 0-based module index.
      grads: module k's gradients (this replica's share).
      metrics: the step's metrics, keyed by `metric_names.metric_name`;
        module k's are updated in place.

    Returns:
      The summed gradients.
    """
    keys = sorted(key for key in metrics
                  if metric_names.parse_metric_name(key)[0] == k)
    summed = self.all_reduce(k, list(grads) + [metrics[key] for key in keys])
    metrics.update(zip(keys, summed[len(grads):]))
    return summed[:len(grads)]

  def shard(self, dataset):
    """Global batches of B -> this replica's B / R rows of each."""
    num, index = self.num_replicas, self.replica_id
    if num == 1:
      return dataset

    for spec in tf.nest.flatten(dataset.element_spec):
      size = spec.shape[0] if spec.shape.rank else None
      if size is None or size % num:
        raise ValueError(
            f"The global batch must be static (drop_remainder=True) and "
            f"divide into {num} replicas. Received: batch_size={size}")
    per = size // num

    def take_rows(*batch):
      rows = tf.nest.map_structure(
          lambda t: t[index * per:(index + 1) * per], batch)
      return rows[0] if len(rows) == 1 else rows
    return dataset.map(take_rows)

  def __repr__(self):
    return (f"CollectiveReplicas(num_replicas={self.num_replicas}, "
            f"replica_id={self.replica_id})")


def _task_order(cluster_spec):
  """Every (task_type, task_id) of the cluster, chief first."""
  jobs = cluster_spec.as_dict()
  tasks = []
  for job in ("chief", "worker"):
    count = cluster_spec.num_tasks(job) if job in jobs else 0
    tasks += [(job, i) for i in range(count)]
  return tasks


def connect(resolver=None, num_modules=1, kind="simulated", timeout_s=None,
            intra_op_threads=1):
  """Joins the cluster; returns this process's replicas and placement.

  Call it first, before any other TF op: collective ops can only be
  configured before the runtime starts. Where module k goes on logical CPU
  k ("simulated") it also splits the host CPU into K logical devices (as
  `configure_simulated_devices`). Every task of the cluster (its "chief"
  and "worker" jobs, chief first) is one replica.

  Args:
    resolver: a `tf.distribute.cluster_resolver.ClusterResolver`; None reads
      TF_CONFIG.
    num_modules: K; module k goes on local device k.
    kind: a placement whose `replica_device_type` is set: "simulated"
      (logical CPU k) or "gpu" (GPU k).
    timeout_s: see `CollectiveReplicas`.
    intra_op_threads: threads each op may use, where the host CPU is split
      ("simulated").

  Returns:
    `(replicas, placement, strategy)`: the `CollectiveReplicas`, the
    `placement.Placement` of module k on this task's device k, and the
    `MultiWorkerMirroredStrategy` that holds the collective runtime (keep it;
    do not train under it).

  Raises:
    ValueError: an unknown kind, a task that is not part of the cluster, or
      fewer local devices than modules.
  """
  allowed = tuple(name for name in placement_lib.names()
                  if placement_lib.get(name).replica_device_type)
  if kind not in allowed:
    raise ValueError(f"Replicas x modules places module k on local device "
                     f"k: kind must be one of {allowed}. "
                     f"Received: kind={kind!r}")
  placement_cls = placement_lib.get(kind)
  resolver = resolver or (
      tf.distribute.cluster_resolver.TFConfigClusterResolver())
  tasks = _task_order(resolver.cluster_spec())
  me = (resolver.task_type, resolver.task_id)
  if me not in tasks:
    raise ValueError(f"This task is not in the cluster {tasks}. "
                     f"Received: task={me}")
  device_type = placement_cls.replica_device_type
  try:
    if device_type == "CPU":  # K logical CPUs, as the placement needs
      placement_lib.split_host_cpu(num_modules, intra_op_threads)
  except RuntimeError as e:
    raise RuntimeError(
        f"replicas.connect must run before the TF runtime starts (before "
        f"any tensor or device listing). Received: num_modules="
        f"{num_modules}") from e
  strategy = tf.distribute.MultiWorkerMirroredStrategy(
      cluster_resolver=resolver)
  devices = [f"/job:{me[0]}/replica:0/task:{me[1]}/device:"
             f"{device_type}:{k}" for k in range(num_modules)]
  found = [d.name for d in tf.config.list_logical_devices(device_type)]
  missing = [d for d in devices
             if not any(placement_lib.same_device(d, f) for f in found)]
  if missing:
    raise ValueError(
        f"Module k goes on local {device_type} device k, but this task "
        f"lacks {missing}. Received: num_modules={num_modules}")
  replicas = CollectiveReplicas(len(tasks), tasks.index(me), timeout_s)
  return replicas, placement_cls(devices=devices), strategy
