"""Faults of the binaries' processes (issue 46), through the binaries.

* A TF_CONFIG job whose other task never starts: the deadline
  (--cluster_timeout_s) and SIGTERM/SIGHUP hold while the task waits for
  its peers (train/multi_worker.py `join`, cluster_checks.wait_for_peers),
  where TF's own join waited an hour and swallowed SIGTERM.
* SIGHUP (a closed terminal) is SIGTERM: the training loop saves at its
  step and releases the lock; a worker stops cleanly.
* A closed stdout (`| head -1`) stops the lines, not the training.
* A deleted working directory is one line saying so.

The processes of a test start together: each binary's start (importing
TF) is most of its time.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from tests import binaries
from tests import cluster_procs
from train import cluster_checks

pytestmark = pytest.mark.slow

TT = ["--preset=synthetic_mlp", "--steps_per_loop=10",
      "--checkpoint_every_steps=10", "--eval_every_steps=100000"]
STOPPED = ("before training started or during a save; rerun to resume from "
           "the latest checkpoint")


def _chief_of_two(ports):
  return json.dumps({
      "cluster": {"chief": [f"127.0.0.1:{ports[0]}"],
                  "worker": [f"127.0.0.1:{ports[1]}"]},
      "task": {"type": "chief", "index": 0}})


def test_a_job_whose_worker_never_starts_keeps_deadline_and_signals(
    procs, tmp_path):
  ports = cluster_procs.free_ports(6)
  # The deadline: --cluster_timeout_s=2, the worker never started.
  late = procs.start("train.train", *TT, "--train_steps=20",
                     "--cluster_timeout_s=2", f"--model_dir={tmp_path}/late",
                     environ={"TF_CONFIG": _chief_of_two(ports[:2])})
  # Signals while waiting (a deadline of 600 s): each chief's own port
  # accepts once it waits for its peer (its placeholder listener).
  waiting = {
      signum: procs.start(
          "train.train", *TT, "--train_steps=20", "--cluster_timeout_s=600",
          f"--model_dir={tmp_path}/{signum.name}",
          environ={"TF_CONFIG": _chief_of_two(ports[2 + 2 * i:4 + 2 * i])})
      for i, signum in enumerate((signal.SIGTERM, signal.SIGHUP))}
  for i, (signum, proc) in enumerate(waiting.items()):
    while not cluster_checks.reachable(f"127.0.0.1:{ports[2 + 2 * i]}", 1.0):
      assert proc.poll() is None, proc.stderr.read()
      time.sleep(0.2)
    seconds, errors = binaries.stop_and_time(proc, signum)
    assert seconds < 5.0, (signum, seconds)
    assert errors == [f"error: stopped ({signum.name}); {STOPPED}"], errors
  _, err = late.communicate(timeout=120)
  assert late.returncode == 1
  assert binaries.one_error(err) == (
      f"error: TF_CONFIG's worker 0 (127.0.0.1:{ports[1]}) did not listen "
      f"within --cluster_timeout_s=2 s: every task of the job runs the same "
      f"command with its own TF_CONFIG task; start it, or fix its address, "
      f"and rerun; nothing was written. Received: TF_CONFIG cluster="
      f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}")
  assert not os.listdir(tmp_path)  # no model_dir was made


def test_sighup_is_sigterm_for_training_and_the_worker(procs, tmp_path):
  model_dir = str(tmp_path / "run")
  train = procs.start("train.train", *TT, "--train_steps=100000",
                      f"--model_dir={model_dir}")
  ports = cluster_procs.free_ports(1)
  worker = procs.start("train.worker", f"--cluster=127.0.0.1:{ports[0]}",
                       "--task=0")
  assert "ready" in worker.stdout.readline(), worker.stderr.read()
  worker.send_signal(signal.SIGHUP)
  out, _ = worker.communicate(timeout=30)
  assert worker.returncode == 0
  assert out.strip() == "worker stopped (SIGHUP)"
  for line in train.stdout:
    if line.startswith("step 20/"):
      break
  seconds, errors = binaries.stop_and_time(train, signal.SIGHUP)
  assert seconds < 5.0, seconds
  assert len(errors) == 1, errors
  # The run saved at its step, or the watchdog named the last checkpoint.
  assert (errors[0].startswith("error: SIGHUP at step") and
          "checkpoint saved to" in errors[0]) or (
              "stopped (SIGHUP)" in errors[0] and
              "kept: the last complete checkpoint" in errors[0]), errors
  latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  assert latest and latest in errors[0], (latest, errors)
  assert int(latest.rsplit("-", 1)[1]) >= 20
  assert not os.path.exists(os.path.join(model_dir, "lock.json"))


def test_a_closed_stdout_stops_the_lines_not_the_training(procs, tmp_path):
  model_dir = str(tmp_path / "run")
  proc = procs.start("train.train", *TT, "--train_steps=60",
                     f"--model_dir={model_dir}")
  first = proc.stdout.readline()  # as `| head -1`: one line, then gone
  assert first.startswith("step 10/60"), (first, proc.stderr.read())
  proc.stdout.close()
  err = proc.stderr.read()
  assert proc.wait(timeout=300) == 0, err
  assert "error:" not in err and "Traceback" not in err, err
  assert ("note: stdout was closed (Broken pipe: its reader, a pipe such as "
          "`| head` or a terminal, is gone); this binary goes on") in err, err
  # Trained to the end, with its checkpoint and export, lock released.
  latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  assert latest.endswith("ckpt-60"), latest
  assert os.path.isfile(os.path.join(model_dir, "export", "saved_model.pb"))
  assert not os.path.exists(os.path.join(model_dir, "lock.json"))


def test_a_deleted_working_directory_is_one_line(tmp_path):
  line = ("error: the working directory no longer exists (it was deleted or "
          "moved while this binary ran or before it started), and relative "
          "paths are read from it: cd to an existing folder, or give "
          "absolute paths, and rerun")
  started = []
  for binary, flags in (("train.train", [*TT, "--model_dir=run"]),
                        ("train.export", ["--model_dir=run"]),
                        ("train.evaluate", ["--saved_model=run/export"])):
    gone = tmp_path / binary
    gone.mkdir()
    command = " ".join([sys.executable, "-m", binary, *flags])
    started.append(subprocess.Popen(  # pylint: disable=consider-using-with
        ["sh", "-c", f'cd "{gone}" && rmdir "$PWD" && exec {command}'],
        env=cluster_procs.env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True))
  for proc in started:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert binaries.one_error(err) == line
  assert not os.listdir(tmp_path)
