"""The train binary on several hosts, configured by TF_CONFIG.

When TF_CONFIG names this process as a task ("chief" or "worker"), every
task runs the same `python -m train.train ...` command and they train one
model together:

* placement=single: `MultiWorkerMirroredStrategy`. Each host holds all K
  modules on its device; the global batch is split over the hosts and each
  module's optimizer sums its gradients over them (data parallelism).
* placement=simulated or gpu: replicas x modules (`tf_interlock.replicas`).
  Each host holds all K modules, module k on its local device k, and module
  k's gradients are summed over the hosts by a collective on device k.

Only the chief (the "chief" task, else worker 0) writes --model_dir and
--export_dir. Every other task trains into a private temporary directory
(its checkpoints, summaries and export are needed by nothing), removed when
it ends, and resumes from the chief's latest checkpoint in --model_dir,
which must therefore be on a filesystem every host reads (gs:// or NFS; on
one machine, any path). placement=tpu and cluster ignore TF_CONFIG's task:
there one client drives every host.
"""

import atexit
import dataclasses
import json
import os
import tempfile

import tensorflow as tf

from tf_interlock import replicas as replicas_lib
from train import cluster_checks
from train import config as config_lib
from train import owned_dir
from train import placement_runtime
from train import paths
from train import placement_runtime
from train import stop_signals
from train import stop_watchdog

_TEMP_PREFIX = "tf_interlock_task_"
# The non-chief model_dirs `task_config` made in this process.
_OWN_DIRS = set()


def _tf_config():
  """TF_CONFIG as a dict with a dict "cluster" and "task" (possibly empty).

  Raises:
    ValueError: one line naming TF_CONFIG when it is not such JSON.
  """
  text = os.environ.get("TF_CONFIG") or "{}"
  shape = ('TF_CONFIG must be a JSON object such as {"cluster": {"worker": '
           '["host:port", ...]}, "task": {"type": "worker", "index": 0}}')
  try:
    value = json.loads(text)
  except ValueError as e:
    raise ValueError(f"{shape}; it is not JSON ({e}). "
                     f"Received: TF_CONFIG={text[:200]!r}") from None
  if not isinstance(value, dict):
    raise ValueError(f"{shape}, not a JSON {type(value).__name__}. "
                     f"Received: TF_CONFIG={text[:200]!r}")
  for key in ("cluster", "task"):
    if not isinstance(value.get(key) or {}, dict):
      raise ValueError(f"{shape}: its {key!r} must be an object. "
                       f"Received: TF_CONFIG={text[:200]!r}")
  index = (value.get("task") or {}).get("index", 0)
  if isinstance(index, bool) or not isinstance(index, int) or index < 0:
    raise ValueError(f"{shape}: task.index must be an int >= 0. "
                     f"Received: TF_CONFIG={text[:200]!r}")
  jobs = value.get("cluster") or {}
  if not all(isinstance(v, list) and all(isinstance(a, str) for a in v)
             for v in jobs.values()):
    raise ValueError(f"{shape}: every cluster job must be a list of "
                     f"host:port. Received: TF_CONFIG={text[:200]!r}")
  for address in (a for v in jobs.values() for a in v):
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
      raise ValueError(f"{shape}: cluster entry {address!r} is not "
                       f"host:port with a port in 1..65535. "
                       f"Received: TF_CONFIG={text[:200]!r}")
  task = value.get("task") or {}
  if task and task.get("type") not in ("chief", "worker"):
    # Else a "ps" or "evaluator" task would train alone, saying nothing.
    raise ValueError(f"{shape}: task.type must be 'chief' or 'worker' "
                     f"(no parameter servers or evaluators here). "
                     f"Received: TF_CONFIG={text[:200]!r}")
  count = len(jobs.get(task.get("type"), []))
  if task and index >= count:
    raise ValueError(f"{shape}: task.index={index} must name one of the "
                     f"{count} {task['type']!r} tasks of its cluster"
                     f"{f' (0..{count - 1})' if count else ''}. "
                     f"Received: TF_CONFIG={text[:200]!r}")
  return value


def _check_task(config, value):
  """Refuses a TF_CONFIG that names a cluster but not this process's task:
  it would train alone, without a word. placement=cluster and tpu read
  only the cluster (one client drives every host)."""
  jobs = value.get("cluster") or {}
  runtime = placement_runtime.of(config.devices.placement)
  if value.get("task") or runtime.needs_cluster or runtime.needs_tpu:
    return
  if jobs.get("chief") or jobs.get("worker"):
    text = os.environ.get("TF_CONFIG", "")
    raise ValueError(
        f'TF_CONFIG names a cluster ({", ".join(sorted(jobs))}) but no '
        f'"task": this process would train alone, not as one of its tasks; '
        f'add "task": {{"type": "worker", "index": N}} naming this process '
        f"(every task runs the same command), or unset TF_CONFIG to train "
        f"alone; nothing was written. Received: TF_CONFIG={text[:200]!r}")


def mode(config):
  """"mirrored", "replicas" or None (this process trains alone).

  Raises:
    ValueError: TF_CONFIG is malformed, or names a cluster but no task.
  """
  value = _tf_config()
  _check_task(config, value)
  task = value.get("task") or {}
  if task.get("type") not in ("chief", "worker"):
    return None
  if config_lib.runtime_of(config).data_parallel:
    return "mirrored"
  if config_lib.placement_of(config).replica_device_type:
    return "replicas"
  return None


def num_tasks():
  """Tasks of TF_CONFIG's "chief" and "worker" jobs."""
  cluster = _tf_config().get("cluster", {})
  return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def is_chief(config):
  """Whether this process writes the run (True when it trains alone)."""
  if mode(config) is None:
    return True
  task = _tf_config()["task"]
  has_chief = bool(_tf_config().get("cluster", {}).get("chief"))
  return task["type"] == "chief" or (
      not has_chief and int(task.get("index", 0)) == 0)


# The job this process joined: {(kind, K, timeout): what connect returned}.
# TF's runtime joins one job per process, before its first op.
_JOINED = {}


def _job(config):
  """The job config's task joins, as a key of _JOINED; None: it trains
  alone."""
  how = mode(config)
  if how is None:
    return None
  kind = "mirrored" if how == "mirrored" else config.devices.placement
  return kind, config.interlock.num_modules, config.devices.cluster_timeout_s


def join(config, intra_op_threads=1):
  """Joins the job TF_CONFIG names; before any other TF op.

  `runtime_setup.setup_runtime` is the one caller: it knows the run's
  threading plan, whose threads per device a simulated replicas task's
  logical devices get. A process joins once; a later call for the same
  job (setup_runtime runs in preflight and again in the run) returns what
  the first one did. Everything after setup_runtime reads it with `joined`.

  Returns:
    `(replicas, placement, strategy)` (see `replicas.connect`; "mirrored":
    `(None, None, MultiWorkerMirroredStrategy)`), or None alone.
  """
  job = _job(config)
  if job is None:
    return None
  if job not in _JOINED:
    kind, num_modules, timeout_s = job
    # TF's join waits for every task for an hour and does not act on
    # SIGTERM meanwhile: the peers are awaited first, with the deadline
    # (cluster_checks.wait_for_peers), and what is left of TF's join is
    # bounded by the watchdog.
    own, peers = _addresses()
    cluster_checks.wait_for_peers(peers, own, timeout_s)
    with stop_watchdog.bounded(
        timeout_s, f"joining TF_CONFIG's job once its {len(peers) + 1} "
        f"tasks listened (--cluster_timeout_s={timeout_s:g})"):
      if kind == "mirrored":
        _JOINED[job] = (None, None,
                        tf.distribute.MultiWorkerMirroredStrategy())
      else:
        # A collective waits --cluster_timeout_s for its peers: a dead
        # peer then fails the step instead of hanging every other task.
        _JOINED[job] = replicas_lib.connect(
            num_modules=num_modules, kind=kind, timeout_s=timeout_s,
            intra_op_threads=intra_op_threads
            if placement_runtime.of(kind).splits_host_cpu else 1)
    # TF's C++ took SIGTERM over (its preemption notifier): give it back.
    stop_signals.reinstall()
  return _JOINED[job]


def _addresses():
  """(this task's "host:port", {"worker 1": "host:port", ...} of the
  other tasks of TF_CONFIG's chief and worker jobs)."""
  value = _tf_config()
  task = value["task"]
  own, peers = None, {}
  for kind in ("chief", "worker"):
    for index, address in enumerate(value["cluster"].get(kind, [])):
      if kind == task["type"] and index == int(task.get("index", 0)):
        own = address
      else:
        peers[f"{kind} {index}"] = address
  return own, peers


def joined(config):
  """What `join` returned for config's job, or None when it trains alone.

  Raises:
    RuntimeError: the task has not joined yet (`setup_runtime` joins).
  """
  job = _job(config)
  if job is None:
    return None
  if job not in _JOINED:
    raise RuntimeError(
        f"This task of a TF_CONFIG job has not joined it: "
        f"runtime_setup.setup_runtime(config) joins, before any other TF op. "
        f"Received: placement={config.devices.placement}")
  return _JOINED[job]


def task_config(config):
  """The config this task runs: a non-chief's model_dir is its own.

  Returns:
    `(config, shared_model_dir)`: for a non-chief, model_dir is a new
    empty temporary folder (`tempfile.mkdtemp`, removed by
    `remove_own_dir`), export_dir None, and
    shared_model_dir the chief's --model_dir to resume from; otherwise
    `(config, None)`.
  """
  if is_chief(config):
    return config, None
  task = _tf_config()["task"]
  # A new folder of a name no one can guess or hold (not a pid's name).
  own = tempfile.mkdtemp(
      prefix=f"{_TEMP_PREFIX}{task['type']}_{task.get('index', 0)}_")
  _OWN_DIRS.add(own)
  # Left empty by a run that failed before training: removed at exit.
  atexit.register(_remove_if_empty, own)
  return dataclasses.replace(config, model_dir=own,
                             export_dir=None), config.run.model_dir


def check_fresh(config, latest, shared_run):
  """Refuses to resume a multi-worker job, before anything is written.

  Resuming needs every task to restore the same step, and each task's
  input position is its own shard's: not supported yet.

  Args:
    config: this task's config (`task_config`).
    latest: the checkpoint this task's model_dir would resume from.
    shared_run: a non-chief's `RunDir` of the chief's --model_dir, or None.

  Raises:
    ValueError: one line naming --model_dir when it holds a checkpoint.
  """
  if mode(config) is None:
    return
  if shared_run is not None and shared_run.exists():
    latest = latest or shared_run.latest_checkpoint(for_writing=False)
  if latest:
    where = shared_run.path if shared_run is not None else config.run.model_dir
    raise ValueError(
        f"--model_dir holds a checkpoint ({latest}); resuming a multi-worker "
        f"(TF_CONFIG) run is not supported yet: start it in a new "
        f"model_dir. Received: model_dir={where}")


def input_position(config, iterator):
  """{"iterator": iterator}, or {} for a MultiWorkerMirroredStrategy task.

  That strategy's distributed iterator cannot be checkpointed; multi-worker
  runs do not resume (`check_fresh`), so they need no input position.
  """
  return {} if mode(config) == "mirrored" else {"iterator": iterator}


def _remove_if_empty(path):
  try:
    os.rmdir(path)
  except OSError:
    pass  # gone already, or it holds files: remove_own_dir's to decide


def remove_own_dir(config):
  """Removes a non-chief's temporary model_dir, which this run made.

  Only a folder that `task_config` made in this process (it records each)
  is removed; any other model_dir is left as it is.

  Args:
    config: the task's config (`task_config`).
  """
  if (config.run.model_dir in _OWN_DIRS and not is_chief(config) and
      tf.io.gfile.exists(config.run.model_dir)):
    owned_dir.remove(paths.parent(config.run.model_dir),
                     config.run.model_dir)
    _OWN_DIRS.discard(config.run.model_dir)
