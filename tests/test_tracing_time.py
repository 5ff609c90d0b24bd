"""research.tracing_time: one-line errors for bad flags, and a real cell."""

import json
import subprocess
import sys

import pytest

from tests import binaries
from tests import refusals

# research.tracing_time defines absl flags (--model, ...) that
# train.flags_lib defines too, so it is never imported into the test
# process: its table is made in a child.
_FORMAT = ("import json, sys\n"
           "from research import tracing_time\n"
           "print(tracing_time.format_table(json.load(sys.stdin)))\n")


BAD_FLAGS = [
    ("--model=vgg", "--model='vgg' is invalid"),
    ("--steps_per_loop=1,x", "--steps_per_loop='1,x' is invalid"),
    ("--strategies=2wise,nowise", "--strategies='nowise' is invalid"),
    ("--loops=unrolled,scan", "--loops='unrolled,scan' is invalid"),
    ("--graph_optimizations=none", "--graph_optimizations='none' is "
     "invalid"),
]


@pytest.fixture(scope="module")
def refused():
  """{flag: result}: every bad flag through the binary's main, in one
  process (tests.refusals)."""
  results = refusals.run("research.tracing_time",
                         [[flag] for flag, _ in BAD_FLAGS])
  return {flag: result for (flag, _), result in zip(BAD_FLAGS, results)}


@pytest.mark.parametrize("flag,shown", BAD_FLAGS)
def test_bad_flags_fail_in_one_line(refused, flag, shown):
  result = refused[flag]
  assert result["code"] == 1
  lines = result["stderr"].strip().splitlines()
  assert len(lines) == 1 and shown in lines[0], result["stderr"]
  assert "Received:" in lines[0]


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
