"""train.train --profile_steps: refused in one line when malformed, else a
profiler trace of whole loops in model_dir/train with each module's ops on
its own device."""

import os
import re

import pytest
import tensorflow as tf

from research import trace_reader
from tests.binaries import run_main
from train import actions
from train.controller import Controller
from train.run_dir import RunDir

SYNTH = ["--preset=synthetic_mlp", "--train_steps=10", "--steps_per_loop=5"]


@pytest.mark.parametrize("value, words", [
    ("6,3", "1 <= FIRST <= LAST"), ("-1,3", "1 <= FIRST <= LAST"),
    ("0,3", "1 <= FIRST <= LAST"), ("5", "two steps FIRST,LAST"),
    ("1,2,3", "two steps FIRST,LAST"), ("a,b", "list of whole numbers"),
    ("1.5,3", "list of whole numbers"),
    ("3,11", "at most 10, the run's last step")])
def test_bad_profile_steps_fail_in_one_line_and_write_nothing(
    tmp_path, capfd, value, words):
  model_dir = tmp_path / "run"
  code, _, err = run_main("train.train", [
      *SYNTH, f"--profile_steps={value}", f"--model_dir={model_dir}"], capfd)
  lines = err.strip().splitlines()
  assert code == 1 and len(lines) == 1, err
  assert words in lines[0] and re.search(
      r"Received: profile_steps='?[-0-9a-z.,]+'?$", lines[0]), err
  assert not os.path.exists(model_dir)


def test_epochs_bound_profile_steps_too(tmp_path, capfd):
  # synthetic: 0.01 epochs of batches of 32 is 1 step.
  code, _, err = run_main("train.train", [
      "--preset=synthetic_mlp", "--epochs=0.01", "--profile_steps=1,3",
      f"--model_dir={tmp_path / 'run'}"], capfd)
  assert code == 1 and "at most 1, the run's last step" in err, err
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("first, last, start, expected", [
    (7, 12, 0, [("start", 5), ("stop", 15)]),  # widened to loops 2..3
    (1, 5, 0, [("start", 0), ("stop", 5)]),  # the first loop
    (10, 11, 0, [("start", 5), ("stop", 15)]),  # a loop's last, next's first
    (16, 20, 0, [("start", 15), ("stop", 20)]),  # the last loop
    (7, 12, 10, [("start", 10), ("stop", 15)]),  # resumed inside the range
    (3, 8, 10, [])])  # resumed past it: no trace
def test_profiling_starts_and_stops_on_loop_boundaries(
    monkeypatch, first, last, start, expected):
  calls, step = [], [start]
  monkeypatch.setattr(tf.profiler.experimental, "start",
                      lambda log_dir: calls.append(("start", step[0])))
  monkeypatch.setattr(tf.profiler.experimental, "stop",
                      lambda: calls.append(("stop", step[0])))

  def train_fn(n):
    step[0] += n
    return {}

  Controller(train_fn, [actions.ProfileSteps("logs", first, last)],
             start_step=start, total_steps=20, steps_per_loop=5).run()
  assert calls == expected


def test_a_stop_before_last_stops_the_profiler(monkeypatch):
  calls = []
  monkeypatch.setattr(tf.profiler.experimental, "start",
                      lambda log_dir: calls.append("start"))
  monkeypatch.setattr(tf.profiler.experimental, "stop",
                      lambda: calls.append("stop"))

  class StopAt10:
    def after_loop(self, loop):
      loop.stop = loop.step >= 10

  Controller(lambda n: {}, [actions.ProfileSteps("logs", 6, 20), StopAt10()],
             start_step=0, total_steps=20, steps_per_loop=5).run()
  assert calls == ["start", "stop"]


def test_a_run_writes_a_trace_of_each_module_on_its_device(tmp_path, capfd):
  model_dir = tmp_path / "run"
  code, _, err = run_main("train.train", [
      *SYNTH, "--placement=simulated", "--mlp_width=16",
      "--profile_steps=6,10", f"--model_dir={model_dir}"], capfd)
  assert code == 0, err
  run = RunDir(str(model_dir))
  traces = trace_reader.find_traces(run.train_log_dir)
  assert len(traces) == 1 and traces[0].endswith(".xplane.pb")
  assert run.foreign_entries() == []  # the profile is the run's own
  trace = trace_reader.read(traces[0])
  assert trace.devices == [f"/device:CPU:{k}" for k in range(4)]
  # Module k's body (mlp{k}_body) runs on device k - 1 only.
  bodies = {}
  for op in trace.ops:
    found = re.search(r"mlp(\d)_body", op.name)
    if found:
      bodies.setdefault(int(found.group(1)), set()).add(op.device)
  assert bodies == {k: {f"/device:CPU:{k - 1}"} for k in range(1, 5)}
  # One loop of 5 steps, each with 4 losses; and nothing but the loop: the
  # evaluation and checkpoint at step 10 would add executors that send
  # nothing between devices (unplaced ops).
  assert sum(op.type == "SparseSoftmaxCrossEntropyWithLogits"
             for op in trace.ops) == 5 * 4
  assert trace.unplaced == 0
