"""train.compare end to end on generated data: two strategies for a tiny
budget each, the three outputs, and reruns that reuse the finished runs."""

import importlib.util
import json
import os

from tests.binaries import run_binary

STRATEGIES = ("e2e", "local")


def _mtimes(out_dir):
  """Modification times of what a strategy's run leaves behind."""
  paths = [os.path.join(out_dir, s, "result.json") for s in STRATEGIES]
  paths += [os.path.join(out_dir, "logs", f"{s}.log") for s in STRATEGIES]
  return {path: os.path.getmtime(path) for path in paths}


def _check_results(out_dir):
  with open(os.path.join(out_dir, "results.json")) as f:
    results = json.load(f)
  assert results["metric"] == "accuracy"
  assert "--strategies=e2e,local" in results["command"]
  assert set(results["strategies"]) == set(STRATEGIES)
  for name, row in results["strategies"].items():
    assert row["steps"] >= 5 and row["median_step_s"] > 0, name
    assert row["eval_every_steps"] == 5 and row["probe_step_s"] is None
    assert set(row["eval"]) == {"final", "exit_1", "exit_2", "exit_3"}
    seconds = [point["seconds"] for point in row["curve"]]
    assert seconds == sorted(seconds) and 0 < seconds[0]
    assert row["curve"][-1]["step"] == row["steps"]
    assert row["curve"][-1]["value"] == row["eval"]["final"]["accuracy"]
  assert results["strategies"]["e2e"]["speedup_vs_e2e"] == 1.0
  assert results["strategies"]["local"]["speedup_vs_e2e"] > 0
  return results


def test_compare_writes_reports_and_reuses_finished_runs(tmp_path):
  out_dir = str(tmp_path / "compare")
  common = ["--preset=synthetic_mlp", f"--out_dir={out_dir}",
            "--budget_s=2", "--eval_every_steps=5"]
  first = run_binary("train.compare", *common, "--strategies=e2e,local")
  assert "not rerun" not in first.stdout
  results = _check_results(out_dir)
  with open(os.path.join(out_dir, "report.md")) as f:
    report = f.read()
  for name, row in results["strategies"].items():
    assert f"| {name} | {row['steps']} |" in report
  assert results["command"] in report
  if importlib.util.find_spec("matplotlib"):
    assert os.path.getsize(os.path.join(out_dir, "metric_vs_time.png")) > 0
  else:
    assert "matplotlib is not installed" in first.stdout

  before = _mtimes(out_dir)
  second = run_binary("train.compare", *common, "--strategies=e2e,local")
  assert second.stdout.count("finished earlier, not rerun") == 2
  assert _mtimes(out_dir) == before
  assert _check_results(out_dir) == results

  other = run_binary("train.compare", *common[:-1], "--eval_every_steps=10",
                     "--strategies=e2e", check=False)
  assert other.returncode == 1 and "use a new --out_dir" in other.stderr
  assert _mtimes(out_dir) == before
