"""keras.callbacks.TensorBoard(profile_batch=...) on InterlockModel.fit
writes a trace with each module on its own device; research.timeline draws
it."""

import json
import os

import keras
import numpy as np
import pytest

import tf_interlock as ti
from research import trace_reader
from tests.binaries import run_main

DEVICES = [f"/device:CPU:{k}" for k in range(4)]


def _fit(log_dir, steps_per_execution):
  """8 batches of a 4-module MLP on 4 simulated devices, calls 3..6 of the
  train function profiled."""
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((8,))] + [
      keras.layers.Dense(16, activation="relu", name=f"hidden{k + 1}")
      for k in range(4)] + [keras.layers.Dense(4)])
  model = ti.InterlockModel(ti.from_keras(model, 4), strategy="2wise",
                            placement="simulated")
  model.compile(optimizer=keras.optimizers.SGD(0.05),
                steps_per_execution=steps_per_execution)
  rng = np.random.default_rng(0)
  model.fit(rng.normal(size=(128, 8)).astype("float32"),
            rng.integers(0, 4, 128).astype("int32"), batch_size=16,
            epochs=1, verbose=0, callbacks=[keras.callbacks.TensorBoard(
                str(log_dir), profile_batch=(3, 6))])


@pytest.fixture(scope="module")
def keras_trace(tmp_path_factory):
  log_dir = tmp_path_factory.mktemp("tensorboard")
  _fit(log_dir, steps_per_execution=2)
  return os.path.join(log_dir, "train")


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_profile_batch_writes_a_trace_of_every_device(
    tmp_path, steps_per_execution):
  _fit(tmp_path, steps_per_execution)
  traces = trace_reader.find_traces(str(tmp_path / "train"))
  assert len(traces) == 1 and traces[0].endswith(".xplane.pb")
  trace = trace_reader.read(traces[0])
  assert trace.devices == DEVICES
  # Module k's Dense layer hidden{k} runs on device k - 1 only.
  layers = {}
  for op in trace.ops:
    for k in range(1, 5):
      if f"hidden{k}" in op.name:
        layers.setdefault(k, set()).add(op.device)
  assert layers == {k: {DEVICES[k - 1]} for k in range(1, 5)}
  # Keras counts calls of the train function: calls 3..6 of 1 step, or
  # calls 3..4 (the last) of 2: 4 steps either way, each with 4 losses.
  assert sum(op.type == "SparseSoftmaxCrossEntropyWithLogits"
             for op in trace.ops) == 4 * 4
  assert {op.kind for op in trace.ops} == {"forward", "backward", "update",
                                           "transfer"}


def test_timeline_draws_the_trace(keras_trace, tmp_path, capfd):
  png = tmp_path / "timeline.png"
  code, out, err = run_main("research.timeline", [
      f"--tensorboard_dir={keras_trace}", f"--png={png}"], capfd)
  assert code == 0, err
  with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  summary = json.loads(out)
  assert sorted(summary["devices"]) == DEVICES
  for device in DEVICES:
    assert summary["devices"][device]["ops"] > 0
    assert 0 < summary["devices"][device]["busy_fraction"] <= 1
  assert 0 <= summary["all_busy_fraction"] <= (
      summary["two_or_more_busy_fraction"]) <= 1


def test_summary_counts_overlap():
  ops = [trace_reader.Op(d, "x", "MatMul", s, e) for d, s, e in (
      ("/device:CPU:0", 0.0, 4.0), ("/device:CPU:1", 2.0, 6.0),
      ("/device:CPU:1", 3.0, 5.0), ("/device:CPU:0", 8.0, 10.0))]
  summary = trace_reader.summary(trace_reader.Trace(ops, unplaced=0))
  assert summary["span_s"] == 10.0
  assert summary["devices"]["/device:CPU:0"]["busy_fraction"] == 0.6
  assert summary["devices"]["/device:CPU:1"]["busy_fraction"] == 0.4
  assert summary["two_or_more_busy_fraction"] == 0.2
  assert summary["all_busy_fraction"] == 0.2


@pytest.mark.parametrize("given, words", [
    ([], "give one of --model_dir and --tensorboard_dir"),
    (["--tensorboard_dir={empty}"], "no profiler trace in"),
    (["--model_dir={empty}", "--tensorboard_dir={empty}"], "give one of")])
def test_timeline_refuses_in_one_line(tmp_path, capfd, given, words):
  png = tmp_path / "t.png"
  code, _, err = run_main("research.timeline", [
      *(g.format(empty=tmp_path) for g in given), f"--png={png}"], capfd)
  lines = err.strip().splitlines()
  assert code == 1 and len(lines) == 1 and words in lines[0], err
  assert "Received:" in lines[0] and not png.exists()
