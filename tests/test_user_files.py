"""train.user_files and train.flag_bounds, in this process: the one writer
and the one reader of the files a research tool's flags name, and the
bounds a numeric flag's help states (issue 46). The binaries' own lines
are tests/test_research_files.py's."""

import json
import os

from absl import flags as absl_flags
import pytest

from tests.binaries import ROOT
from tests.research_flags import research_numeric_flags
from train import flag_bounds
from train import owned_dir
from train import user_files


@pytest.fixture
def outside(tmp_path):
  """A user's file outside what any flag names, and its bytes."""
  path = tmp_path / "outside" / "notes.txt"
  path.parent.mkdir()
  path.write_bytes(b"the user's notes\n")
  return path


def _refused(call, *words):
  with pytest.raises(ValueError) as e:
    call()
  line = str(e.value)
  assert "\n" not in line and "Received: " in line, line
  for word in words:
    assert word in line, line
  return line


def test_an_output_that_is_a_link_is_refused_and_its_target_kept(
    tmp_path, outside):
  link = tmp_path / "frontier.png"
  link.symlink_to(outside)
  _refused(lambda: user_files.write_output(str(link), b"PNG", "--png"),
           f"--png={link} is a symbolic link", str(outside),
           f"Received: png='{link}'")
  assert outside.read_bytes() == b"the user's notes\n"
  assert os.path.islink(link)
  # A dangling link too: writing through it would create its target.
  gone = tmp_path / "gone.png"
  gone.symlink_to(tmp_path / "outside" / "new.png")
  _refused(lambda: user_files.check_output(str(gone), "--png"),
           "is a symbolic link")
  assert not (tmp_path / "outside" / "new.png").exists()


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir(), "is a directory; give a file path"),
    (lambda p: os.mkfifo(p), "is not a regular file (a FIFO"),
    (lambda p: None, None),  # a new file: allowed
])
def test_an_output_must_be_a_file_path(tmp_path, make, words):
  path = tmp_path / "out.png"
  make(path)
  if words is None:
    user_files.write_output(str(path), b"PNG", "--png")
    assert path.read_bytes() == b"PNG"
    return
  _refused(lambda: user_files.write_output(str(path), b"PNG", "--png"),
           words)
  # `--png=DIR` once wrote DIR.png beside the folder.
  assert sorted(os.listdir(tmp_path)) == ["out.png"]


def test_an_output_needs_its_folder(tmp_path):
  _refused(lambda: user_files.check_output(str(tmp_path / "no" / "x.json"),
                                           "--out"),
           "does not exist; create it first")
  (tmp_path / "file").write_text("x")
  _refused(lambda: user_files.check_output(
      str(tmp_path / "file" / "x.json"), "--out"), "lies under the file")
  _refused(lambda: user_files.check_output("", "--out"), "needs a file path")
  _refused(lambda: user_files.check_output("ram://x.json", "--json_out"),
           "in this process's memory")


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
  path = tmp_path / "report.json"
  path.write_text("old")
  user_files.write_output(str(path), "new", "--json_out")
  assert path.read_text() == "new"
  assert os.listdir(tmp_path) == ["report.json"]


def test_an_input_must_be_a_regular_file_of_bounded_size(tmp_path):
  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)  # its read would block forever
  _refused(lambda: user_files.read_input(str(fifo), "--report"),
           f"--report={fifo} is a FIFO, not a regular file")
  _refused(lambda: user_files.read_input(str(tmp_path), "--report"),
           "is a directory")
  _refused(lambda: user_files.read_input("/dev/null", "--report"),
           "is a character device")
  _refused(lambda: user_files.read_input(str(tmp_path / "no"), "--report"),
           "cannot be read (No such file or directory)")
  big = tmp_path / "big.json"
  with open(big, "wb") as f:
    f.truncate(user_files.MAX_JSON_BYTES + 1)  # sparse: nothing is stored
  _refused(lambda: user_files.read_input(str(big), "--report"),
           f"holds {user_files.MAX_JSON_BYTES + 1} bytes, more than")
  # A link to a regular file is read (reading writes nothing).
  (tmp_path / "real.json").write_text("{}")
  (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
  assert user_files.read_json(str(tmp_path / "link.json"), "--report") == {}


@pytest.mark.parametrize("text, words", [
    ("[1, 2]", "not a JSON object"),
    ('{"cells": 5}', "its 'strategies' is 'None', not dict"),
    ("[" * 5000 + "]" * 5000, "nested"),
    ('{"strategies": ' + "[" * 40 + "]" * 40 + "}",
     f"nested deeper than {owned_dir.MAX_JSON_DEPTH} levels"),
    ("", "is not a readable JSON object (Expecting value"),
    ('{"strategies": {"e2e": ', "is not a readable JSON object"),
    ("\xff\xfe", "is not a readable JSON object"),
])
def test_a_json_input_of_another_shape_is_one_line(tmp_path, text, words):
  path = tmp_path / "report.json"
  path.write_bytes(text.encode("latin-1"))
  _refused(lambda: user_files.read_json(str(path), "--report",
                                        {"strategies": dict}),
           f"--report={path}", words, f"Received: report='{path}'")


def test_the_bounds_a_help_states_are_read():
  assert flag_bounds.bounds("Timed calls per case (>= 1).") == (1, False,
                                                                None)
  assert flag_bounds.bounds("Seconds (> 0) for all cases") == (0, True, None)
  assert flag_bounds.bounds("Speedup ... this (in [0, 1]).") == (0, False, 1)
  assert flag_bounds.bounds("K (>= 1; at most its blocks).") == (1, False,
                                                                 None)
  # Prose, not a bound: a comparison outside a parenthesis that opens it.
  assert flag_bounds.bounds("Runs at a time; > 1 overlaps them.") is None
  assert flag_bounds.bounds("A seed (the same for all runs).") is None


def test_a_value_outside_the_help_bounds_is_one_line():
  fresh = absl_flags.FlagValues()
  absl_flags.DEFINE_integer("repeats", 10, "Timed calls (>= 1).",
                            flag_values=fresh)
  absl_flags.DEFINE_float("time_limit_s", 1.0, "Seconds (> 0) in all.",
                          flag_values=fresh)
  absl_flags.DEFINE_float("efficiency", 0.5, "Speedup (in [0, 1]).",
                          flag_values=fresh)
  absl_flags.DEFINE_integer("seed", -3, "Any seed at all, negative too.",
                            flag_values=fresh)
  fresh(["prog"])
  assert flag_bounds.out_of_bounds(fresh) is None
  for argv, line in (
      (["--repeats=0"], "--repeats=0 is invalid: must be >= 1 (see "
       "--helpshort). Received: repeats=0"),
      (["--time_limit_s=0"], "--time_limit_s=0.0 is invalid: must be > 0"),
      (["--time_limit_s=nan"], "--time_limit_s=nan is invalid"),
      (["--efficiency=1.5"], "--efficiency=1.5 is invalid: must be in "
       "[0, 1]")):
    fresh.unparse_flags()
    fresh(["prog", *argv])
    assert flag_bounds.out_of_bounds(fresh).startswith(line)


# Numeric flags of the research tools whose help states no bound, and why.
UNBOUNDED = {
    ("collapse_probe", "init_seed"): "a seed: any integer",
    ("compare", "target"): "a metric value: accuracy or perplexity",
    ("cluster_benchmark", "num_workers"): "2 or 4, checked by the tool",
}


def test_every_numeric_research_flag_states_its_bound():
  # The check reads the bound from the help: a count whose help states
  # none (--repetitions, --batch_size) took 0 and ran for minutes.
  flags_found = research_numeric_flags()
  assert len(flags_found) > 40
  missing = [f"research.{tool} --{flag}: {text!r}"
             for tool, flag, text in flags_found
             if flag_bounds.bounds(text) is None and (tool, flag) not in
             UNBOUNDED]
  assert missing == []
  assert set(UNBOUNDED) <= {(tool, flag) for tool, flag, _ in flags_found}


def test_compares_report_is_not_written_through_a_planted_link(
    tmp_path, outside):
  # research.compare's report.md (and PNGs) go through the same writer: a
  # link planted in its folder is refused, its target kept.
  from research import study_report  # pylint: disable=g-import-not-at-top
  with open(os.path.join(ROOT, "docs", "results", "study_fashion_mnist",
                         "results.json")) as f:
    summary = json.load(f)
  folder = tmp_path / "study"
  folder.mkdir()
  (folder / study_report.REPORT).symlink_to(outside)
  _refused(lambda: study_report.write_outputs(summary, str(folder), False,
                                              "--report_dir"),
           "--report_dir=", "is a symbolic link")
  assert outside.read_bytes() == b"the user's notes\n"
  study_report.write_outputs(summary, str(tmp_path), False)
  assert (tmp_path / study_report.REPORT).read_text().startswith("#")
