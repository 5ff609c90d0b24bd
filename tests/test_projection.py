"""Fixed-budget projection and a run's time accounting, on hand-made data.

Every expected number below is worked out by hand in the comments."""

import pytest

from step_model import projection
from research import study_clock
from research import study_lib
from research import study_report

# Two seeds evaluated at steps 10 and 20: (step, seconds, accuracy).
SEED_0 = [(10, 1.0, 0.5), (20, 2.0, 0.7)]
SEED_1 = [(10, 3.0, 0.3), (20, 4.0, 0.9)]


def test_band_and_aggregate_by_hand():
  assert projection.band([0.5, 0.3]) == pytest.approx((0.4, 0.3, 0.5))
  points = projection.aggregate([SEED_0, SEED_1])
  # Step 10: seconds (1 + 3) / 2 = 2, values 0.5 and 0.3.
  assert [p.step for p in points] == [10, 20]
  assert [p.seconds for p in points] == [2.0, 3.0]
  assert points[0].value == pytest.approx((0.4, 0.3, 0.5))
  assert points[1].value == pytest.approx((0.8, 0.7, 0.9))


def test_outcome_measured_and_predicted_by_hand():
  points = projection.aggregate([SEED_0, SEED_1])
  measured = [p.seconds for p in points]
  # Budget 2.5 s, half-way from 2 s to 3 s: mean 0.4 + (0.8 - 0.4) / 2, the
  # band's ends likewise; target 0.6 is crossed half-way as well: 2.5 s.
  result = projection.outcome(points, measured, 2.5, 0.6, True)
  assert result["metric_at_budget"] == pytest.approx((0.6, 0.5, 0.7))
  assert result["time_to_target_s"] == pytest.approx(2.5)
  # Predicted: 0.05 s per step puts the points at 0.5 s and 1.0 s.
  predicted = projection.predicted_seconds(points, 0.05)
  assert predicted == pytest.approx([0.5, 1.0])
  result = projection.outcome(points, predicted, 0.75, 0.6, True)
  assert result["metric_at_budget"] == pytest.approx((0.6, 0.5, 0.7))
  assert result["time_to_target_s"] == pytest.approx(0.75)
  # Nothing is known before the first or after the last evaluation.
  assert projection.outcome(points, measured, 1.0, 0.95, True) == {
      "metric_at_budget": None, "time_to_target_s": None}
  assert projection.outcome(points, measured, 3.5, None,
                            True)["metric_at_budget"] is None


def test_time_to_target_both_directions():
  # Perplexity 100 -> 50 over 0..10 s; 60 is 40 / 50 = 0.8 of the way.
  assert projection.time_to_target([0, 10], [100, 50], 60, False) == (
      pytest.approx(8.0))
  assert projection.time_to_target([0, 10], [100, 50], 40, False) is None
  # Reached at the first evaluation: that time, nothing earlier is known.
  assert projection.time_to_target([4, 10], [0.9, 0.95], 0.8, True) == 4


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="same steps"):
    projection.aggregate([SEED_0, [(10, 1.0, 0.5), (30, 2.0, 0.7)]])
  with pytest.raises(ValueError, match="finite"):
    projection.band([0.1, float("nan")])
  with pytest.raises(ValueError, match="step_time_s=0"):
    projection.predicted_seconds(projection.aggregate([SEED_0]), 0)


def test_account_time_by_hand():
  # (step at loop end, train event wall time, step_time_s): the first loop
  # of 10 steps took 5 s, later ones 0.2-0.3 s per step; the last loop has
  # 5 steps.
  loops = [(10, 100.0, 0.5), (20, 102.5, 0.2), (30, 106.0, 0.3),
           (35, 107.5, 0.2)]
  timing = study_clock.account_time(loops, {20: 103.5, 35: 109.0})
  # Median step 0.2 s; the first loop counts 10 * 0.2 = 2 s, its other 3 s
  # are tracing. Clock: 2, 2 + 2, 4 + 3, 7 + 1.
  assert timing["median_step_s"] == pytest.approx(0.2)
  assert timing["compile_s"] == pytest.approx(3.0)
  assert timing["clock"] == pytest.approx({10: 2.0, 20: 4.0, 30: 7.0,
                                           35: 8.0})
  assert timing["training_s"] == pytest.approx(8.0)
  # Evaluations: 103.5 - 102.5 and 109 - 107.5.
  assert timing["eval_s_each"] == pytest.approx({20: 1.0, 35: 1.5})
  assert timing["eval_s"] == pytest.approx(2.5)
  # From the first loop's start (100 - 5) to the last eval event (109).
  assert timing["wall_s"] == pytest.approx(14.0)
  with pytest.raises(ValueError, match=">= 2 training loops"):
    study_clock.account_time(loops[:1], {})
  with pytest.raises(ValueError, match="step 25 follows no training loop"):
    study_clock.account_time(loops, {25: 104.0})


def _row(seconds, values, step_s):
  curve = [{"step": step, "seconds": s, "mean": v, "min": v, "max": v}
           for step, s, v in zip((10, 20), seconds, values)]
  return {"curve": curve, "median_step_s": {"mean": step_s},
          "final": {"final": {"accuracy": {"mean": values[-1]}}}}


def test_add_projection_by_hand():
  summary = {"metric": "accuracy", "higher_is_better": True,
             "num_modules": 4, "strategies": {
                 "e2e": _row([2.0, 4.0], [0.5, 0.8], 0.2),
                 "2wise": _row([1.0, 2.0], [0.6, 0.9], 0.1)}}
  predicted = {"e2e": {2: 0.2, 4: 0.2}, "2wise": {2: 0.1, 4: 0.05}}
  study_report.add_projection(summary, predicted, cores_here=2)
  e2e, pair = summary["strategies"]["e2e"], summary["strategies"]["2wise"]
  assert pair["speedup_vs_e2e"] == pytest.approx(
      {"measured": 2.0, "model_here": 2.0, "predicted": 4.0})
  # Target: e2e's final 0.8. Budgets: the fastest whole run, 2wise's 2 s
  # measured and 20 steps * 0.05 s = 1 s predicted.
  assert summary["target"] == 0.8
  assert summary["budget_s"] == pytest.approx({"measured": 2.0,
                                               "predicted": 1.0})
  measured, projected = e2e["outcome"]["measured"], e2e["outcome"]["predicted"]
  assert measured["metric_at_budget"]["mean"] == pytest.approx(0.5)
  assert measured["time_to_target_s"] == pytest.approx(4.0)
  # e2e's first predicted evaluation is at 10 * 0.2 = 2 s > 1 s.
  assert projected["metric_at_budget"] is None
  assert projected["time_to_target_s"] == pytest.approx(4.0)
  # 2wise crosses 0.8 at (0.8 - 0.6) / (0.9 - 0.6) = 2/3 of its second
  # interval: 1 + 2/3 s measured, 0.5 + 2/3 * 0.5 s predicted.
  measured, projected = pair["outcome"]["measured"], pair["outcome"][
      "predicted"]
  assert measured["metric_at_budget"]["mean"] == pytest.approx(0.9)
  assert measured["time_to_target_s"] == pytest.approx(5 / 3)
  assert projected["metric_at_budget"]["mean"] == pytest.approx(0.9)
  assert projected["time_to_target_s"] == pytest.approx(5 / 6)


def test_add_projection_states_the_pipeline_peer():
  summary = {"metric": "accuracy", "higher_is_better": True,
             "num_modules": 4, "cores_here": 2, "strategies": {
                 "e2e": _row([2.0, 4.0], [0.5, 0.8], 0.2),
                 "2wise": _row([1.0, 2.0], [0.6, 0.9], 0.1)}}
  predicted = {"e2e": {2: 0.2, 4: 0.2}, "2wise": {2: 0.1, 4: 0.05}}
  pipeline = {2: {"microbatches": 2, "step_s": 0.15},
              4: {"microbatches": 8, "step_s": 0.1}}
  study_report.add_projection(summary, predicted, cores_here=2,
                              pipeline=pipeline)
  pair = summary["strategies"]["2wise"]
  assert pair["speedup_vs_pipeline"] == pytest.approx(
      {"model_here": 1.5, "predicted": 2.0})
  assert summary["strategies"]["e2e"]["speedup_vs_pipeline"][
      "predicted"] == pytest.approx(0.5)
  assert summary["pipeline_peer"]["one_core_per_module"]["microbatches"] == 8
  text = "\n".join(study_report._peer_lines(summary))
  assert "M = 8, 100.0 ms with one core per module" in text
  assert "| 2wise | 1.50x | 2.00x |" in text


def test_per_module_work_shows_the_imbalance():
  cost = {"forward": 0.001, "input_vjp": 0.001, "weight_vjp": 0.001,
          "aux": 0.0005, "update": 0.0005}
  heavy = {k: 3 * v for k, v in cost.items()}
  summary = {"module_costs": {"costs": [cost, heavy, cost, cost]}}
  text = "\n".join(study_report._work_lines(summary))
  assert "| 1 | 1.0 | 1.0 | 1.0 | 0.5 | 0.5 | 4.0 |" in text
  assert "| 2 | 3.0 | 3.0 | 3.0 | 1.5 | 1.5 | 12.0 |" in text
  # 12 against a mean of (4 * 3 + 12) / 4 = 6.
  assert "Slowest module / mean module: 2.00." in text


def test_predict_pipeline_is_the_best_microbatched_e2e():
  cost = {"forward": 1.0, "input_vjp": 1.0, "weight_vjp": 1.0, "aux": 0.0,
          "update": 0.0}
  costs = {"costs": [cost] * 4, "has_aux": [True] * 4}
  peer = study_lib.predict_pipeline(costs, [2, 4])
  # With one core per module the pipeline's step shrinks towards the
  # busiest device's 3 units as M grows: the largest M tried wins, faster
  # than plain e2e's 8 (F1..F4, BX4..BX2, BW1).
  assert peer[4]["microbatches"] == 16
  assert 3.0 < peer[4]["step_s"] < 8.0
  # On 2 cores the 11 units of work take at least 5.5.
  assert peer[2]["step_s"] >= 5.5
