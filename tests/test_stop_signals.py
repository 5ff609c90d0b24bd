"""SIGTERM and SIGINT stop train.train within 5 s in every phase, with one
line saying what was kept (train/stop_watchdog.py).

Each phase is reached for certain, not by timing: tracing is a graph of 32
microbatches that takes TF minutes to build; saving blocks on a FIFO put
where the first checkpoint's index goes (opening it for writing waits for
a reader forever); training is past its second checkpoint of 100000 steps.
The cluster phases (an impostor on a worker's port, a frozen worker) are in
test_cluster_stops.py.
"""

import os
import signal
import subprocess
import time

import pytest
import tensorflow as tf

from tests import binaries
from tests import cluster_procs
from tests import procfs
from train import stop_watchdog

TT = ["--preset=synthetic_mlp", "--steps_per_loop=10",
      "--checkpoint_every_steps=10", "--eval_every_steps=100000"]


def _wait_for(path, proc, limit_s=300):
  """Polls until `path` exists (the run has passed that point)."""
  deadline = time.monotonic() + limit_s
  while not os.path.exists(path):
    assert proc.poll() is None, proc.stderr.read()
    assert time.monotonic() < deadline, f"{path} never appeared"
    time.sleep(0.02)


@pytest.mark.slow
def test_sigterm_while_tracing_is_acted_on_within_5_s(procs, tmp_path):
  model_dir = str(tmp_path / "run")
  proc = procs.start("train.train", *TT, "--train_steps=20",
                     "--num_microbatches=32", f"--model_dir={model_dir}")
  # config.json is written before the training function is traced.
  _wait_for(os.path.join(model_dir, "config.json"), proc)
  time.sleep(1.0)  # well inside the minutes of tracing
  seconds, errors = binaries.stop_and_time(proc, signal.SIGTERM)
  assert seconds < 5.0, seconds
  assert errors == [
      "error: stopped (SIGTERM): still busy inside TensorFlow "
      f"{stop_watchdog.DEFAULT_GRACE_S:g} s after the signal, so it was "
      f"killed; kept: no checkpoint yet in {model_dir} (the run starts from "
      "step 0 when rerun)"], errors
  assert not os.path.exists(os.path.join(model_dir, "checkpoints",
                                         "checkpoint"))


@pytest.mark.slow
def test_sigint_while_training_is_acted_on_within_5_s(procs, tmp_path):
  model_dir = str(tmp_path / "run")
  proc = procs.start("train.train", *TT, "--train_steps=100000",
                     f"--model_dir={model_dir}")
  for line in proc.stdout:
    if line.startswith("step 20/"):
      break
  seconds, errors = binaries.stop_and_time(proc, signal.SIGINT)
  assert seconds < 5.0, seconds
  assert len(errors) == 1, errors
  # Either the run saved at its step, or the watchdog named the last one.
  assert ("checkpoint saved to" in errors[0] or
          "kept: the last complete checkpoint" in errors[0]), errors
  latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  assert latest and latest in errors[0], (latest, errors)
  assert int(latest.rsplit("-", 1)[1]) >= 20
  tf.train.load_checkpoint(latest)  # complete: its index and data read


@pytest.mark.slow
def test_sigterm_while_saving_is_acted_on_within_5_s(procs, tmp_path):
  model_dir = tmp_path / "run"
  proc = procs.start("train.train", *TT, "--train_steps=20",
                     f"--model_dir={model_dir}")
  _wait_for(model_dir / "config.json", proc)
  # Stopped while the FIFO is put in place: the first save is then sure to
  # open it (steps 1-10 have not been traced yet).
  proc.send_signal(signal.SIGSTOP)
  (model_dir / "checkpoints").mkdir(exist_ok=True)
  os.mkfifo(model_dir / "checkpoints" / "ckpt-10.index")
  proc.send_signal(signal.SIGCONT)
  for line in proc.stdout:
    if line.startswith("step 10/20"):  # printed before its save
      break
  seconds, errors = binaries.stop_and_time(proc, signal.SIGTERM)
  assert seconds < 5.0, seconds
  assert len(errors) == 1, errors
  # No checkpoint was completed: nothing may claim one.
  assert not (model_dir / "checkpoints" / "checkpoint").exists()
  assert ("no checkpoint" in errors[0]), errors


def test_the_watchdog_names_the_latest_complete_checkpoint(tmp_path):
  folder = tmp_path / "checkpoints"
  folder.mkdir()
  (folder / "checkpoint").write_text(
      'model_checkpoint_path: "ckpt-30"\n'
      'all_model_checkpoint_paths: "ckpt-20"\n'
      'all_model_checkpoint_paths: "ckpt-30"\n')
  assert stop_watchdog.latest_checkpoint(str(tmp_path)) == (
      f"{folder / 'ckpt-30'} (step 30)")
  assert stop_watchdog.kept({"model_dir": str(tmp_path)}).startswith(
      f"kept: the last complete checkpoint {folder / 'ckpt-30'} (step 30);")
  assert stop_watchdog.latest_checkpoint(str(tmp_path / "none")) is None
  assert stop_watchdog.kept({"interrupted": "rerun"}) == "rerun"


def test_grace_comes_from_the_environment_within_bounds():
  assert stop_watchdog.grace_s({}) == stop_watchdog.DEFAULT_GRACE_S
  assert stop_watchdog.grace_s({stop_watchdog.GRACE_ENV: "1.5"}) == 1.5
  for bad in ("-1", "nan", "x", "1e9"):
    assert stop_watchdog.grace_s(
        {stop_watchdog.GRACE_ENV: bad}) == stop_watchdog.DEFAULT_GRACE_S


def test_watchdog_leaves_with_its_binary():
  """A binary that exits (even by SIGKILL) takes its watchdog along."""
  code = ("from train import stop_watchdog, error_boundary\n"
          "stop_watchdog.start('x')\n"
          "import os, sys, time\n"
          "print(os.getpid(), flush=True); time.sleep(600)\n")
  proc = subprocess.Popen(
      [cluster_procs.sys.executable, "-c", code], cwd=cluster_procs.ROOT,
      env=cluster_procs.env(), stdout=subprocess.PIPE, text=True)
  try:
    pid = int(proc.stdout.readline())
    children = procfs.children(pid)
    assert len(children) == 1, children
    proc.kill()
    proc.wait(timeout=30)
    assert procfs.gone_within(children[0], 30)
  finally:
    proc.kill()
    proc.stdout.close()

