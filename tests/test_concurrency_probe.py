"""research.concurrency_probe: its report and its one-line flag errors."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*flags):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  return subprocess.run(
      [sys.executable, "-m", "research.concurrency_probe", *flags], cwd=ROOT,
      env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_report_times_every_case_for_every_batch(tmp_path):
  out = tmp_path / "probe.json"
  run = _run("--width=32", "--layers=1", "--batches=8,4", "--repeats=2",
             f"--out={out}")
  assert run.returncode == 0, run.stderr
  report = json.loads(out.read_text())
  assert report["devices"] == 2 and report["inter_op_threads"] == 2
  assert sorted(report["batches"]) == ["4", "8"]
  for row in report["batches"].values():
    for case in ("alone", "two_devices", "one_device"):
      assert row[f"{case}_ms"] > 0
    # The ratios are of the unrounded times (and rounded to 1e-3); the ms
    # are rounded to 1 us, which moves a ratio by up to this much.
    alone, two = row["alone_ms"], row["two_devices_ms"]
    slack = (two / alone) * (1e-3 / alone + 1e-3 / two) + 1e-3
    assert abs(row["two_devices_ratio"] - two / alone) <= slack
  assert run.stdout.splitlines()[0].startswith("batch | alone ms")


@pytest.mark.slow
def test_bad_flags_fail_in_one_line_before_writing(tmp_path):
  out = tmp_path / "probe.json"
  for flags, received in ((["--devices=1"], "Received: devices=1"),
                          (["--batches=8,x"], "Received: batches='8,x'"),
                          (["--network=mlp", "--microbatches=2,1"],
                           "Received: microbatches='2,1'")):
    run = _run(*flags, f"--out={out}")
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stderr
    assert lines[0].endswith(received), lines[0]
  assert not out.exists()


@pytest.mark.slow
def test_network_modules_are_timed_alone_and_side_by_side(tmp_path):
  out = tmp_path / "probe.json"
  run = _run("--network=mlp", "--repeats=1", "--microbatches=4",
             f"--out={out}")
  assert run.returncode == 0, run.stderr
  report = json.loads(out.read_text())
  # The whole batch first (the model's default), then batch / M.
  assert report["network"] == "mlp" and list(report["batches"]) == [
      "512", "128"]
  for row in report["batches"].values():
    # The schedule model's c explains the measured times (>= 1).
    assert row["contention"] == pytest.approx(max(1.0, 1.0 + (
        row["two_devices_ms"] - row["alone_ms"]) / row["faster_alone_ms"]),
                                              abs=2e-3)
    assert row["faster_alone_ms"] <= row["alone_ms"]
  assert report["batches"]["128"]["alone_ms"] < report["batches"]["512"][
      "alone_ms"]
  row = report["batches"]["512"]
  # Two modules' work at once takes at least the slower one's alone (less
  # a little timing noise), whatever the contention.
  assert row["two_devices_ms"] > 0.5 * row["alone_ms"] > 0


def test_the_cases_take_turns(monkeypatch):
  # Each round calls every case once, in order, after two warm-ups each: a
  # host that slows down half way through slows every case alike.
  from research import concurrency_probe  # pylint: disable=import-outside-toplevel
  calls, clock = [], [0.0]
  monkeypatch.setattr(concurrency_probe.time, "perf_counter",
                      lambda: clock[0])

  def case(name, seconds):
    def fn():
      calls.append(name)
      # The host runs twice as slowly from the 11th call on.
      clock[0] += seconds * (2.0 if len(calls) > 10 else 1.0)
      return []
    return fn

  medians = concurrency_probe._medians_s(  # pylint: disable=protected-access
      (("a", case("a", 1.0)), ("b", case("b", 3.0))), repeats=4)
  assert calls == ["a", "a", "b", "b"] + ["a", "b"] * 4
  # Rounds 1-3 at full speed, round 4 at half: each median is of 1, 1, 1, 2
  # (times 3 for b), so the ratio b / a stays 3.
  assert medians == {"a": 1.0, "b": 3.0}


@pytest.mark.parametrize("layers", [1, 3])
def test_a_network_probe_builds_modules_of_the_layers_asked(monkeypatch,
                                                            layers):
  # The benchmark's MLP has 1 layer per module, the grid's 2: the probe of
  # a network must measure the modules of the shape it is asked for.
  import types  # pylint: disable=import-outside-toplevel
  from research import benchmark_lib  # pylint: disable=import-outside-toplevel
  from research import concurrency_probe  # pylint: disable=import-outside-toplevel
  built = []

  class Built(Exception):
    pass

  def build_trainer(spec, *args, **kwargs):
    del args, kwargs
    built.append(spec)
    raise Built

  monkeypatch.setattr(concurrency_probe, "_INTRA",
                      types.SimpleNamespace(value=1))
  monkeypatch.setattr(benchmark_lib, "build_trainer", build_trainer)
  with pytest.raises(Built):
    concurrency_probe.module_probe(["/cpu:0", "/cpu:1"], "mlp", 1,
                                   layers=layers)
  reference = benchmark_lib.make_spec(num_modules=2, layers_per_module=layers,
                                      model="mlp", width=1024,
                                      batch_size=512)
  assert built == [reference]
