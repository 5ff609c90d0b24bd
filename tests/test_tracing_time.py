"""research.tracing_time: one-line errors for bad flags, and a real cell.

Its bad flags (TRACING_TIME_BAD_FLAGS) are refused in test_flag_help.py,
in the child process that imports every binary anyway
(tests.refusals.run_each_with_helps): a process of their own would cost a
TensorFlow import of seconds for five refusals. The real binary runs in
test_one_cell_times_tracing_then_steady_calls (make test-slow).
"""

import json
import subprocess
import sys

import pytest

from tests import binaries

# research.tracing_time defines absl flags (--model, ...) that
# train.flags_lib defines too, so it is never imported into the test
# process: its table is made in a child.
_FORMAT = ("import json, sys\n"
           "from research import tracing_time\n"
           "print(tracing_time.format_table(json.load(sys.stdin)))\n")


@pytest.mark.slow
def test_one_cell_times_tracing_then_steady_calls():
  proc = binaries.run_binary(
      "research.tracing_time", "--model=mlp", "--width=32", "--batch_size=8",
      "--num_modules=2", "--calls=1", "--cell=2wise", "--steps_per_loop=2")
  row = json.loads(proc.stdout.strip().splitlines()[-1])
  assert row["strategy"] == "2wise" and row["steps_per_loop"] == 2
  # The first call includes the tracing; the steady call repeats nothing.
  assert 0 < row["trace_s"] < row["first_s"]
  assert 0 < row["steady_s"] < row["first_s"]
  assert row["over_s"] == pytest.approx(row["first_s"] - row["steady_s"])
  assert 0 < row["trace_cpu_s"] < row["first_cpu_s"]
  table = subprocess.run(
      [sys.executable, "-c", _FORMAT], input=json.dumps({
          "model": "mlp", "num_modules": 2, "batch_size": 8,
          "load_average": [1.0, 2.0, 3.0], "rows": [row]}),
      cwd=binaries.ROOT, capture_output=True, text=True, check=True,
      timeout=120).stdout
  assert "load average=1.0/2.0/3.0" in table
  assert table.splitlines()[-1].split()[:4] == ["2wise", "unrolled",
                                                "default", "2"]


def test_predict_blocks_orders_the_blocks(tmp_path):
  # Four equal blocks, one a module: a block of the call's 4 steps is the
  # unrolled call; smaller blocks wait more often, and end to end, which
  # has no slack across steps, never waits longer.
  profile = tmp_path / "profile.json"
  profile.write_text(json.dumps(
      {"module_costs_ms": [[1.0, 2.0, 3.0, 0.5, 0.25]] * 4}))
  proc = binaries.run_binary(
      "research.predict_blocks", f"--profile={profile}", "--split=1,1,1,1",
      "--steps_per_loop=4", "--blocks=1,2,4", "--strategies=local,e2e")
  ratios = json.loads(proc.stdout)["step_time_over_unrolled"]
  assert ratios["e2e"] == {"1": 1.0, "2": 1.0, "4": 1.0}
  assert ratios["local"]["4"] == 1.0
  assert ratios["local"]["1"] > ratios["local"]["2"] > 1.0
