"""Starts the processes of a loopback cluster for a test, and stops them.

Every process runs `python -m MODULE ARGS...` from the repository root with
its own TF_CONFIG (127.0.0.1, free ports). `run_cluster` waits for all of
them, and kills any that is still running when it returns or raises, so a
failing test leaves no process behind.
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

from tests import binaries
from tests import cluster_procs
from tests import replica_job

ROOT = pathlib.Path(__file__).resolve().parent.parent


def free_ports(count):
  """`count` distinct free TCP ports on 127.0.0.1 (this xdist worker's)."""
  return cluster_procs.free_ports(count)


def tf_config(ports, index, chief=False):
  """TF_CONFIG of task `index`: "worker" tasks, or a chief then workers."""
  addresses = [f"127.0.0.1:{p}" for p in ports]
  if not chief:
    return {"cluster": {"worker": addresses},
            "task": {"type": "worker", "index": index}}
  task = ({"type": "chief", "index": 0} if index == 0 else
          {"type": "worker", "index": index - 1})
  return {"cluster": {"chief": addresses[:1], "worker": addresses[1:]},
          "task": task}


def run_cluster(module, args_per_task, log_dir, timeout_s=600, chief=False,
                cwd=ROOT, exit_codes=None):
  """Runs one process per entry of `args_per_task`; all must exit 0.

  Args:
    module: the Python module to run (`python -m module`).
    args_per_task: per task, its command-line arguments.
    log_dir: a pathlib.Path; task i's stdout and stderr go to task_{i}.log.
    timeout_s: seconds to wait for all of them together (generous: on a
      loaded 2-core machine two TF processes take minutes to start).
    chief: task 0 is the "chief" (else every task is a "worker").
    cwd: the working directory of every process.
    exit_codes: per task, the exit code it must end with (default all 0).

  Returns:
    The logs' text, per task.

  Raises:
    AssertionError: a process failed or timed out (with its log's tail).
  """
  ports = free_ports(len(args_per_task))
  procs, logs = [], []
  try:
    for i, args in enumerate(args_per_task):
      env = dict(os.environ, TF_CONFIG=json.dumps(tf_config(ports, i, chief)),
                 TF_CPP_MIN_LOG_LEVEL="2",
                 PYTHONPATH=os.pathsep.join(
                     [str(ROOT), os.environ.get("PYTHONPATH", "")]))
      logs.append(log_dir / f"task_{i}.log")
      with open(logs[-1], "wb") as log:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", module, *map(str, args)], cwd=cwd,
            env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout_s
    for i, proc in enumerate(procs):
      try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        pass
      text = logs[i].read_text(errors="replace")
      status = (f"was still running after {timeout_s} s"
                if proc.returncode is None else f"exited {proc.returncode}")
      expected = exit_codes[i] if exit_codes else 0
      assert proc.returncode == expected, (
          f"task {i} {status}, not {expected}:\n{text[-3000:]}")
    return [log.read_text(errors="replace") for log in logs]
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()


def run_replica_jobs(tmp_path, mode, strategies, chief=False):
  """Two `tests.replica_job` processes, each checked against one process.

  Each trains `strategies` on half of every global batch; every task's
  weights and whole-batch metrics must equal one process's run on the whole
  batch (1e-5).

  Args:
    tmp_path: the test's temporary folder.
    mode: replica_job's mode ("modules": replicas x modules by collectives;
      "mirrored": MultiWorkerMirroredStrategy).
    strategies: strategy names.
    chief: whether task 0 is a chief (TF_CONFIG) rather than a worker.

  Returns:
    Each task's saved arrays (np.load of its .npz).
  """
  outs = [tmp_path / f"task_{i}.npz" for i in range(2)]
  run_cluster("tests.replica_job", [[out, mode, *strategies] for out in outs],
              tmp_path, chief=chief)
  saved = [np.load(out) for out in outs]
  for strategy in strategies:
    weights, metrics, _ = replica_job.train(strategy)
    for task, run in enumerate(saved):
      for i, expected in enumerate(weights):
        np.testing.assert_allclose(run[f"{strategy}/w{i}"], expected,
                                   atol=1e-5, err_msg=f"{strategy} {task}")
      # Every process reports the whole batch's loss and accuracy.
      for key, value in metrics.items():
        if not key.endswith("grad_norm"):  # replica-local by definition
          np.testing.assert_allclose(run[f"{strategy}/{key}"], value,
                                     atol=1e-5, err_msg=key)
  return saved


def train_binary_flags(placement):
  """A 10-step synthetic MLP run (K = 4) of `train.train`."""
  return ["--preset=synthetic_mlp", f"--placement={placement}",
          "--train_steps=10", "--steps_per_loop=5",
          "--checkpoint_every_steps=10", "--eval_every_steps=10"]


def assert_same_checkpoints(got_dir, expected_dir, atol):
  """Every saved weight and slot of `got_dir`'s run equals `expected_dir`'s.

  A failure names every key that differs, with its largest difference, and
  the saved step of each run, so that one failing run shows which modules
  and which state moved apart.
  """
  got = tf.train.load_checkpoint(os.path.join(got_dir, "checkpoints"))
  expected = tf.train.load_checkpoint(
      os.path.join(expected_dir, "checkpoints"))
  keys = sorted(key for key in got.get_variable_to_shape_map()
                if key.startswith(("module_", "optimizer_")))
  assert len(keys) > 20
  apart = {}
  for key in keys:
    a, b = got.get_tensor(key), expected.get_tensor(key)
    if a.shape != b.shape or not np.allclose(a, b, rtol=1e-7, atol=atol):
      apart[key] = (float(np.max(np.abs(a - b))) if a.shape == b.shape
                    else f"shape {a.shape} != {b.shape}")
  steps = [int(reader.get_tensor(key)) for reader in (got, expected)
           for key in reader.get_variable_to_shape_map()
           if key.startswith("global_step/")]
  assert not apart, (f"{len(apart)} of {len(keys)} saved tensors differ "
                     f"(saved steps {steps}): {apart}")


def _autograph_cache_only(path):
  return path.name == "__pycache__" and all(
      name.startswith("__autograph_generated_file")
      for name in os.listdir(path))


def run_train_binary_on_two_tasks(tmp_path, monkeypatch, placement):
  """Chief + worker `train.train` runs; checks only the chief wrote.

  Returns:
    (the chief's model_dir, its log).
  """
  # The worker's private directory goes under this test's temp dir.
  own_tmp = tmp_path / "tmp"
  own_tmp.mkdir()
  monkeypatch.setenv("TMPDIR", str(own_tmp))
  dirs = [tmp_path / "chief", tmp_path / "worker"]
  logs = run_cluster(
      "train.train",
      [train_binary_flags(placement) + [f"--model_dir={d}"] for d in dirs],
      tmp_path, chief=True)
  assert sorted(os.listdir(dirs[0])) == [
      "checkpoints", "config.json", "eval", "export", "run.json", "train"]
  # The worker wrote nothing it was given, and removed its own directory.
  assert not dirs[1].exists()
  # Autograph compiles its generated code from files in the temp dir, so
  # Python may leave their bytecode there (it does under Bazel); that cache is
  # TensorFlow's, not a directory of the run's.
  left = sorted(p.name for p in own_tmp.iterdir()
                if not _autograph_cache_only(p))
  assert not left, left
  return str(dirs[0]), logs[0]


def check_train_binary_equals_one_process(tmp_path, monkeypatch,
                                          placement):
  """Chief + worker runs: only the chief writes, and its checkpoint equals
  one `train.train` process's on the whole batch (1e-5)."""
  chief_dir, log = run_train_binary_on_two_tasks(tmp_path, monkeypatch,
                                                 placement)
  assert "step 10/10" in log
  single_dir = str(tmp_path / "single")
  binaries.run_binary("train.train", *train_binary_flags(placement),
                      f"--model_dir={single_dir}")
  assert_same_checkpoints(chief_dir, single_dir, atol=1e-5)
