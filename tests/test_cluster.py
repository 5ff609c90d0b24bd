"""placement=cluster with real worker processes on 127.0.0.1.

Three `train.worker` processes serve every test of this file (a
module-scoped fixture stops them at the end, also after a failure). A
client process connects once, so each test runs its client side in its own
subprocess.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import cluster_procs

pytestmark = pytest.mark.cluster
NUM_WORKERS = 3
STRATEGIES = ("e2e", "local", "2wise", "3wise")


@pytest.fixture(scope="module")
def cluster():
  procs = cluster_procs.Procs()
  try:
    flag, _ = procs.start_cluster(NUM_WORKERS)
    yield flag
  finally:
    procs.stop_all()


def test_weights_equal_the_simulated_run(cluster):
  """K = 2 and 3 modules on K worker processes train exactly as K logical
  CPUs in one process do: same weights after 20 steps, for every strategy."""
  proc = subprocess.run(
      [sys.executable, "-m", "tests.cluster_client",
       cluster, "2,3", ",".join(STRATEGIES)],
      cwd=cluster_procs.ROOT, env=cluster_procs.env(), capture_output=True,
      text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = [json.loads(line) for line in proc.stdout.splitlines()
             if line.startswith("{")]
  assert [(r["num_modules"], r["strategy"]) for r in results] == [
      (k, s) for k in (2, 3) for s in STRATEGIES]
  for r in results:
    k = r["num_modules"]
    # Every weight and optimizer variable of module k is on worker k.
    assert r["devices"] == [f"/job:worker/replica:0/task:{t}/device:CPU:0"
                            for t in range(k)], r
    assert r["iterations"] == [20] * k, r
    assert r["moved"] > 1e-2, r  # the weights did train
    assert r["max_diff"] <= 1e-6, r


def _final_weights(model_dir):
  reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints"))
  return {n: reader.get_tensor(n)
          for n in reader.get_variable_to_shape_map()
          if "VARIABLE_VALUE" in n and not n.startswith("save_counter")}


def test_train_binary_modules_per_worker(cluster, tmp_path):
  """The train binary with 4 modules, 2 per worker on 2 of the 3 workers,
  equals the single-process run of the same flags."""
  flags = ["--preset=synthetic_mlp", "--train_steps=20", "--seed=5",
           "--deterministic=true"]
  remote, local = str(tmp_path / "remote"), str(tmp_path / "local")
  for extra in ([f"--model_dir={remote}", "--placement=cluster",
                 f"--cluster={cluster}", "--modules_per_worker=2"],
                [f"--model_dir={local}"]):
    proc = subprocess.run(
        [sys.executable, "-m", "train.train", *flags, *extra],
        cwd=cluster_procs.ROOT, env=cluster_procs.env(), capture_output=True,
        text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["step"] == 20
  a, b = _final_weights(remote), _final_weights(local)
  assert a.keys() == b.keys() and len(a) >= 8
  for name in a:
    np.testing.assert_allclose(a[name], b[name], atol=1e-6, err_msg=name)


def test_tf_config_alone_names_the_workers_and_their_tasks(procs, tmp_path):
  """Workers without --cluster and --task, and a client without --cluster:
  TF_CONFIG's worker job is the list, a worker's task.index its task."""
  workers = cluster_procs.cluster_flag(cluster_procs.free_ports(2)).split(",")

  def tf_config(index):
    return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {
        "type": "worker", "index": index}})}

  for t in (1, 0):
    worker = procs.start("train.worker", environ=tf_config(t))
    line = worker.stdout.readline()
    assert line.startswith(f"worker task {t} of 2 ready at {workers[t]}"), (
        line, worker.stderr.read() if not line else "")
  # The client reads the same worker job; its own task is not used.
  client = procs.start(
      "train.train", "--preset=synthetic_mlp", "--num_modules=2",
      "--train_steps=5", "--steps_per_loop=5", "--eval_every_steps=5",
      "--checkpoint_every_steps=5", "--placement=cluster",
      f"--model_dir={tmp_path / 'run'}", environ=tf_config(0))
  out, err = client.communicate(timeout=600)
  assert client.returncode == 0, err[-3000:]
  assert json.loads(out.strip().splitlines()[-1])["step"] == 5
