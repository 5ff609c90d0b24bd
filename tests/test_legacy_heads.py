"""Results of older studies (heads "exit_k" and "final") read in today's
"module_k" names: `research.legacy_heads` and the study tools on it."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from research import legacy_heads
from research import study_clock
from tests.binaries import ROOT
from tf_interlock import metric_names
from train import run_dir


def test_older_results_are_read_in_todays_names():
  old = {"final": 0.9, "exit_1": 0.5, "exit_2": 0.7}
  assert legacy_heads.canonical_heads(old) == {
      "module_1": 0.5, "module_2": 0.7, "module_3": 0.9}
  # K known: a headless module before K does not shift the network's name.
  assert legacy_heads.canonical_heads({"final": 1, "exit_1": 0},
                                      num_modules=3) == {
                                          "module_1": 0, "module_3": 1}
  assert legacy_heads.canonical_heads({"module_2": 1, "module_1": 0}) == {
      "module_1": 0, "module_2": 1}
  with pytest.raises(ValueError, match="Received: head='best'"):
    legacy_heads.canonical_heads({"best": 1})


def test_committed_study_results_read_in_todays_names():
  path = os.path.join(ROOT, "docs", "results", "study_fashion_mnist",
                      "results.json")
  with open(path) as f:
    results = json.load(f)
  k = results["num_modules"]
  e2e = results["strategies"]["e2e"]
  heads = [legacy_heads.canonical_heads(run["eval"], num_modules=k)
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
