"""`research.user_study`: the strategy study on a user's own Keras model.

The functions `tiny_cnn` and `tiny_data` are what a user brings; each run
of the study imports them by name in a process of its own.
"""

import json
import os

import numpy as np
import pytest

from research import study_report
from research import user_study
from tests.keras_models import sequential_cnn

SIZE, BATCH = 8, 8
MODEL_FN = "tests.test_user_study:tiny_cnn"
DATA = "tests.test_user_study:tiny_data"


def tiny_cnn(seed):
  return sequential_cnn(seed=seed, size=SIZE)


def tiny_data(seed):
  rng = np.random.default_rng(seed)

  def split(num):
    x = rng.normal(size=(num, SIZE, SIZE, 1)).astype("float32")
    # A learnable label: the sign pattern of four pixels.
    bits = (x[:, 2:6:2, 2:6:2, 0] > 0).reshape(num, -1)
    return x, (bits * [1, 2, 4, 8]).sum(axis=1).astype("int32") % 10

  return split(8 * BATCH), split(4 * BATCH)


def test_study_on_a_from_keras_model_writes_the_report(tmp_path):
  out_dir = str(tmp_path / "study")
  summary = user_study.compare(
      tiny_cnn, DATA, out_dir=out_dir, strategies=("e2e", "2wise"),
      seeds=(0,), steps=4, eval_points=2, batch_size=BATCH, optimizer="sgd",
      cost_repeats=1)
  names = sorted(os.listdir(out_dir))
  for name in ("report.md", "results.json", "module_costs.json",
               *study_report.PLOTS):
    assert name in names, names
  with open(os.path.join(out_dir, "results.json")) as f:
    results = json.load(f)
  assert results == json.loads(json.dumps(summary))
  assert results["preset"].endswith("test_user_study:tiny_cnn")
  rows = results["strategies"]
  assert list(rows) == ["e2e", "2wise"]
  for name, row in rows.items():
    run, = row["runs"]
    assert (run["strategy"], run["seed"], run["steps"]) == (name, 0, 4)
    assert [p["step"] for p in row["curve"]] == [2, 4]
    assert sorted(run["eval"]) == ["module_1", "module_2", "module_3"]
    assert 0 <= run["eval"]["module_3"]["accuracy"] <= 1
    # The projection with one core per module, from the measured costs.
    predicted = row["predicted_step_s"]["one_core_per_module"]
    assert predicted > 0
    assert row["speedup_vs_e2e"]["predicted"] == pytest.approx(
        rows["e2e"]["predicted_step_s"]["one_core_per_module"] / predicted)
  assert len(results["module_costs"]["costs"]) == 3
  assert "2wise" in results["module_costs"]["projection_one_core_per_module"]
  with open(os.path.join(out_dir, "report.md")) as f:
    report = f.read()
  assert "tiny_cnn: 4 steps per run, 1 seed(s), K = 3" in report.splitlines()[0]
  assert "| e2e | 4 |" in report and "| 2wise | 4 |" in report
  assert "predicted, 3 cores ms" in report

  # A rerun reuses every finished run and the op costs.
  again = user_study.compare(
      tiny_cnn, DATA, out_dir=out_dir, strategies=("e2e", "2wise"),
      seeds=(0,), steps=4, eval_points=2, batch_size=BATCH, optimizer="sgd",
      cost_repeats=1)
  assert again["strategies"]["2wise"]["runs"] == rows["2wise"]["runs"]
