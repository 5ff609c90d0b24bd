"""research.plot_study draws the README's picture from committed results."""

import os

import pytest

from research import plot_study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDIES = [os.path.join(ROOT, "docs", "results", name)
           for name in ("study_fashion_mnist", "study_fortunes_lm")]


def test_curves_put_steps_on_the_predicted_step_time():
  summary = plot_study.load_study(STUDIES[0])
  row = summary["strategies"]["local"]
  c = plot_study.curves(summary)["local"]
  per_step = row["predicted_step_s"]["one_core_per_module"]
  assert c["predicted"] == [p["step"] * per_step for p in row["curve"]]
  assert c["seconds"] == [p["seconds"] for p in row["curve"]]
  # Local learning is predicted faster per step than e2e with one core each.
  assert c["predicted"][-1] < plot_study.curves(summary)["e2e"]["predicted"][-1]


def test_draws_one_png_from_both_committed_studies():
  png = plot_study.draw([plot_study.load_study(s) for s in STUDIES])
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_a_folder_without_results_is_one_line(tmp_path):
  with pytest.raises(ValueError, match=r"cannot read a study's results from "
                     r".*results\.json .*Received: studies="):
    plot_study.load_study(str(tmp_path))


def test_a_positional_argument_is_one_line():
  with pytest.raises(SystemExit) as e:
    plot_study.main(["research.plot_study", "stray"])
  assert e.value.code == (
      "error: Unexpected arguments: ['stray']: this binary takes no "
      "positional arguments, only --name=value flags (see --helpshort). "
      "Received: arguments=['stray']")
