"""Replicas x modules across processes: R = 2 pipelines of K = 2 modules.

Two processes on loopback each hold both modules (module k on its logical
CPU k) and train on half of every global batch; module k's gradients are
summed over the two processes by a collective on CPU k. The weights must
equal one process's run on the whole batch.
"""

import pytest
import tensorflow as tf

from tests import cluster_jobs
from tests import replica_job
from tf_interlock import replicas as replicas_lib

STRATEGIES = ("2wise", "e2e", "local")


@pytest.mark.cluster
def test_two_replicas_of_two_modules_equal_one_on_the_whole_batch(tmp_path):
  saved = cluster_jobs.run_replica_jobs(tmp_path, "modules", STRATEGIES)
  for strategy in STRATEGIES:
    for task, run in enumerate(saved):
      # One all-reduce per module and step, on that module's own device.
      steps = replica_job.STEPS_PER_LOOP
      assert list(run[f"{strategy}/collective_devices"]) == [
          f"/job:worker/replica:0/task:{task}/device:CPU:{k}"
          for k in range(replica_job.K) for _ in range(steps)]


def test_one_replica_changes_nothing():
  replicas = replicas_lib.CollectiveReplicas(1, 0)
  tensors = [tf.ones([2, 3]), tf.constant(4.0)]
  assert replicas.all_reduce(0, tensors) == tensors
  dataset = tf.data.Dataset.range(8).batch(4)
  assert replicas.shard(dataset) is dataset


def test_instance_keys_count_per_module_not_per_process():
  # Module k's n-th collective has the same key whatever other modules
  # traced in between (a global count would shift it), and keys never
  # repeat in one process.
  keys = replicas_lib._instance_key  # pylint: disable=protected-access
  first = {k: keys(k) for k in (0, 1)}
  for _ in range(3):
    keys(0)
  second = keys(1)
  assert second == first[1] + 1
  assert keys(0) == first[0] + 4
  assert len({first[0], first[1], second}) == 3
  assert all(key < 2**31 for key in (first[0], first[1], second))


def test_shard_gives_each_replica_its_rows():
  dataset = tf.data.Dataset.from_tensor_slices(
      (tf.range(16), tf.range(16) * 10)).batch(8, drop_remainder=True)
  rows = [[(x.numpy().tolist(), y.numpy().tolist()) for x, y in
           replicas_lib.CollectiveReplicas(2, r).shard(dataset)]
          for r in range(2)]
  assert rows[0] == [([0, 1, 2, 3], [0, 10, 20, 30]),
                     ([8, 9, 10, 11], [80, 90, 100, 110])]
  assert rows[1][0] == ([4, 5, 6, 7], [40, 50, 60, 70])
  with pytest.raises(ValueError, match="Received: batch_size=3"):
    replicas_lib.CollectiveReplicas(2, 0).shard(
        tf.data.Dataset.range(6).batch(3, drop_remainder=True))
  with pytest.raises(ValueError, match="Received: batch_size=None"):
    replicas_lib.CollectiveReplicas(2, 0).shard(
        tf.data.Dataset.range(6).batch(2))


@pytest.mark.parametrize("args,match", [
    ((0, 0), "Received: num_replicas=0"),
    ((2, 2), "Received: replica_id=2"),
    ((2, -1), "Received: replica_id=-1"),
    ((True, 0), "Received: num_replicas=True"),
])
def test_bad_replicas(args, match):
  with pytest.raises(ValueError, match=match):
    replicas_lib.CollectiveReplicas(*args)


def test_replicas_refuse_a_mirrored_strategy_and_float16(mirrored):
  replicas = replicas_lib.CollectiveReplicas(2, 0)
  with pytest.raises(ValueError, match="not one with 2 replicas"):
    replicas.check_trainer(mirrored, float16=False)
  with pytest.raises(ValueError, match="mixed_float16 is not supported"):
    replicas.check_trainer(tf.distribute.get_strategy(), float16=True)
  replicas.check_trainer(tf.distribute.get_strategy(), float16=False)


def test_connect_refuses_other_placements():
  with pytest.raises(ValueError, match="Received: kind='tpu'"):
    replicas_lib.connect(num_modules=2, kind="tpu")


@pytest.mark.cluster
def test_train_binary_replicas_of_modules_only_the_chief_writes(
    tmp_path, monkeypatch):
  # TF_CONFIG + placement=simulated: two hosts of K = 4 logical CPUs each.
  cluster_jobs.check_train_binary_equals_one_process(
      tmp_path, monkeypatch, "simulated")


@pytest.mark.cluster
def test_a_dead_replica_stops_the_other_instead_of_hanging(tmp_path):
  logs = cluster_jobs.run_cluster(
      "tests.replica_job",
      [[tmp_path / f"task_{i}.npz", "dead_peer", "2wise"] for i in range(2)],
      tmp_path, exit_codes=[1, 3])
  assert "replica_job dying" in logs[1]
  assert "replica_job done" not in logs[0]
  assert not (tmp_path / "task_0.npz").exists()
  # The collective is aborted with an error naming the dead task.
  assert "UnavailableError" in logs[0] and "task:1" in logs[0]
