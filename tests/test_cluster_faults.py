"""Faults with real processes on 127.0.0.1: a worker killed mid-run, a
worker that never comes up, and the worker binary's one-line errors.

Every process a test starts is stopped by its fixture's finalizer, also
when the test fails.
"""

import os
import signal
import socket
import time

import numpy as np
import pytest
import tensorflow as tf

from tests import cluster_procs
from tests import hold

pytestmark = pytest.mark.cluster
RUN = ["--preset=synthetic_mlp", "--num_modules=2", "--train_steps=300",
       "--checkpoint_every_steps=20", "--eval_every_steps=300",
       "--deterministic=true", "--seed=4"]


def _final_weights(model_dir):
  reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints"))
  return {n: reader.get_tensor(n)
          for n in reader.get_variable_to_shape_map()
          if "VARIABLE_VALUE" in n and not n.startswith("save_counter")}


def _checkpoint_step(model_dir):
  """The step of model_dir's latest checkpoint, read from its files."""
  path = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  return int(path.rsplit("-", 1)[1])


def test_killed_worker_is_named_and_the_rerun_resumes_bit_identically(
    procs, tmp_path):
  cluster, workers = procs.start_cluster(2)
  train = RUN + ["--placement=cluster", f"--cluster={cluster}"]
  killed = str(tmp_path / "killed")
  # The client holds at step 60 (tests.hold: the 12th loop of 5 steps),
  # past the first checkpoints, until the worker is dead for certain.
  ready = str(tmp_path / "held")
  client = procs.start("tests.hold", ready, "train.actions.Progress.after_loop",
                       "12", "train.train", *train, f"--model_dir={killed}")
  hold.wait_until_held(ready, client)
  workers[1].send_signal(signal.SIGKILL)
  workers[1].wait(timeout=60)
  killed_at = time.monotonic()
  with open(ready + ".go", "w"):
    pass
  client.wait(timeout=120)
  waited = time.monotonic() - killed_at
  errors = client.stderr.read().strip().splitlines()
  assert client.returncode == 1, errors[-5:]
  assert waited < 60, waited
  port = cluster.split(",")[1]
  assert errors[-1].startswith(f"error: worker task 1 ({port}) failed"), (
      errors[-5:])
  # The last checkpoint is intact (its pointer and every file restore) and
  # earlier than the end: the rerun has work left.
  step = _checkpoint_step(killed)
  assert 20 <= step <= 60, step
  procs.stop(workers[1])
  procs.start_worker(cluster, 1)  # the same host:port again
  resumed = procs.start("train.train", *train, f"--model_dir={killed}")
  out, err = resumed.communicate(timeout=600)
  assert resumed.returncode == 0, err[-3000:]
  # It restored the checkpoint the killed run left.
  assert f"ckpt-{step} at step {step}" in out, out[:500]
  straight = str(tmp_path / "straight")
  proc = procs.start("train.train", *train, f"--model_dir={straight}")
  _, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  a, b = _final_weights(straight), _final_weights(killed)
  assert a.keys() == b.keys() and len(a) >= 8
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_worker_that_never_comes_up_is_named(procs, tmp_path):
  (port,) = cluster_procs.free_ports(1)
  model_dir = str(tmp_path / "run")
  client = procs.start("train.train", *RUN, "--placement=cluster",
                       f"--cluster=127.0.0.1:{port}", "--num_modules=1",
                       "--cluster_timeout_s=3", f"--model_dir={model_dir}")
  _, err = client.communicate(timeout=300)
  assert client.returncode == 1
  lines = err.strip().splitlines()
  assert lines[-1] == (
      f"error: no worker listening at task 0 (127.0.0.1:{port}) after 3 s; "
      "start it with python -m train.worker --cluster=... --task=N. "
      f"Received: cluster=127.0.0.1:{port}"), lines[-3:]
  assert not os.path.exists(model_dir)  # nothing was written


def test_worker_binary_faults_are_one_line(procs):
  ports = cluster_procs.free_ports(2)
  cluster = cluster_procs.cluster_flag(ports)
  holder = socket.socket()
  holder.bind(("127.0.0.1", ports[0]))
  holder.listen(1)
  try:
    cases = {
        "port": (["--task=0"], f"error: port {ports[0]} is already in use"),
        "task": (["--task=2"], "error: --task must name one of the 2 "
                 "workers of the cluster (0..1). Received: task=2"),
        "host": (["--cluster=192.0.2.1:2222", "--task=0"],
                 "error: host 192.0.2.1 of task 0 is not an address of "
                 "this machine"),
        "list": (["--cluster=127.0.0.1:x", "--task=0"],
                 "error: cluster entry '127.0.0.1:x' is not host:port"),
        "threads": (["--task=0", "--inter_op_threads=0"],
                    "error: --inter_op_threads=0 is invalid: must be >= 1 "
                    "(see --helpshort). Received: inter_op_threads=0"),
    }
    started = {name: procs.start("train.worker", f"--cluster={cluster}",
                                 *flags)
               for name, (flags, _) in cases.items()}
    for name, (_, expected) in cases.items():
      _, err = started[name].communicate(timeout=600)
      assert started[name].returncode == 1, (name, err)
      lines = err.strip().splitlines()
      assert len(lines) == 1 and lines[0].startswith(expected), (name, err)
  finally:
    holder.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_worker_stops_cleanly_on_a_signal(procs, signum):
  cluster = cluster_procs.cluster_flag(cluster_procs.free_ports(1))
  worker = procs.start_worker(cluster, 0)
  worker.send_signal(signum)
  out, _ = worker.communicate(timeout=300)
  assert worker.returncode == 0
  assert out.strip() == f"worker stopped ({signum.name})"
