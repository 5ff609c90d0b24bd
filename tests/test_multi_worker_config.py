"""train/multi_worker.py: how TF_CONFIG makes the binary a task of a job.

No processes: these read TF_CONFIG only (joining a job is tested with real
processes in test_multi_worker_mirrored.py and test_cluster_replicas.py).
"""

import contextlib
import dataclasses
import json
import os
import socket
import tempfile
import time

import pytest

from train.run_dir import RunDir
from train import config as config_lib
from train import multi_worker

CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2",
                                                "127.0.0.1:3"]}


def _config(placement="single", model_dir="/tmp/shared_run"):
  return dataclasses.replace(config_lib.load_preset("synthetic_mlp"),
                             placement=placement, model_dir=model_dir,
                             export_dir="/tmp/shared_export")


def _task(monkeypatch, job, index, cluster=None):
  monkeypatch.setenv("TF_CONFIG", json.dumps(
      {"cluster": cluster or CLUSTER, "task": {"type": job, "index": index}}))


@pytest.mark.parametrize("placement,mode", [
    ("single", "mirrored"), ("simulated", "replicas"), ("gpu", "replicas"),
    ("tpu", None), ("cluster", None)])
def test_mode_follows_the_placement(monkeypatch, placement, mode):
  _task(monkeypatch, "worker", 0)
  assert multi_worker.mode(_config(placement)) == mode
  assert multi_worker.num_tasks() == 3


def test_alone_without_a_task(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  config = _config()
  assert multi_worker.mode(config) is None
  assert multi_worker.is_chief(config)
  assert multi_worker.task_config(config) == (config, None)
  # A TF_CONFIG naming only the cluster is a client's under
  # placement=cluster or tpu (one client drives every host): no task.
  monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": CLUSTER}))
  for placement in ("cluster", "tpu"):
    assert multi_worker.mode(_config(placement)) is None


@pytest.mark.parametrize("placement", ["single", "simulated", "gpu"])
def test_a_cluster_without_a_task_is_refused(monkeypatch, placement):
  # Else the process would train alone, without a word (issue 46).
  text = json.dumps({"cluster": CLUSTER})
  monkeypatch.setenv("TF_CONFIG", text)
  with pytest.raises(ValueError) as e:
    multi_worker.task_config(_config(placement))
  assert str(e.value) == (
      'TF_CONFIG names a cluster (chief, worker) but no "task": this '
      'process would train alone, not as one of its tasks; add "task": '
      '{"type": "worker", "index": N} naming this process (every task runs '
      'the same command), or unset TF_CONFIG to train alone; nothing was '
      f'written. Received: TF_CONFIG={text!r}')


def test_only_the_chief_keeps_model_dir(monkeypatch):
  config = _config()
  _task(monkeypatch, "chief", 0)
  assert multi_worker.is_chief(config)
  assert multi_worker.task_config(config) == (config, None)
  _task(monkeypatch, "worker", 0)
  assert not multi_worker.is_chief(config)
  own, shared = multi_worker.task_config(config)
  assert shared == "/tmp/shared_run"
  assert own.run.model_dir != config.run.model_dir and own.run.export_dir is None
  assert os.path.basename(own.run.model_dir).startswith("tf_interlock_task_")
  # Without a chief job, worker 0 is the chief.
  workers = {"worker": CLUSTER["worker"]}
  _task(monkeypatch, "worker", 0, workers)
  assert multi_worker.is_chief(config)
  _task(monkeypatch, "worker", 1, workers)
  assert not multi_worker.is_chief(config)


def test_a_worker_removes_only_its_own_new_dir(monkeypatch, tmp_path):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  _task(monkeypatch, "worker", 1)
  own, _ = multi_worker.task_config(_config())
  # A new private folder (mkdtemp), not a name derived from the pid.
  assert os.path.dirname(own.run.model_dir) == str(tmp_path)
  assert os.listdir(own.run.model_dir) == []
  assert os.stat(own.run.model_dir).st_mode & 0o777 == 0o700
  assert str(os.getpid()) not in os.path.basename(own.run.model_dir)
  assert multi_worker.task_config(_config())[0].run.model_dir != own.run.model_dir
  os.makedirs(os.path.join(own.run.model_dir, "checkpoints"))
  # A folder of the same pattern that task_config did not make stays.
  other = tmp_path / "tf_interlock_task_worker_1_12345"
  os.makedirs(other / "checkpoints")
  multi_worker.remove_own_dir(
      dataclasses.replace(own, model_dir=str(other)))
  assert os.path.isdir(other / "checkpoints")
  multi_worker.remove_own_dir(_config(model_dir=str(tmp_path)))
  assert os.path.isdir(tmp_path)  # not a task directory
  multi_worker.remove_own_dir(own)
  assert not os.path.exists(own.run.model_dir)


def test_join_gives_the_collectives_the_cluster_timeout(monkeypatch):
  # What join hands replicas.connect (joining for real needs processes:
  # test_cluster_replicas.py); a stub records the call.
  calls = []
  monkeypatch.setattr(multi_worker.replicas_lib, "connect",
                      lambda **kwargs: calls.append(kwargs) or kwargs)
  _forget_the_join(monkeypatch)
  with _listening_peers(monkeypatch, "worker", 1):
    config = dataclasses.replace(_config(placement="simulated"),
                                 cluster_timeout_s=7.5)
    multi_worker.join(config)
  assert calls[0]["timeout_s"] == 7.5


@contextlib.contextmanager
def _listening_peers(monkeypatch, job, index):
  """TF_CONFIG's task (job, index) of a chief and two workers on 127.0.0.1,
  whose other tasks listen (join awaits them first:
  cluster_checks.wait_for_peers); this task's own port is free."""
  peers = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
  with contextlib.ExitStack() as stack:
    for peer in peers:
      stack.enter_context(peer)
    addresses = [f"127.0.0.1:{p.getsockname()[1]}" for p in peers]
    peers[(job == "worker") + index].close()
    _task(monkeypatch, job, index, cluster={"chief": addresses[:1],
                                            "worker": addresses[1:]})
    yield


def test_join_names_the_peers_that_do_not_listen(monkeypatch):
  _forget_the_join(monkeypatch)
  listening = socket.create_server(("127.0.0.1", 0))
  with listening, socket.socket() as free:
    free.bind(("127.0.0.1", 0))  # held, not listening: refuses
    here = f"127.0.0.1:{listening.getsockname()[1]}"
    silent = f"127.0.0.1:{free.getsockname()[1]}"
    with socket.socket() as spare:
      spare.bind(("127.0.0.1", 0))
      own = f"127.0.0.1:{spare.getsockname()[1]}"  # free: its placeholder
    _task(monkeypatch, "chief", 0, cluster={"chief": [own],
                                            "worker": [here, silent]})
    started = time.monotonic()
    with pytest.raises(ConnectionError) as e:
      multi_worker.join(dataclasses.replace(_config("single"),
                                            cluster_timeout_s=1.0))
  assert 1.0 <= time.monotonic() - started < 5.0
  assert str(e.value) == (
      f"TF_CONFIG's worker 1 ({silent}) did not listen within "
      f"--cluster_timeout_s=1 s: every task of the job runs the same "
      f"command with its own TF_CONFIG task; start it, or fix its address, "
      f"and rerun; nothing was written. Received: TF_CONFIG cluster="
      f"{own},{here},{silent}")
  assert not multi_worker._JOINED  # pylint: disable=protected-access


def test_a_checkpoint_in_model_dir_is_refused(monkeypatch, tmp_path):
  shared = RunDir(str(tmp_path / "run"))
  _task(monkeypatch, "worker", 0)
  config = _config(model_dir=shared.path)
  multi_worker.check_fresh(config, None, shared)  # no run yet: fine
  with pytest.raises(ValueError, match="resuming a multi-worker .* not "
                     "supported yet.*Received: model_dir=.*run$"):
    multi_worker.check_fresh(config, "/x/checkpoints/ckpt-10", None)
  monkeypatch.delenv("TF_CONFIG")
  multi_worker.check_fresh(config, "/x/checkpoints/ckpt-10", None)  # alone


def test_the_input_position_is_kept_unless_mirrored(monkeypatch):
  iterator = object()
  _task(monkeypatch, "worker", 0)
  assert multi_worker.input_position(_config("single"), iterator) == {}
  assert multi_worker.input_position(_config("simulated"), iterator) == {
      "iterator": iterator}


def test_a_replicas_task_with_threads_per_device_joins_once(monkeypatch):
  # The binary's order: preflight's setup_runtime, run's setup_runtime, then
  # build (and make_distribute inside it). A simulated replicas task with
  # t = 2 threads per device once joined with t = 2 in setup_runtime and
  # again with t = 1 in build: a second replicas.connect, which splits the
  # host CPU after the runtime started and fails. A stub records each join
  # (joining for real needs processes: test_cluster_replicas.py) and hands
  # back a one-device placement, so build runs in this process.
  from tf_interlock import placement as placement_lib  # pylint: disable=g-import-not-at-top
  from train import runtime_setup  # pylint: disable=g-import-not-at-top
  from train import train_lib  # pylint: disable=g-import-not-at-top
  calls = []

  def connect(**kwargs):
    calls.append(kwargs)
    return None, placement_lib.Placement("single"), None

  monkeypatch.setattr(multi_worker.replicas_lib, "connect", connect)
  _forget_the_join(monkeypatch)
  _task(monkeypatch, "worker", 1)
  config = dataclasses.replace(_config("simulated"), num_modules=2,
                               threads_per_device=2, mlp_width=8)
  config_lib.validate(config)
  with pytest.raises(RuntimeError, match=r"has not joined it: runtime_setup"
                     r"\.setup_runtime\(config\) joins.*placement=simulated"):
    train_lib.build(config)
  assert not calls
  with _listening_peers(monkeypatch, "worker", 1):
    runtime_setup.setup_runtime(config)  # preflight.validate_for_run's
    runtime_setup.setup_runtime(config)  # train_lib.run's
  trainer, _, _ = train_lib.build(config)
  assert [call["intra_op_threads"] for call in calls] == [2]
  assert calls[0]["kind"] == "simulated" and calls[0]["num_modules"] == 2
  assert trainer.num_modules == 2


def _forget_the_join(monkeypatch):
  # A new process as far as joining goes; the record returns after the test.
  monkeypatch.setattr(multi_worker, "_JOINED", {})
