"""research.real_models: its table and JSON at the tiniest sizes, and a
bad --models or --layouts value refused in one line before any cell runs.

The real binary (a main process and one child per cell, each importing
TF) runs in test_tiny_bert_e2e_k2_reports_every_field (make test-slow); the
default sizes take minutes per cell and are never run here.
"""

import json
import math

import pytest

from tests import refusals
from tests.binaries import run_binary

TINY = ["--num_layers=1", "--hidden_dim=8", "--num_heads=2", "--seq_len=4",
        "--vocab_size=16", "--num_classes=2", "--batch_size=2", "--steps=2",
        "--steps_per_execution=2", "--calls=1"]

_CELL_FIELDS = ("first_call_s", "first_call_cpu_s", "step_s", "step_min_s",
                "step_max_s", "steps_per_s", "setup_s", "params")


def _positive(row, fields):
  for field in fields:
    value = row[field]
    assert isinstance(value, (int, float)) and math.isfinite(value) and (
        value > 0), (field, row)


@pytest.mark.slow
def test_tiny_bert_e2e_k2_reports_every_field(tmp_path):
  path = tmp_path / "real.json"
  proc = run_binary("research.real_models", "--models=bert",
                    "--layouts=k2,k2host", "--strategies=e2e", *TINY,
                    f"--json_out={path}")
  report = json.loads(path.read_text())
  assert report["steps"] == 2 and report["calls"] == 1
  assert report["sizes"]["batch_size"] == 2 and "issue 45" in report["goals"]
  keras_row, e2e, host = report["cells"]
  # Plain Keras: its own process, TF's default threading (0: every core).
  assert keras_row["model"] == "bert" and keras_row["strategy"] == "keras"
  assert keras_row["layout"] is None and keras_row["num_modules"] is None
  assert keras_row["thread_pools"]["intra_op"] == 0
  assert "steps_per_s_vs_keras" not in keras_row
  # e2e at k2: 2 simulated devices of 1 intra-op thread each.
  assert e2e["strategy"] == "e2e" and e2e["layout"] == "k2"
  assert e2e["num_modules"] == 2 and e2e["plan"] == "2 devices x 1 thread"
  assert e2e["thread_pools"] == {"intra_op": 1, "inter_op": 2}
  # e2e at k2host: 2 modules on the one default device, default threading.
  assert host["strategy"] == "e2e" and host["layout"] == "k2host"
  assert host["num_modules"] == 2 and host["plan"] == "default threading"
  assert host["thread_pools"]["intra_op"] == 0
  assert sorted(host["goals"]) == sorted(e2e["goals"])
  for row in (keras_row, e2e, host):
    _positive(row, _CELL_FIELDS)
    assert row["first_call_s"] > row["step_s"]  # it traces
    assert row["steps_per_s"] == pytest.approx(1 / row["step_s"])
    assert row["step_min_s"] <= row["step_s"] <= row["step_max_s"]
  _positive(e2e, ("steps_per_s_vs_keras", "first_call_vs_keras"))
  assert e2e["steps_per_s_vs_keras"] == pytest.approx(
      e2e["steps_per_s"] / keras_row["steps_per_s"])
  assert e2e["first_call_vs_keras"] == pytest.approx(
      e2e["first_call_s"] / keras_row["first_call_s"])
  # e2e's goals: its speed and its first call against plain Keras.
  assert sorted(e2e["goals"]) == ["first_call_vs_keras <= 2",
                                  "steps_per_s_vs_keras >= 0.95"]
  assert all(isinstance(met, bool) for met in e2e["goals"].values())
  table = proc.stdout
  assert "bert" in table and "2 devices x 1 thread" in table
  assert "Goals (issue 45)" in table


def test_a_bad_model_or_layout_is_one_line_naming_it():
  results = refusals.run("research.real_models", [
      ["--models=gpt2,vgg16"], ["--layouts=k2,two"], ["--models=gpt2",
                                                     "--strategies=e2e,3way"],
      ["--loop_block=2"], ["--loop=pipelined", "--strategies=local,2wise"]])
  for result, words in zip(results, (
      ["--models='vgg16' is invalid", "must be one of ('gpt2', 'bert', "
       "'mobilenet_v2')"],
      ["--layouts='two' is invalid", "must be kN"],
      ["--strategies='e2e,3way' is invalid", "'3way' is not a strategy"],
      ["--loop_block=2 is invalid",
       "must be 1 unless --loop=while or pipelined (--loop=auto)"],
      ["--strategies='local,2wise' is invalid", "'2wise' cannot run at K = 2",
       "loop='pipelined' runs local learning only"])):
    lines = result["stderr"].strip().splitlines()
    assert result["code"] == 1 and len(lines) == 1, result
    assert lines[0].startswith("error: ") and all(
        word in lines[0] for word in words), lines
