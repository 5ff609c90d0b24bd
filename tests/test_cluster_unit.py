"""placement=cluster without processes: parsing, t(k), errors, messages.

The tests with real worker processes are test_cluster.py,
test_cluster_faults.py and test_cluster_readme.py (marker `cluster`).
"""

import dataclasses
import json
import socket

import keras
import pytest
import tensorflow as tf

from tf_interlock import cluster as cluster_lib
from tf_interlock import placement as placement_lib
from train import cluster_checks
from train import config as config_lib


@pytest.mark.parametrize("text, match", [
    ("", "comma-separated list of host:port"),
    ("a:1,,b:2", "no empty entry"),
    ("localhost", "'localhost' is not host:port"),
    ("h:0", "'h:0' is not host:port"),
    ("h:65536", "port in 1..65535"),
    (":80", "':80' is not host:port"),
    ("h:1,h:1", "names h:1 twice"),
])
def test_bad_cluster_lists_are_one_line(text, match):
  with pytest.raises(ValueError, match=match) as info:
    cluster_lib.parse_addresses(text)
  assert "\n" not in str(info.value)
  assert str(info.value).endswith(f"Received: cluster={text!r}")


def test_cluster_list_and_tf_config_give_the_same_spec():
  text = "10.0.0.1:2222, 10.0.0.2:2223"
  spec = cluster_lib.cluster_spec(text)
  assert spec.job_tasks("worker") == ["10.0.0.1:2222", "10.0.0.2:2223"]
  env = {"TF_CONFIG": json.dumps({
      "cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2223"]},
      "task": {"type": "worker", "index": 1}})}
  assert cluster_lib.cluster_spec(None, env).as_dict() == spec.as_dict()
  with pytest.raises(ValueError, match="needs --cluster=host:port"):
    cluster_lib.cluster_spec(None, {})
  with pytest.raises(ValueError, match="Received: TF_CONFIG="):
    cluster_lib.cluster_spec(None, {"TF_CONFIG": '{"cluster": {}}'})


def test_module_workers():
  assert cluster_lib.module_workers(3, 3) == [0, 1, 2]
  assert cluster_lib.module_workers(4, 2, 2) == [0, 0, 1, 1]
  assert cluster_lib.module_workers(3, 2, 2) == [0, 0, 1]
  with pytest.raises(ValueError, match="need 3 workers; the cluster has 2"):
    cluster_lib.module_workers(3, 2)
  with pytest.raises(ValueError, match="modules_per_worker=0"):
    cluster_lib.module_workers(3, 3, 0)


def test_remote_devices_are_not_local_ones():
  worker1 = cluster_lib.worker_device(1)
  assert worker1 == "/job:worker/replica:0/task:1/device:CPU:0"
  assert placement_lib.same_device(worker1, "/job:worker/task:1/cpu:0")
  assert not placement_lib.same_device(worker1, "/job:worker/task:0/cpu:0")
  # A name without a job is this process's device, not a worker's.
  assert not placement_lib.same_device(worker1, "/device:CPU:0")
  assert placement_lib.same_device(
      "/job:localhost/replica:0/task:0/device:CPU:0", "/device:CPU:0")


def test_check_variables_names_a_variable_left_on_the_client():
  placement = placement_lib.Placement(
      "cluster", [cluster_lib.worker_device(0), cluster_lib.worker_device(1)])
  with tf.device("/cpu:0"):
    local = keras.Variable(1.0)
  with pytest.raises(ValueError, match=r"on /job:localhost/.*CPU:0; it "
                     r"belongs on /job:worker/replica:0/task:1"):
    placement.check_variables(1, [("weight 'w'", local)])


def test_cluster_placement_needs_a_connection():
  assert cluster_lib.worker_devices() == []
  with pytest.raises(ValueError, match="cluster_lib.connect|cluster.connect"):
    placement_lib.make_placement("cluster", 2)


def test_a_dead_worker_is_named():
  spec = cluster_lib.cluster_spec("127.0.0.1:4001,127.0.0.1:4002")
  by_task = tf.errors.UnavailableError(None, None, (
      "remote target has been disconnected\nAdditional GRPC error "
      "information from remote target /job:worker/replica:0/task:1"
      "/device:CPU:0 while calling /tensorflow.eager.EagerService/Enqueue"))
  by_port = tf.errors.UnavailableError(None, None, (
      "failed to connect to all addresses; last error: UNKNOWN: "
      "ipv4:127.0.0.1:4002: Failed to connect to remote host"))
  for error in (by_task, by_port):
    line = cluster_checks.describe_failure(error, spec)
    assert line.startswith("worker task 1 (127.0.0.1:4002) failed"), line
    assert "\n" not in line
  other = tf.errors.InvalidArgumentError(None, None, "shapes differ")
  assert cluster_checks.describe_failure(other, spec) is None


def test_a_dead_worker_unnamed_by_tf_is_found_by_its_port():
  """"Connection reset by peer" names no worker: the one whose port
  refuses connections is named; task 0 still listens."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    dead_port = s.getsockname()[1]
  listening = socket.socket()
  listening.bind(("127.0.0.1", 0))
  listening.listen(1)
  try:
    addresses = [f"127.0.0.1:{listening.getsockname()[1]}",
                 f"127.0.0.1:{dead_port}"]
    spec = cluster_lib.cluster_spec(",".join(addresses))
    reset = tf.errors.UnavailableError(
        None, None, "recvmsg:Connection reset by peer")
    line = cluster_checks.describe_failure(reset, spec)
    assert line.startswith(f"worker task 1 ({addresses[1]}) failed"), line
  finally:
    listening.close()


def test_a_worker_still_going_down_is_named_once_it_refuses(monkeypatch):
  """A killed worker's port may accept for a moment: describe_failure asks
  again until one refuses. Here task 1's port closes during the first
  wait between two rounds of asking (no timer, no race)."""
  listening = []
  for _ in range(2):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)  # never accepted: room for every probe's connection
    listening.append(s)
  addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in listening]
  spec = cluster_lib.cluster_spec(",".join(addresses))
  reset = tf.errors.UnavailableError(
      None, None, "recvmsg:Connection reset by peer")
  waits = []

  def sleep(seconds):  # the wait between two rounds: task 1 goes down
    waits.append(seconds)
    listening[1].close()

  monkeypatch.setattr(cluster_checks.time, "sleep", sleep)
  try:
    line = cluster_checks.describe_failure(reset, spec, window_s=30.0)
    assert line.startswith(f"worker task 1 ({addresses[1]}) failed"), line
    assert waits == [0.5]  # both accepted once; asked again after 0.5 s
  finally:
    for s in listening:
      s.close()


def test_a_lost_worker_is_one_line_even_when_every_worker_accepts():
  """UnavailableError while every port accepts: one line that says so,
  with TF's first line and the cluster, never TF's raw message."""
  listening = socket.socket()
  listening.bind(("127.0.0.1", 0))
  listening.listen(1)
  try:
    address = f"127.0.0.1:{listening.getsockname()[1]}"
    spec = cluster_lib.cluster_spec(address)
    reset = tf.errors.UnavailableError(
        None, None, "recvmsg:Connection reset by peer\nmore detail")
    line = cluster_checks.describe_failure(reset, spec, window_s=0.0)
  finally:
    listening.close()
  assert line.startswith("a worker failed or became unreachable "
                         "(UnavailableError: recvmsg:Connection reset by "
                         "peer), but every worker"), line
  assert address in line and "\n" not in line and "rerun to resume" in line


def test_missing_workers_are_named_after_a_bounded_wait():
  spec = cluster_lib.cluster_spec("127.0.0.1:1,127.0.0.1:2")
  with pytest.raises(ConnectionError, match=r"task 0 \(127.0.0.1:1\), "
                     r"task 1 \(127.0.0.1:2\) after 0.5 s"):
    cluster_lib.connect(spec, timeout_s=0.5)


def _config(**fields):
  base = config_lib.load_preset("synthetic_mlp")
  return dataclasses.replace(base, **fields)


@pytest.mark.parametrize("fields, match", [
    (dict(placement="cluster"), "--cluster=None is invalid: placement="
     "cluster needs --cluster"),
    (dict(placement="cluster", cluster="h:1,h:x"), "'h:x' is not host:port"),
    (dict(placement="cluster", cluster="h:1,h:2"), "--modules_per_worker=1 "
     "is invalid: 4 modules at 1 per worker need 4 workers"),
    (dict(placement="simulated", cluster="h:1"), "applies only to "
     "placement=cluster"),
    (dict(modules_per_worker=2), "--modules_per_worker=2 is invalid: "
     "applies only to placement=cluster"),
    (dict(placement="cluster", cluster="h:1,h:2", modules_per_worker=0),
     "--modules_per_worker=0 is invalid: must be an integer >= 1"),
])
def test_config_refuses_bad_cluster_settings(fields, match, monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  with pytest.raises(ValueError, match=match) as info:
    config_lib.validate(_config(**fields))
  assert "\n" not in str(info.value)


def test_config_accepts_a_cluster():
  config_lib.validate(_config(placement="cluster", cluster="h:1,h:2",
                              modules_per_worker=2))
