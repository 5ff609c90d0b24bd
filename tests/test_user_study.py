"""`research.user_study`: the strategy study on a user's own Keras model.

The functions `tiny_cnn` and `tiny_data` are what a user brings; each run
of the study imports them by name in a process of its own.
"""

import json
import os

import numpy as np
import pytest

from layers import aux_heads
from research import study_report
from research import user_study
from tests.binaries import run_binary
from tests.keras_models import sequential_cnn
from train import config as config_lib

# make test-slow (research.user_study end to end).
pytestmark = pytest.mark.slow

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


@pytest.mark.slow  # research.compare end to end, its own process
def test_command_line_with_a_time_budget(tmp_path):
  out_dir = str(tmp_path / "study")
  # 1e-9 s: the first call (tracing) is not counted, the second spends it,
  # so every run stops after two steps, on any machine.
  out = run_binary(
      "research.compare", f"--model_fn={MODEL_FN}", f"--data={DATA}",
      "--strategies=local", "--seeds=1", "--time_budget_s=1e-9",
      "--eval_every_steps=1", f"--batch_size={BATCH}", "--optimizer=sgd",
      "--learning_rate=0.05", "--cost_repeats=1", "--noplots",
      f"--out_dir={out_dir}")
  assert "report.md" in out.stdout
  with open(os.path.join(out_dir, "results.json")) as f:
    results = json.load(f)
  assert results["time_budget_s"] == 1e-9 and results["eval_points"] is None
  assert results["overrides"]["optimizer"]["config"][
      "learning_rate"] == pytest.approx(0.05)
  # One strategy (the in-process study above runs two), and not e2e: the
  # report has no e2e to compare with and says so.
  assert list(results["strategies"]) == ["local"]
  assert results["target_source"] == "none (no e2e run and no --target)"
  run, = results["strategies"]["local"]["runs"]
  assert run["stopped_by_budget"] and run["steps"] == 2
  assert [p["step"] for p in run["curve"]] == [1, 2]
  with open(os.path.join(out_dir, "report.md")) as f:
    title = f.readline()
  assert title.startswith(f"# {MODEL_FN}: 1e-09 s of training (time budget)")


@pytest.mark.parametrize("kwargs, message", [
    ({}, "steps=None, time_budget_s=None"),
    ({"steps": 4, "time_budget_s": 1.0}, "steps=4, time_budget_s=1.0"),
    ({"time_budget_s": 1.0}, "eval_every_steps=None"),
    ({"steps": 5, "eval_points": 2}, "eval_points=2"),
    ({"steps": 10, "seeds": ()}, r"seeds=\(\)"),
    ({"steps": 10, "metric": "bleu"}, "metric='bleu'"),
    ({"steps": 10, "strategies": ("e2e", "3wise")}, "strategies=e2e,3wise"),
    ({"steps": 10, "strategies": "e2e,pairwise,2wise"},
     "strategies=e2e,pairwise,2wise"),
    ({"steps": 10, "optimizer": 0.1}, "optimizer=0.1"),
])
def test_bad_arguments_are_refused_before_anything_is_written(
    tmp_path, kwargs, message):
  out_dir = tmp_path / "study"
  with pytest.raises(ValueError, match="Received: " + message):
    user_study.compare(MODEL_FN, DATA, out_dir=str(out_dir), **kwargs)
  assert not out_dir.exists()


@pytest.mark.parametrize("model_fn, message", [
    (lambda: None, "model_fn=<function"),
    ("tests.test_user_study", "model_fn='tests.test_user_study'"),
    ("tests.no_such_module:f", "cannot import tests.no_such_module"),
    ("tests.test_user_study:no_such_fn", "has no function no_such_fn"),
])
def test_model_fn_must_be_importable_by_name(tmp_path, model_fn, message):
  with pytest.raises(ValueError, match=message):
    user_study.compare(model_fn, DATA, out_dir=str(tmp_path), steps=4)


def test_a_script_file_names_its_function():
  path = os.path.abspath(__file__)
  ref = f"{path}:tiny_cnn"
  assert user_study.reference(ref, "model_fn") == ref
  fn = user_study.resolve(ref, "model_fn")
  assert fn.__name__ == "tiny_cnn" and fn is not tiny_cnn  # loaded anew
  for mine, theirs in zip(fn(0).get_weights(), tiny_cnn(0).get_weights()):
    np.testing.assert_array_equal(mine, theirs)


def test_seeds_of_a_budget_keep_the_steps_every_seed_reached(monkeypatch):
  def run(steps, end):
    return {"steps": end, "curve": [{"step": s} for s in steps + [end]]}

  fake = {"e2e": [run([10, 20], 27), run([10, 20, 30], 31)],
          "local": [run([10, 20, 30, 40], 44)]}
  monkeypatch.setattr(user_study.study_lib, "run_all",
                      lambda study, break_lock, train: fake)
  runs = user_study.run_all_common_steps(None, False, None)
  assert [[p["step"] for p in r["curve"]] for r in runs["e2e"]] == [
      [10, 20], [10, 20]]
  # One seed: its curve keeps the point where the budget ended.
  assert [p["step"] for p in runs["local"][0]["curve"]] == [10, 20, 30, 40,
                                                             44]
  assert [r["steps"] for r in runs["e2e"]] == [27, 31]


def test_perplexity_is_the_exp_of_each_heads_loss():
  from research import user_study_cell  # pylint: disable=g-import-not-at-top
  heads = user_study_cell.heads_of(
      {"loss": np.log(4.0), "module_1/loss": 0.0,
       "module_2/loss": np.log(4.0), "module_2/accuracy": 0.5},
      "perplexity", 2)
  assert list(heads) == ["module_1", "module_2"]
  assert heads["module_1"]["perplexity"] == pytest.approx(1.0)
  assert heads["module_2"] == pytest.approx(
      {"loss": np.log(4.0), "accuracy": 0.5, "perplexity": 4.0})


def test_a_model_from_keras_cannot_cut_is_refused_before_any_run(tmp_path):
  out_dir = tmp_path / "study"
  with pytest.raises(ValueError, match="Received: num_modules=9"):
    user_study.compare(tiny_cnn, DATA, out_dir=str(out_dir), steps=10,
                       num_modules=9, strategies=("e2e", "local"))
  assert not out_dir.exists()


@pytest.mark.parametrize("flag,passed", [
    ("authors", "authors"), ("linear", "linear"), ("pool", "linear"),
    ("none", None)])
def test_aux_head_flag_reaches_from_keras_as_a_registry_name(
    monkeypatch, flag, passed):
  seen = {}
  monkeypatch.setattr(user_study, "compare",
                      lambda *args, **kwargs: seen.update(kwargs))
  config = config_lib.Config(aux_head=flag)
  user_study.compare_from_flags("m.py:f", "d.py:g", config, {"aux_head"},
                                preset_given=False, seeds=1)
  assert seen["aux_head"] == passed
  assert passed is None or passed in aux_heads.names()
