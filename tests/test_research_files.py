"""The research tools' hostile inputs and outputs, through their real mains
(issue 46): a --png that is a link to a user's file, or a folder; a report
that is a FIFO, a list, nested 5,000 deep, empty, truncated or all NaN; a
trace that is truncated or random bytes; a numeric flag outside the
bounds its help states.

Each case must end with exit status 1 and one "error:" line naming the
flag or the file, and nothing outside what the user named may change (the
outside file's bytes are compared). All command lines of all tools run in
one child process (tests.refusals.run_each), and refuse before any work,
so the whole sweep costs one process start.
"""

import json
import os

import numpy as np
import pytest

from tests import refusals
from tests.research_flags import research_binaries
from tests.research_flags import research_numeric_flags
from tf_interlock import tf_private
from train import flag_bounds

pytestmark = pytest.mark.slow

OUTSIDE = b"a user's file, not the tool's\n"


def _report(step_s=0.1, mb=10.0):
  """A research.benchmark report of two cells (what plot_frontier draws)."""
  row = {"measured_step_s": step_s, "predicted_step_s": None,
         "memory_count_mb": [{"total": mb}]}
  return {"model": "mlp", "num_modules": 2, "placement": "simulated",
          "num_cores": 2, "strategies": {"e2e": row, "local": dict(
              row, memory_count_mb=[{"total": mb * 2}])}}


def _trace_folder(root, name, data):
  """A TensorBoard log folder whose one trace file holds `data` (None: a
  FIFO in its place); returns the folder."""
  folder = root / name
  run = folder / "plugins" / "profile" / "2026_01_01"
  run.mkdir(parents=True)
  if data is None:
    os.mkfifo(run / "host.xplane.pb")
  else:
    (run / "host.xplane.pb").write_bytes(data)
  return str(folder)


def _xspace_bytes():
  """A real XSpace with a host plane and one event, serialized."""
  space = tf_private.profiler_xspace(b"")
  plane = space.planes.add(name="/host:CPU", id=1)
  plane.event_metadata[1].name = "MatMul:MatMul"
  line = plane.lines.add(id=1, timestamp_ns=1)
  line.events.add(metadata_id=1, offset_ps=0, duration_ps=1000)
  return space.SerializeToString()


def _below(text):
  """A value just outside the bounds `text` states (`flag_bounds`)."""
  minimum, exclusive, maximum = flag_bounds.bounds(text)
  if maximum is not None:
    return maximum + 1
  return minimum if exclusive else minimum - 1


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  """{case: (result, outside path, watched files)} of every case, from
  one child process."""
  root = tmp_path_factory.mktemp("research_files")
  outside = root / "outside.txt"
  outside.write_bytes(OUTSIDE)
  good = root / "report.json"
  good.write_text(json.dumps(_report()))
  link = root / "link.png"
  link.symlink_to(outside)
  folder = root / "folder.png"
  folder.mkdir()
  fifo = root / "fifo"
  os.mkfifo(fifo)

  def report(name, text):
    path = root / name
    path.write_text(text)
    return str(path)

  big = root / "big.json"
  with open(big, "wb") as f:
    f.truncate(64 << 20 | 1)  # sparse: larger than any report
  nan = json.dumps(_report(float("nan"), float("nan")))
  shapes = {
      "a list": (report("list.json", "[1]"), "not a JSON object"),
      "cells 5": (report("cells.json", '{"cells": 5}'),
                  "its 'strategies' is 'None', not dict"),
      "nested": (report("nested.json", "[" * 5000 + "]" * 5000), "nested"),
      "empty": (report("empty.json", ""), "is not a readable JSON object"),
      "truncated": (report("cut.json", json.dumps(_report())[:40]),
                    "is not a readable JSON object"),
      "all NaN": (report("nan.json", nan), "no cell has a finite memory"),
      "a cell of text": (report("text.json", json.dumps(
          {"strategies": {"e2e": "fast"}})), "not a research.benchmark"),
      "a FIFO": (str(fifo), "is a FIFO, not a regular file"),
      "a folder": (str(root), "is a directory, not a regular file"),
      "a device": ("/dev/null", "is a character device"),
      "too large": (str(big), "more than the"),
  }
  cases = {}  # case: (module, flags, words, files that must not change)
  for name, (path, words) in shapes.items():
    cases[f"plot_frontier --report {name}"] = (
        "research.plot_frontier",
        [f"--report={path}", f"--png={root / 'ok.png'}"], [words, path], [])
  for name, png, words in (
      ("link", link, "is a symbolic link"),
      ("folder", folder, "is a directory; give a file path"),
      ("missing folder", root / "no" / "x.png", "does not exist")):
    cases[f"plot_frontier --png {name}"] = (
        "research.plot_frontier", [f"--report={good}", f"--png={png}"],
        [f"--png={png}", words], [])
    traces = _trace_folder(root, "tb_" + name.replace(" ", "_"),
                           _xspace_bytes())
    cases[f"timeline --png {name}"] = (
        "research.timeline", [f"--tensorboard_dir={traces}", f"--png={png}"],
        [f"--png={png}", words], [])
  for name, data, words in (
      ("truncated", _xspace_bytes()[:-7], "is not a readable profiler trace"),
      ("random", np.random.default_rng(0).bytes(4096),
       "host.xplane.pb"),
      ("a FIFO", None, "is a FIFO, not a regular file"),
      ("empty", b"", "holds no /host:CPU plane")):
    traces = _trace_folder(root, "trace_" + name.replace(" ", "_"), data)
    cases[f"timeline trace {name}"] = (
        "research.timeline", [f"--tensorboard_dir={traces}",
                              f"--png={root / 't.png'}"], [words], [])
  # predict_frontier --reuse_inputs: its PREFIX_k2.png a link out, its
  # PREFIX_k3.json a folder, stored inputs of another shape.
  (root / "pf_k2.json").write_text(json.dumps({"inputs": {}}))
  (root / "pf_k2.png").symlink_to(outside)
  (root / "pf_k3.json").mkdir()
  (root / "bad_k2.json").write_text(json.dumps(
      {"inputs": {"module_costs_ms": "x"}}))
  reuse = ["--num_modules=2", "--microbatches=1", "--reuse_inputs",
           f"--measured={good}"]
  cases.update({
      "predict_frontier png link": (
          "research.predict_frontier", [*reuse, f"--out_prefix={root}/pf"],
          [f"{root}/pf_k2.png is a symbolic link", "--out_prefix"],
          [root / "pf_k2.json"]),
      "predict_frontier json folder": (
          "research.predict_frontier",
          ["--num_modules=3", "--microbatches=1", "--reuse_inputs",
           f"--out_prefix={root}/pf"], ["pf_k3.json is a directory"], []),
      "predict_frontier inputs of another shape": (
          "research.predict_frontier", [*reuse, f"--out_prefix={root}/bad"],
          ["--out_prefix", "bad_k2.json does not hold what"],
          [root / "bad_k2.json"]),
      "predict_frontier measured FIFO": (
          "research.predict_frontier",
          [*reuse[:3], f"--measured={shapes['a FIFO'][0]}",
           f"--out_prefix={root}/bad"], ["--measured", "is a FIFO"], []),
      "predict_frontier measured nested": (
          "research.predict_frontier",
          [*reuse[:3], f"--measured={shapes['nested'][0]}",
           f"--out_prefix={root}/bad"], ["--measured", "nested"], []),
      "plot_study --png_out link": (
          "research.plot_study", [f"--png_out={link}"],
          ["--png_out", "is a symbolic link"], []),
      "plot_study --png_out folder": (
          "research.plot_study", [f"--png_out={folder}"],
          ["--png_out", "is a directory"], []),
      "benchmark --json_out link": (
          "research.benchmark", [f"--json_out={link}"],
          ["--json_out", "is a symbolic link"], []),
  })
  # Every numeric flag of every research tool, just outside the bounds
  # its help states: refused before any work (--repeats=0 ran minutes).
  tools = set(research_binaries())
  for tool, flag, text in research_numeric_flags():
    if f"research.{tool}" in tools and flag_bounds.bounds(text):
      value = _below(text)
      value = int(value) if value == int(value) else value
      cases[f"{tool} --{flag}={value}"] = (
          f"research.{tool}", [f"--{flag}={value}"],
          [f"--{flag}={value}", "is invalid: must be",
           f"Received: {flag}="], [])
  by_module = {}
  for case, (module, flags_given, _, _) in cases.items():
    by_module.setdefault(module, []).append(flags_given)
  watched = {case: {path: open(path, "rb").read()
                    for path in [outside, good, *extra]}
             for case, (_, _, _, extra) in cases.items()}
  before = sorted(os.listdir(root))
  results = refusals.run_each(by_module)
  found = {}
  taken = {module: 0 for module in by_module}
  for case, (module, _, words, _) in cases.items():
    found[case] = (results[module][taken[module]], words, watched[case])
    taken[module] += 1
  return found, before, root


def test_the_sweep_covers_every_research_tool_with_bounded_flags(sweep):
  found, _, _ = sweep
  tools = {case.split()[0] for case in found}
  assert {"plot_frontier", "timeline", "predict_frontier", "plot_study",
          "benchmark",
          "compare", "concurrency_probe", "device_check"} <= tools
  assert len(found) > 60


def test_every_case_is_one_line_and_nothing_outside_changed(sweep):
  found, before, root = sweep
  failures = []
  for case, (result, words, watched) in found.items():
    lines = result["stderr"].strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    if (result["code"] != 1 or len(errors) != 1 or
        "Traceback" in result["stderr"] or
        not all(word in errors[0] for word in words)):
      failures.append(f"{case}: {result}")
    for path, data in watched.items():
      if open(path, "rb").read() != data:
        failures.append(f"{case}: {path} changed")
  assert failures == []
  # No DIR.png beside a folder, no PNG of a refused report, no
  # temporary file left: the folder holds what the test put there.
  assert sorted(os.listdir(root)) == before
  assert not (root / "ok.png").exists() and not (root / "t.png").exists()
