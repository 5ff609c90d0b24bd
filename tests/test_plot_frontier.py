"""research.plot_frontier: the frontier of a benchmark report, drawn."""

import json

import pytest

from research import plot_frontier
from tests import binaries


def _report():
  def row(step_s, mb, predicted=None):
    return {"measured_step_s": step_s, "predicted_step_s": predicted,
            "memory_count_mb": [{"total": mb}, {"total": mb / 2}],
            "memory_measured_mb": {"CPU:0": 30.0 - mb, "CPU:1": 1.0}}
  # e2e-m4 is beaten by local on both; e2e is the smallest, local the
  # fastest: both on the frontier.
  return {"model": "mlp", "num_modules": 2, "placement": "simulated",
          "num_cores": 2, "strategies": {
              "e2e": row(0.3, 10.0, 0.25), "local": row(0.1, 12.0),
              "e2e-m4": row(0.2, 14.0), "old": {"measured_step_s": 1.0}}}


def test_the_frontier_keeps_the_cells_no_other_beats_on_both():
  cells = plot_frontier.points(_report())
  assert [c[0] for c in cells] == ["e2e", "local", "e2e-m4"]
  assert cells[0] == ("e2e", 10.0, 300.0, 250.0)
  assert plot_frontier.frontier(cells) == {"e2e", "local"}
  # Measured, the order of memory is reversed: e2e-m4 (16 MB) beats e2e
  # (20 MB) on both.
  measured = plot_frontier.points(_report(), memory="measured")
  assert measured[2] == ("e2e-m4", 16.0, 200.0, None)
  assert plot_frontier.frontier(measured) == {"e2e-m4", "local"}


def test_one_command_draws_the_png(tmp_path):
  report = tmp_path / "report.json"
  report.write_text(json.dumps(_report()))
  out = tmp_path / "frontier.png"
  binaries.run_binary("research.plot_frontier", f"--report={report}",
                      f"--png={out}", "--memory=measured")
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cells_with_nan_are_left_out_and_all_nan_is_refused(capsys):
  # A cell whose step time is NaN (a failed measurement) is not drawn, and
  # said so; a report with no finite cell draws nothing.
  report = _report()
  report["strategies"]["local"]["measured_step_s"] = float("nan")
  cells = plot_frontier.drawable(report, "r.json")
  assert [c[0] for c in cells] == ["e2e", "e2e-m4"]
  assert "cells local have NaN or infinite numbers" in capsys.readouterr().err
  for row in report["strategies"].values():
    row["measured_step_s"] = float("nan")
  with pytest.raises(ValueError, match=r"^--report=r\.json: no cell has a "
                     r"finite memory and step time .*Received: "
                     r"report='r\.json'$"):
    plot_frontier.drawable(report, "r.json")
