"""The one forward over exits (`exits`) and the one metric-naming scheme."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers.interlock_module import InterlockModule
from tf_interlock import exits
from tf_interlock import metric_names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Scale(keras.layers.Layer):
  """h -> gain * h, counting its calls (to see which modules ran)."""

  def __init__(self, gain, **kwargs):
    super().__init__(**kwargs)
    self.gain, self.calls = gain, 0

  def call(self, inputs):
    self.calls += 1
    return self.gain * inputs

  def compute_output_shape(self, input_shape):
    return input_shape


def _scalar_modules():
  """The worked example's network: h_k = w_k h_{k-1}, w = (2, 3, 4); aux
  heads a_k = (1, -1) on modules 1 and 2; module 3 ends with the output."""
  return [InterlockModule(_Scale(2.0), aux_head=_Scale(1.0)),
          InterlockModule(_Scale(3.0), aux_head=_Scale(-1.0)),
          InterlockModule(_Scale(4.0))]


def test_every_exit_by_hand():
  found = list(exits.exits(_scalar_modules(), tf.constant(1.0)))
  assert [e.index for e in found] == [0, 1, 2]
  # h = (2, 6, 24); exit logits (1 * 2, -1 * 6) and the network's h_3.
  assert [float(e.outputs) for e in found] == [2.0, 6.0, 24.0]
  assert [float(e.logits) for e in found] == [2.0, -6.0, 24.0]


def test_headless_module_has_no_logits_and_heads_filter():
  modules = _scalar_modules()
  modules[1] = InterlockModule(_Scale(3.0))
  found = list(exits.exits(modules, tf.constant(1.0)))
  assert found[1].logits is None and float(found[1].outputs) == 6.0
  assert exits.exit_indices(modules) == [1]
  assert [exits.is_exit(modules, k) for k in range(3)] == [True, False, True]
  only_last = list(exits.exits(modules, tf.constant(1.0), heads=(2,)))
  assert only_last[0].logits is None and float(only_last[2].logits) == 24.0
  with pytest.raises(ValueError, match="Received: k=2"):
    exits.exit_logits(modules, tf.constant(1.0), 2)


def test_exit_logits_runs_only_the_modules_it_needs():
  modules = _scalar_modules()
  x = tf.constant(1.0)
  assert float(exits.exit_logits(modules, x, 2)) == -6.0
  assert modules[2].body.calls == 0  # the generator stopped at module 2
  assert float(exits.exit_logits(modules, x)) == 24.0
  with pytest.raises(ValueError, match="Received: k=4"):
    exits.exit_logits(modules, x, 4)


def test_scope_wraps_each_module_and_outputs_are_cut():
  modules, entered = _scalar_modules(), []

  class _Scope:

    def __init__(self, k):
      self.k = k

    def __enter__(self):
      entered.append(self.k)

    def __exit__(self, *args):
      return False

  x = tf.constant(1.0)
  with tf.GradientTape() as tape:
    tape.watch(x)
    logits = [e.logits for e in exits.exits(modules, x, scope=_Scope)]
  assert entered == [0, 1, 2]
  # Each module's input is cut: nothing reaches x implicitly.
  assert tape.gradient(logits[-1], x) is None


def test_build_creates_every_weight():
  modules = [InterlockModule(keras.layers.Dense(4),
                             aux_head=keras.layers.Dense(2)),
             InterlockModule(keras.layers.Dense(3))]
  out = exits.build(modules, np.ones((5, 6), "float32"))
  assert out.shape == (5, 3)
  assert all(m.built for m in modules)
  assert len(modules[0].weights) == 4  # body and head kernels and biases


def test_metric_names_round_trip():
  assert metric_names.module_name(0) == "module_1"
  assert metric_names.metric_name(2, "loss") == "module_3/loss"
  assert metric_names.parse_metric_name("module_3/loss") == (2, "loss")
  assert metric_names.head_index("module_12") == 11
  with pytest.raises(ValueError, match="Received: head='final'"):
    metric_names.head_index("final")
  assert metric_names.network_head(
      {"module_2": 0, "module_10": 1, "module_3": 2}) == "module_10"


def test_older_results_are_read_in_todays_names():
  old = {"final": 0.9, "exit_1": 0.5, "exit_2": 0.7}
  assert metric_names.canonical_heads(old) == {
      "module_1": 0.5, "module_2": 0.7, "module_3": 0.9}
  # K known: a headless module before K does not shift the network's name.
  assert metric_names.canonical_heads({"final": 1, "exit_1": 0},
                                      num_modules=3) == {
                                          "module_1": 0, "module_3": 1}
  assert metric_names.canonical_heads({"module_2": 1, "module_1": 0}) == {
      "module_1": 0, "module_2": 1}
  with pytest.raises(ValueError, match="Received: head='best'"):
    metric_names.canonical_heads({"best": 1})


def test_committed_study_results_read_in_todays_names():
  path = os.path.join(ROOT, "docs", "results", "study_fashion_mnist",
                      "results.json")
  with open(path) as f:
    results = json.load(f)
  k = results["num_modules"]
  e2e = results["strategies"]["e2e"]
  heads = [metric_names.canonical_heads(run["eval"], num_modules=k)
           for run in e2e["runs"]]
  assert list(heads[0]) == [f"module_{i}" for i in range(1, k + 1)]
  assert heads[0][f"module_{k}"] == e2e["runs"][0]["eval"]["final"]
  network = metric_names.network_head(heads[0])
  assert np.mean([h[network]["accuracy"] for h in heads]) == pytest.approx(
      e2e["final"]["final"]["accuracy"]["mean"])


@pytest.mark.parametrize("final, exit_1", [("module_2", "module_1"),
                                           ("final", "exit_1")])
def test_a_run_is_summarized_in_todays_names(tmp_path, final, exit_1):
  # research.study_clock reads a run's TensorBoard events: today's tags and
  # those of runs written before the "module_k" scheme give the same result.
  from research import study_clock  # pylint: disable=import-outside-toplevel
  from train import run_dir  # pylint: disable=import-outside-toplevel
  run = run_dir.RunDir(str(tmp_path))
  with tf.summary.create_file_writer(run.train_log_dir).as_default():
    for step in (10, 20):
      tf.summary.scalar("step_time_s", 0.1, step=step)
  with tf.summary.create_file_writer(run.eval_log_dir).as_default():
    for step, value in ((10, 0.5), (20, 0.75)):
      tf.summary.scalar(f"{final}/accuracy", value, step=step)
      tf.summary.scalar(f"{exit_1}/accuracy", value / 2, step=step)
  summary = study_clock.summarize_run(str(tmp_path), "accuracy")
  assert summary["eval"] == {"module_1": {"accuracy": 0.375},
                             "module_2": {"accuracy": 0.75}}
  assert [p["value"] for p in summary["curve"]] == [0.5, 0.75]
