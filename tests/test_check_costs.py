"""research.check_costs: every per-call check of `fit` timed, refusals."""

import json

from tests import binaries


def test_every_check_is_timed_and_the_logs_check_is_shared_per_step(tmp_path):
  out = tmp_path / "costs.json"
  proc = binaries.run_binary(
      "research.check_costs", "--examples=64", "--width=8",
      "--large_weights=64", "--repeats=1", f"--json_out={out}")
  report = json.loads(out.read_text())
  assert json.loads(proc.stdout) == report
  seconds = report["seconds"]
  assert set(seconds) == {
      "call_guard", "check_fit", "check_labels",
      "sample_weights.check_arrays", "nonfinite_logs",
      "nonfinite_weights_mlp", "nonfinite_weights_large"}
  assert all(value > 0 for value in seconds.values()), seconds
  # 8 hidden layers of 8 x 8 and their biases, the head of 8 x 10 and 10,
  # and modules 1-3's aux heads, each as large as the head.
  assert report["mlp_weights"] == 8 * (8 * 8 + 8) + 4 * (8 * 10 + 10)
  per_step = report["logs_check_per_step_s"]
  assert per_step["steps_per_execution_16"] * 16 == (
      per_step["steps_per_execution_1"])


def test_a_bad_count_is_one_line_before_anything_runs(tmp_path):
  out = tmp_path / "costs.json"
  proc = binaries.run_binary("research.check_costs", "--large_weights=7",
                             f"--json_out={out}", check=False)
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert lines[-1].endswith("Received: large_weights=7"), proc.stderr
  assert not out.exists()
