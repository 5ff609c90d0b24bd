"""research.model_validation: flag checks, predictions from a profile, the
report from hand-built results, and the benchmark's strategy cells."""

import os
import subprocess
import sys

import pytest

from step_model import schedule
from research import benchmark_lib
from research import validation_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*flags):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  return subprocess.Popen(
      [sys.executable, "-m", "research.model_validation", *flags], cwd=ROOT,
      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_bad_flags_fail_in_one_line_before_writing(tmp_path):
  kept = tmp_path / "kept"
  kept.mkdir()
  (kept / "predictions.json").write_text("ours")
  # A probe report from before `contention` was written.
  old_probe = tmp_path / "old_probe"
  old_probe.mkdir()
  (old_probe / "mlp.json").write_text('{"batches": {"512": {"alone_ms": 1}}}')
  cases = [
      (["--networks=mlp,cnn"], "networks", "Received: networks='mlp,cnn'"),
      (["--plans=3x1"], "plans", "Received: plans='3x1'"),
      (["--strategies=e2e,e2e-m0"], "strategies",
       "Received: strategies='e2e,e2e-m0'"),
      (["--steps=0"], "steps", "Received: steps=0"),
      ([f"--out_dir={kept}"], "out_dir", f"Received: out_dir='{kept}'"),
      ([f"--contention_from={kept}", "--networks=mlp"], "contention_from",
       f"Received: contention_from='{kept}'"),
      ([f"--contention_from={old_probe}", "--networks=mlp"],
       "contention_from", f"Received: contention_from='{old_probe}'"),
  ]
  runs = []
  for i, (flags, name, received) in enumerate(cases):
    out = [] if flags[0].startswith("--out_dir") else [
        f"--out_dir={tmp_path / str(i)}"]
    runs.append((flags, name, received, _run(*out, *flags)))
  for flags, name, received, proc in runs:
    out, err = proc.communicate(timeout=300)
    lines = err.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, (flags, err)
    assert lines[0].startswith(f"error: --{name}="), lines[0]
    assert lines[0].endswith(received), lines[0]
  # Nothing was written or replaced.
  assert sorted(os.listdir(tmp_path)) == ["kept", "old_probe"]
  assert (kept / "predictions.json").read_text() == "ours"


def test_parse_cell_and_pipeline_peer():
  assert benchmark_lib.parse_cell("2wise") == ("2wise", 1)
  assert benchmark_lib.parse_cell("2wise-sum") == ("2wise-sum", 1)
  assert benchmark_lib.parse_cell("e2e-m4") == ("e2e", 4)
  # A cell's loop suffix (`cell_loop`) is an option, not the strategy; the
  # trainer a cell builds runs that loop.
  assert benchmark_lib.parse_cell("local-unrolled") == ("local", 1)
  assert benchmark_lib.parse_cell("e2e-m4-lean-while") == ("e2e", 4)
  assert [benchmark_lib.cell_loop(name) for name in (
      "local", "local-unrolled", "2wise-m2-pipelined", "e2e-m4-rc-while")] == [
          "auto", "unrolled", "pipelined", "while"]
  assert benchmark_lib.cell_options("local-lean-unrolled") == {
      "recompute": False, "memory_lean": True}
  assert benchmark_lib.is_pipeline("e2e-m2")
  assert not benchmark_lib.is_pipeline("e2e")
  assert not benchmark_lib.is_pipeline("local-m2")
  rows = {"e2e": {"measured_step_s": 4.0, "predicted_step_s": 4.0},
          "e2e-m2": {"measured_step_s": 3.0, "predicted_step_s": 2.5},
          "e2e-m4": {"measured_step_s": 2.0, "predicted_step_s": 3.5},
          "local": {"measured_step_s": 1.0, "predicted_step_s": 1.0}}
  assert benchmark_lib.pipeline_peer(rows) == ("e2e-m4", 2.0, 2.5)
  benchmark_lib.add_peer(rows)
  assert rows["local"]["measured_speedup_vs_pipeline"] == 2.0
  assert rows["local"]["predicted_speedup_vs_pipeline"] == 2.5
  assert rows["e2e"]["pipeline_peer"] == "e2e-m4"
  no_peer = {"e2e": {"measured_step_s": 1.0, "predicted_step_s": 1.0}}
  benchmark_lib.add_peer(no_peer)
  assert "measured_speedup_vs_pipeline" not in no_peer["e2e"]


def test_predict_uses_the_microbatches_of_the_cell():
  costs = [schedule.ModuleCost(1.0, 1.0, 1.0)] * 4
  e2e = benchmark_lib.predict(costs, "e2e", num_cores=4)
  m4 = benchmark_lib.predict(costs, "e2e-m4", num_cores=4)
  m8 = benchmark_lib.predict(costs, "e2e-m8", num_cores=4)
  # K = 4 unit modules, e2e: the chain F1..F4, then the input VJPs of
  # modules 4, 3, 2 and the weight VJP of module 1 (each other weight VJP
  # overlaps the next input VJP on another device): 4 + 3 + 1 = 8.
  assert e2e == pytest.approx(8.0)
  # Microbatches fill the pipeline: faster, and towards the busiest
  # device's load of 3 (F + BX + BW) as M grows.
  assert 3.0 < m8 < m4 < e2e


def _results():
  costs = [[2.0, 1.0, 1.0, 0.5, 0.1]] * 2
  predictions = {
      "started": "t0", "repetitions": 3, "groups": {"mlp/2x1": {
          "plan": "2 devices x 1 thread", "module_costs_ms": costs,
          "module_costs_min_ms": costs, "module_costs_max_ms": costs,
          "cells": {s: {"predicted_step_s": p, "predicted_min_s": p * 0.9,
                        "predicted_max_s": p * 1.1}
                    for s, p in (("e2e", 0.010), ("local", 0.005))}}}}
  measured = {
      "command": "python -m research.model_validation", "host": "h",
      "machine": "x86_64", "num_cores": 2, "onednn": "1", "started": "t1",
      "steps": 5, "steps_per_loop": 8, "cells": {
          "mlp/2x1/e2e": {"measured_step_s": 0.0105, "measured_min_s": 0.01,
                          "measured_max_s": 0.011},
          "mlp/2x1/local": {"measured_step_s": 0.004, "measured_min_s": 0.004,
                            "measured_max_s": 0.005}}}
  return predictions, measured


def test_report_flags_the_cells_off_by_more_than_ten_percent():
  predictions, measured = _results()
  rows = validation_report.rows(predictions, measured)
  assert [round(r["ratio"], 3) for r in rows] == [0.952, 1.25]
  text = validation_report.render(predictions, measured)
  assert "**1 of 2 cells within 10%.** Worst: mlp 2x1 local" in text
  assert "| e2e | 10.0 [9.0-11.0] | 10.5 [10.0-11.0] | 0.95 |" in text
  assert "| local | 5.0 [4.5-5.5] | 4.0 [4.0-5.0] | 1.25 **off** |" in text
  assert "- mlp 2x1 local: 1.25" in text


def test_report_takes_the_hosts_measured_drift_out():
  predictions, measured = _results()
  # The host ran the reference 10.0 and 12.0 ms around the profile (mean
  # 11), 13.2 ms around the local cell: 1.2x slower, so model x drift /
  # measured = 1.25 / 1.2 x ... = 5.0 x 1.2 / 4.0 = 1.5; around e2e the
  # same speed as the profile: 0.95 stays.
  predictions["groups"]["mlp/2x1"]["host_reference_ms"] = [10.0, 12.0]
  measured["cells"]["mlp/2x1/e2e"]["host_reference_ms"] = [11.0, 11.0]
  measured["cells"]["mlp/2x1/local"]["host_reference_ms"] = [13.2, 13.2]
  rows = validation_report.rows(predictions, measured)
  assert [round(r["drift"], 3) for r in rows] == [1.0, 1.2]
  assert [round(r["drift_ratio"], 3) for r in rows] == [0.952, 1.5]
  text = validation_report.render(predictions, measured)
  assert "| e2e | 10.0 [9.0-11.0] | 10.5 [10.0-11.0] | 0.95 | 1.00 | 0.95 |" \
      in text
  assert "| local | 5.0 [4.5-5.5] | 4.0 [4.0-5.0] | 1.25 **off** | 1.20 | " \
      "1.50 |" in text
  assert ("(model x drift / measured): **1 of 2 cells within 10%**; worst "
          "mlp 2x1 local, 1.50.") in text
  # A cell of an older run without reference times: no drift, shown as -.
  del measured["cells"]["mlp/2x1/e2e"]["host_reference_ms"]
  text = validation_report.render(predictions, measured)
  assert "| e2e | 10.0 [9.0-11.0] | 10.5 [10.0-11.0] | 0.95 | - | - |" in text
  assert "**0 of 1 cells within 10%**; worst mlp 2x1 local" in text


def test_reports_without_reference_times_have_no_drift_column():
  predictions, measured = _results()
  assert validation_report.drift(None, [1.0]) is None
  assert validation_report.drift([2.0, 4.0], [3.6]) == pytest.approx(1.2)
  text = validation_report.render(predictions, measured)
  assert "drift" not in text


def test_report_lists_failed_cells_apart():
  predictions, measured = _results()
  measured["cells"]["mlp/2x1/2wise"] = {"error": "research.benchmark failed"}
  assert len(validation_report.rows(predictions, measured)) == 2
  text = validation_report.render(predictions, measured)
  assert "## Cells that failed\n\n- mlp/2x1/2wise: research.benchmark failed" in text


def test_report_refuses_a_cell_without_prediction():
  predictions, measured = _results()
  measured["cells"]["mlp/2x1/2wise"] = measured["cells"]["mlp/2x1/e2e"]
  with pytest.raises(ValueError, match="Received: cell='mlp/2x1/2wise'"):
    validation_report.rows(predictions, measured)


def _earlier_run(tmp_path):
  """(predictions, measured, folder): `_results()` stored as a run's files."""
  import json  # pylint: disable=import-outside-toplevel
  predictions, measured = _results()
  old = tmp_path / "old"
  old.mkdir()
  (old / "predictions.json").write_text(json.dumps(predictions))
  (old / "measured.json").write_text(json.dumps(measured))
  return predictions, measured, old


@pytest.mark.slow
def test_repredict_from_an_earlier_run_is_marked_in_sample(tmp_path):
  import json  # pylint: disable=import-outside-toplevel
  predictions, measured, old = _earlier_run(tmp_path)
  new = tmp_path / "new"
  proc = _run(f"--out_dir={new}", f"--repredict_from={old}")
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  again = json.loads((new / "predictions.json").read_text())
  assert "in sample" in again["in_sample"]
  cells = again["groups"]["mlp/2x1"]["cells"]
  # Today's model on the stored costs (2 ms forward, 1 ms each VJP, ...),
  # not the hand-written 10 ms and 5 ms of the old file.
  assert sorted(cells) == ["e2e", "local"]
  assert cells["e2e"]["predicted_step_s"] != 0.010
  assert cells["local"]["predicted_step_s"] < cells["e2e"]["predicted_step_s"]
  report = (new / "report.md").read_text()
  assert report.startswith("# Schedule model, re-predicted IN SAMPLE from")
  assert not (new / "measured.json").exists()
  # The earlier run's files are read, never changed.
  assert json.loads((old / "measured.json").read_text()) == measured
  assert again["groups"]["mlp/2x1"]["contention"] == {}
  assert "Contention c: 1 (none) (from none)." in report


@pytest.mark.slow
def test_repredict_with_a_probe_contention_slows_overlapping_cells(
    tmp_path):
  import json  # pylint: disable=import-outside-toplevel
  predictions, measured, old = _earlier_run(tmp_path)
  probes = tmp_path / "probes"
  probes.mkdir()
  (probes / "mlp.json").write_text(json.dumps(
      {"network": "mlp", "batches": {"512": {"contention": 1.5},
                                     "256": {"contention": 1.25}}}))
  runs = {}
  for name, extra in (("none", []), ("probe", [f"--contention_from={probes}"])):
    proc = _run(f"--out_dir={tmp_path / name}", f"--repredict_from={old}",
                *extra)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    runs[name] = json.loads((tmp_path / name / "predictions.json").read_text(
    ))["groups"]["mlp/2x1"]
  assert runs["probe"]["contention"] == {"512": 1.5, "256": 1.25}
  assert runs["probe"]["contention_source"] == str(probes / "mlp.json")
  without, with_c = (runs[n]["cells"]["local"]["predicted_step_s"]
                     for n in ("none", "probe"))
  # Local at K = 2 overlaps its two modules: slower, at most 1.5x.
  assert without < with_c <= 1.5 * without + 1e-12
  # The model of the cell equals the schedule model's with that factor.
  costs = benchmark_lib.costs_from_ms(predictions["groups"]["mlp/2x1"][
      "module_costs_ms"])
  assert with_c == pytest.approx(benchmark_lib.predict(
      costs, "local", 2, 1, (0, 1), ops_per_device=2, contention=1.5))
  report = (tmp_path / "probe" / "report.md").read_text()
  assert (f"Contention c: 1.500 at batch 512, 1.250 at batch 256 (from "
          f"{probes / 'mlp.json'})." in report)


@pytest.mark.slow
def test_repredict_takes_the_contention_of_each_cells_batch_and_threads(
    tmp_path):
  """A cell of M microbatches takes the probe's factor at batch / M (the
  whole batch's where the probe has no such batch); a plan of 2 threads per
  device with a probe of 2-thread modules lets every device run an op at
  once (4 x 2 cores: the OS shares them), each slowed by that factor."""
  import json  # pylint: disable=import-outside-toplevel
  from step_model import threading_plan  # pylint: disable=import-outside-toplevel
  predictions, measured, old = _earlier_run(tmp_path)
  group = predictions["groups"]["mlp/2x1"]
  predictions["groups"]["mlp/4x2"] = dict(
      group, module_costs_ms=group["module_costs_ms"] * 2,
      module_costs_min_ms=group["module_costs_ms"] * 2,
      module_costs_max_ms=group["module_costs_ms"] * 2)
  cell = measured["cells"]["mlp/2x1/e2e"]
  measured["cells"] = {f"mlp/{plan}/{name}": cell for plan in ("2x1", "4x2")
                       for name in ("local", "e2e-m2", "e2e-m4")}
  (old / "predictions.json").write_text(json.dumps(predictions))
  (old / "measured.json").write_text(json.dumps(measured))
  probes = tmp_path / "probes"
  probes.mkdir()
  (probes / "mlp.json").write_text(json.dumps({"batches": {
      "512": {"contention": 1.5}, "256": {"contention": 1.25}}}))
  runs = {}
  for name in ("one", "both"):
    if name == "both":
      (probes / "mlp_intra2.json").write_text(json.dumps({"batches": {
          "512": {"contention": 1.75}}}))
    proc = _run(f"--out_dir={tmp_path / name}", f"--repredict_from={old}",
                f"--contention_from={probes}")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    runs[name] = json.loads((tmp_path / name / "predictions.json").read_text(
    ))["groups"]
  two = benchmark_lib.costs_from_ms(group["module_costs_ms"])
  four = two * 2
  for name, c in (("local", 1.5), ("e2e-m2", 1.25), ("e2e-m4", 1.5)):
    assert runs["one"]["mlp/2x1"]["cells"][name]["predicted_step_s"] == (
        pytest.approx(benchmark_lib.predict(two, name, 2, 1, (0, 1),
                                            ops_per_device=2, contention=c)))
    # No 2-thread probe: 4x2 keeps v3's whole cores, no contention.
    assert runs["one"]["mlp/4x2"]["cells"][name]["predicted_step_s"] == (
        pytest.approx(benchmark_lib.predict(
            four, name, threading_plan.host_cores(), 2, (0, 1, 2, 3),
            ops_per_device=4)))
    assert runs["both"]["mlp/4x2"]["cells"][name]["predicted_step_s"] == (
        pytest.approx(benchmark_lib.predict(four, name, 8, 2, (0, 1, 2, 3),
                                            ops_per_device=4,
                                            contention=1.75)))
  assert runs["both"]["mlp/4x2"]["contention"] == {"512": 1.75}
  assert runs["both"]["mlp/4x2"]["contention_source"] == str(
      probes / "mlp_intra2.json")
