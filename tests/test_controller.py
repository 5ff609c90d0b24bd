"""The training controller and each of its actions, alone, with fakes."""

import io
import math
import os
import signal

import pytest
import tensorflow as tf

from train import actions
from train.controller import Controller
from train.controller import Loop


class Recorder:
  def __init__(self):
    self.steps, self.finished = [], None

  def after_loop(self, loop):
    self.steps.append((loop.step, loop.num_steps))

  def finish(self, step):
    self.finished = step


class FakeClock:
  def __init__(self, tick=1.0):
    self.now, self.tick = 0.0, tick

  def __call__(self):
    self.now += self.tick
    return self.now


class FakeManager:
  def __init__(self, latest=None):
    self.saved, self.latest_checkpoint = [], latest

  def save(self, checkpoint_number):
    self.saved.append(checkpoint_number)
    self.latest_checkpoint = f"ckpt-{checkpoint_number}"


def _loop(step, n=5, **kwargs):
  fields = dict(metrics={"module_1/loss": 0.5, "module_2/loss": 0.25},
                seconds=0.5, total_steps=20, first_step=0, elapsed_s=1.0)
  fields.update(kwargs)
  return Loop(step, n, **fields)


def test_controller_runs_loops_up_to_the_total_then_finishes():
  recorder = Recorder()
  calls = []
  step = Controller(lambda n: calls.append(n) or {}, [recorder],
                    start_step=3, total_steps=14, steps_per_loop=5,
                    clock=FakeClock()).run()
  assert step == 14 and calls == [5, 5, 1]
  assert recorder.steps == [(8, 5), (13, 5), (14, 1)]
  assert recorder.finished == 14


def test_a_stop_request_ends_the_loop_but_finish_still_runs():
  recorder = Recorder()
  step = Controller(lambda n: {}, [actions.TimeBudget(3.5), recorder],
                    start_step=0, total_steps=None, steps_per_loop=2,
                    clock=FakeClock()).run()
  # FakeClock ticks once per reading: elapsed_s after loop i is 3i + 1.
  assert step == 4 and recorder.finished == 4


def test_a_rejected_loop_does_not_advance_or_reach_actions():
  recorder = Recorder()

  class Guard:
    def __init__(self):
      self.calls = 0

    def accept(self, step, num_steps, metrics):
      del num_steps, metrics
      self.calls += 1
      return 0 if self.calls == 2 else None  # reject the second loop

  Controller(lambda n: {}, [recorder], start_step=0, total_steps=10,
             steps_per_loop=5, guard=Guard(), clock=FakeClock()).run()
  assert recorder.steps == [(5, 5), (5, 5), (10, 5)]


def test_progress_line_and_bar():
  out = io.StringIO()
  actions.Progress(out, batch_size=10).after_loop(_loop(10))
  assert out.getvalue() == (
      "step 10/20: 10.00 steps/s 100 ex/s L1=0.5000 L2=0.2500 eta=1s\n")


def test_checkpointing_saves_on_schedule_and_once_per_step():
  manager = FakeManager()
  action = actions.Checkpointing(manager, every=10)
  for step in (5, 10, 15):
    action.after_loop(_loop(step))
  action.finish(15)
  action.finish(15)
  assert manager.saved == [10, 15]
  resumed = actions.Checkpointing(FakeManager(), every=10, saved_step=20)
  resumed.finish(20)
  assert resumed.manager.saved == []


def test_evaluation_writes_scalars_and_keeps_the_last_result(tmp_path):
  results = iter([{"module_2": {"loss": 1.0, "num_examples": 4}},
                  {"module_2": {"loss": 0.5, "num_examples": 4}}])
  writer = tf.summary.create_file_writer(str(tmp_path))
  action = actions.Evaluation(lambda: next(results), writer, every=10)
  action.after_loop(_loop(5))
  assert action.results is None
  action.after_loop(_loop(10))
  action.finish(10)  # already evaluated at this step
  assert action.results["module_2"]["loss"] == 1.0
  action.finish(12)
  assert action.results["module_2"]["loss"] == 0.5
  assert os.listdir(tmp_path)


def test_summaries_write_metrics_rates_and_speed(tmp_path):
  writer = tf.summary.create_file_writer(str(tmp_path))
  actions.Summaries(writer, 10, lambda: {"module_1/learning_rate": 0.1}
                    ).after_loop(_loop(10))
  tags = set()
  for name in os.listdir(tmp_path):
    for event in tf.compat.v1.train.summary_iterator(str(tmp_path / name)):
      tags.update(v.tag for v in event.summary.value)
  assert tags == {"module_1/loss", "module_2/loss", "module_1/learning_rate",
                  "step_time_s", "examples_per_s"}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_preemption_saves_then_stops_and_restores_handlers(signum):
  before = signal.getsignal(signum)
  manager = FakeManager()
  action = actions.Preemption(actions.Checkpointing(manager, every=100))
  try:
    action.after_loop(_loop(5))  # no signal yet
    os.kill(os.getpid(), signum)
    with pytest.raises(actions.TrainingError,
                       match=f"{signal.Signals(signum).name} at step 10: "
                       "checkpoint saved to ckpt-10"):
      action.after_loop(_loop(10))
  finally:
    action.restore()
  assert manager.saved == [10] and signal.getsignal(signum) == before


def test_nan_policy_stop_and_skip():
  out = io.StringIO()
  bad = {"module_2/loss": math.nan, "module_1/loss": 1.0}
  stop = actions.NanPolicy("stop", FakeManager("ckpt-10"), None, out)
  assert stop.accept(10, 5, {"module_1/loss": 1.0}) is None
  with pytest.raises(actions.TrainingError,
                     match="non-finite loss in module_2 at steps 11..15"):
    stop.accept(10, 5, bad)
  rolled = []
  skip = actions.NanPolicy("skip", FakeManager("ckpt-10"),
                           lambda path: rolled.append(path) or 10, out,
                           max_skips=2)
  assert skip.accept(15, 5, bad) == 10 and skip.accept(10, 5, bad) == 10
  with pytest.raises(actions.TrainingError, match="stopped"):
    skip.accept(10, 5, bad)
  assert rolled == ["ckpt-10", "ckpt-10"]
  assert out.getvalue().count("skipped: rolled back to ckpt-10") == 2
  nothing_saved = actions.NanPolicy("skip", FakeManager(None), None, out)
  with pytest.raises(actions.TrainingError, match="checkpoint: None"):
    nothing_saved.accept(0, 5, bad)


def test_step_variable_and_lock_heartbeat():
  variable = tf.Variable(0, dtype=tf.int64)
  actions.StepVariable(variable).after_loop(_loop(15))
  assert int(variable) == 15

  class Lock:
    refreshed = 0

    def refresh(self):
      Lock.refreshed += 1

    def check_folder(self):
      pass

  beat = actions.LockHeartbeat(Lock(), every_s=60)
  for elapsed in (10, 59, 61, 100, 125):
    beat.after_loop(_loop(5, elapsed_s=elapsed))
  assert Lock.refreshed == 2  # at 61 and 125 s
