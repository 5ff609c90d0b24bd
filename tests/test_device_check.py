"""research.device_check: the cases each machine gets, and its degenerate run
here (K = 2, tiny sizes) with the JSON and the table it writes."""

import json
import os
import subprocess
import sys

import pytest

from tests.binaries import ROOT
from research import device_check


def _names(cases):
  return [case["name"] for case in cases]


@pytest.mark.parametrize("cpus, gpus, run, not_run", [
    (2, 0, ["cpu_k2_degenerate"],
     ["cpu_k4", "cpu_k8", "virtual_gpu_k4", "gpu_k4", "gpu_k8"]),
    (16, 1, ["cpu_k4", "cpu_k8", "virtual_gpu_k4"], ["gpu_k4", "gpu_k8"]),
    (8, 8, ["cpu_k4", "virtual_gpu_k4", "gpu_k4", "gpu_k8"], ["cpu_k8"]),
    (4, 1, ["virtual_gpu_k4"], ["cpu_k4", "cpu_k8", "gpu_k4", "gpu_k8"]),
])
def test_plan_cases(cpus, gpus, run, not_run):
  cases, skipped = device_check.plan_cases(cpus, gpus)
  assert _names(cases) == run
  assert _names(skipped) == not_run
  for case in cases:
    args = device_check.case_args(case, ["e2e", "2wise"])
    k = case["num_modules"]
    # One core (or GPU) per module for the schedule model too.
    assert f"--num_modules={k}" in args and f"--num_cores={k}" in args
    assert "--json" in args and "--strategies=e2e,2wise" in args
    if case["name"].startswith("cpu"):
      assert case["env"] == {"CUDA_VISIBLE_DEVICES": ""}
      assert "--placement=simulated" in args
      assert "--threads_per_device=1" in args
      assert "--modules_per_device=1" in args
    else:
      assert "--placement=gpu" in args
  virtual = [c for c in cases if c["name"] == "virtual_gpu_k4"]
  if virtual:
    assert virtual[0]["module"] == "research.benchmark_virtual_gpus"
    assert "--virtual_gpus=4" in device_check.case_args(virtual[0], ["e2e"])


def _start(out_dir, *flags):
  env = dict(os.environ, PYTHONPATH=ROOT)
  return subprocess.Popen(
      [sys.executable, "-m", "research.device_check", f"--out_dir={out_dir}",
       *flags], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE)


@pytest.mark.slow
def test_degenerate_device_check_writes_json_and_table(tmp_path):
  out_dir, late_dir = tmp_path / "check", tmp_path / "late"
  procs = [_start(out_dir, "--strategies=e2e,local"),
           _start(late_dir, "--strategies=e2e", "--time_limit_s=0.5")]
  (stdout, stderr), (_, late_err) = [p.communicate() for p in procs]
  assert procs[0].returncode == 0, stderr
  with open(out_dir / "device_check.json") as f:
    result = json.load(f)
  assert result["machine"]["cores"] == len(os.sched_getaffinity(0))
  [case] = result["cases"]
  assert case["name"] == "cpu_k2_degenerate" and case["num_modules"] == 2
  assert "--num_cores=2" in case["command"]
  assert set(case["rows"]) == {"e2e", "local"}
  for name, row in case["rows"].items():
    bench = case["benchmark"]["strategies"][name]
    assert row["measured_step_s"] == bench["measured_step_s"] > 0
    assert row["model_step_s"] == bench["predicted_step_s"] > 0
    assert row["model_over_measured"] == pytest.approx(
        row["model_step_s"] / row["measured_step_s"])
  assert case["rows"]["e2e"]["measured_speedup"] == 1.0
  assert {s["name"] for s in result["skipped"]} == {
      "cpu_k4", "cpu_k8", "virtual_gpu_k4", "gpu_k4", "gpu_k8"}
  table = (out_dir / "device_check.md").read_text()
  assert table in stdout
  assert "| cpu_k2_degenerate | 2 | local |" in table
  assert "Not run: cpu_k4 (needs >= 8 cores" in table
  # Out of time: an error, and the JSON says where it stopped.
  assert procs[1].returncode == 1 and "ran past the time left" in late_err
  with open(late_dir / "device_check.json") as f:
    late = json.load(f)
  assert late["cases"] == [] and "ran past" in late["error"]
