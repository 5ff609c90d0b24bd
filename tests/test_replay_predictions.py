"""research.replay_predictions: a report's cells predicted again from the
costs, scale, microbatch costs and loop the report kept."""

import json
import math

import pytest

from research import benchmark_lib
from research import replay_predictions
from step_model import schedule

COST = schedule.ModuleCost(forward=1.0, input_vjp=2.0, weight_vjp=3.0,
                           aux=0.5, update=0.25)


def _report():
  costs_ms = benchmark_lib.costs_ms([COST] * 4)
  micro_ms = benchmark_lib.costs_ms([COST.scaled(0.5)] * 4)
  return {"num_cores": 2, "runs": [
      {"plan": "2 devices x 1 thread, 2 modules each",
       "threads_per_device": 1, "module_costs_ms": costs_ms,
       "strategies": {
           "2wise": {"measured_step_s": 8.0, "predicted_step_s": 9.0,
                     "cost_scale": 0.5, "loop": "while", "loop_block": 2},
           "e2e-m2": {"measured_step_s": 10.0, "predicted_step_s": 10.0,
                      "microbatch_costs_ms": micro_ms},
           "local": {"measured_step_s": 4.0, "predicted_step_s": None}}},
      # Two threads a device: not replayed.
      {"plan": "1 device x 2 threads", "threads_per_device": 2,
       "module_costs_ms": costs_ms,
       "strategies": {"e2e": {"measured_step_s": 1.0,
                              "predicted_step_s": 1.0}}}]}


def test_each_cell_is_predicted_from_what_its_report_kept():
  rows = replay_predictions.replay(_report())
  assert [(plan[:9], name) for plan, name, _, _ in rows] == [
      ("2 devices", "2wise"), ("2 devices", "e2e-m2")]
  half = [COST.scaled(0.5)] * 4
  two_wise = benchmark_lib.predict(half, "2wise", 2, 1, [0, 0, 1, 1],
                                   ops_per_device=2, loop="while",
                                   loop_block=2)
  piped = benchmark_lib.predict([COST] * 4, "e2e-m2", 2, 1, [0, 0, 1, 1],
                                microbatch_costs={2: half}, ops_per_device=2)
  assert rows[0][2:] == (9.0 / 8.0, pytest.approx(two_wise / 8.0))
  assert rows[1][2:] == (1.0, pytest.approx(piped / 10.0))
  # Its own loop, not the one its name resolves to (unrolled for 2-wise).
  unrolled = benchmark_lib.predict(half, "2wise", 2, 1, [0, 0, 1, 1],
                                   ops_per_device=2)
  assert unrolled != pytest.approx(two_wise)


def test_summary_counts_the_band_and_the_rms_log_error():
  within, rms = replay_predictions.summary([1.0, 1.15, 0.84, 2.0])
  assert within == 2
  assert rms == pytest.approx(math.sqrt(
      (math.log(1.15) ** 2 + math.log(0.84) ** 2 + math.log(2.0) ** 2) / 4))


def test_main_reads_a_glob_and_refuses_one_that_matches_nothing(
    tmp_path, capsys):
  (tmp_path / "a.json").write_text(json.dumps(_report()))
  (tmp_path / "other.json").write_text(json.dumps({"cells": {}}))
  with pytest.raises(SystemExit):
    replay_predictions.app.run(
        replay_predictions.main,
        ["replay", f"--reports={tmp_path}/*.json"])
  out = capsys.readouterr().out
  assert "now: " in out and " of 2 cells within 15%" in out
  with pytest.raises(SystemExit) as e:
    replay_predictions.app.run(
        replay_predictions.main,
        ["replay", f"--reports={tmp_path}/none*.json"])
  assert e.value.code != 0
  assert "Received: reports=" in capsys.readouterr().err
