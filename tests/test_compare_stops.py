"""research.compare passes SIGTERM/SIGINT on to its train.train run and
stops within 5 s; after a SIGKILL of compare its run does not stay behind
as an orphan; a second compare into the same out_dir is refused in one line.

The signal is sent once the run's log shows training steps: the run is
then for certain in train.train (100000 steps, minutes of work).
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests import procfs
from tests.binaries import ROOT
from tests.binaries import stop_and_time

pytestmark = pytest.mark.slow
FLAGS = ["--preset=synthetic_mlp", "--strategies=e2e", "--seed=3",
         "--train_steps=100000", "--eval_points=2", "--cost_repeats=1",
         "--noplots", "--steps_per_loop=10"]


def _start(out_dir):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  return subprocess.Popen(
      [sys.executable, "-m", "research.compare", *FLAGS,
       f"--out_dir={out_dir}"], cwd=ROOT, env=env, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _training(compare, out_dir):
  """Waits until compare's train.train prints steps; returns its pid."""
  log = os.path.join(out_dir, "logs", "e2e_seed_3.log")
  deadline = time.monotonic() + 600
  while True:
    assert compare.poll() is None, compare.stderr.read()
    assert time.monotonic() < deadline, "no training steps logged"
    if os.path.exists(log):
      with open(log, encoding="utf-8") as f:
        if "step 10/" in f.read():
          break
    time.sleep(0.2)
  trains = [pid for pid in procfs.children(compare.pid) if "train.train" in
            procfs.cmdline(pid)]
  assert len(trains) == 1, trains
  return trains[0]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_compare_forwards_the_signal_and_stops_within_5_s(tmp_path, signum):
  out_dir = str(tmp_path / "study")
  compare = _start(out_dir)
  train = _training(compare, out_dir)
  second = _start(out_dir)  # while the first holds out_dir
  second.wait(timeout=300)
  refused = second.stderr.read().strip().splitlines()
  assert second.returncode == 1 and len(refused) == 1, refused
  assert refused[0].startswith(
      f"error: --out_dir={out_dir} is in use by another research.compare"), (
          refused)
  seconds, errors = stop_and_time(compare, signum)
  assert seconds < 5.0, seconds
  assert len(errors) == 1, errors
  name = signal.Signals(signum).name
  assert name in errors[0], errors
  assert procfs.gone_within(train, 1.0)  # gone with compare, not after it
  with open(os.path.join(out_dir, "logs", "e2e_seed_3.log"),
            encoding="utf-8") as f:
    assert name in f.read()  # train.train itself was told
  assert not os.path.exists(os.path.join(out_dir, "compare_lock.json"))


def test_a_sigkilled_compare_leaves_no_orphan(tmp_path):
  out_dir = str(tmp_path / "study")
  compare = _start(out_dir)
  train = _training(compare, out_dir)
  compare.kill()
  compare.wait(timeout=60)
  # Its watchdog looks every second; then the grace of 2 s, then a kill.
  assert procfs.gone_within(train, 10.0), procfs.cmdline(train)
