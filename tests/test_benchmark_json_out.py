"""research.benchmark checks --json_out before it runs (issue 29): a
folder or a path in a missing folder is refused in one line at once, not
after the whole benchmark."""

import os

import pytest

from tests import refusals
from tests.binaries import run_binary

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("where, words", [
    ("", "is a directory; give a file path"),
    ("no/x.json", "does not exist; create it first"),
])
def test_json_out_is_refused_before_the_run(tmp_path, where, words):
  path = str(tmp_path / where) if where else str(tmp_path)
  proc = run_binary("research.benchmark", f"--json_out={path}", check=False)
  errors = proc.stderr.strip().splitlines()
  assert proc.returncode == 1 and len(errors) == 1, errors
  assert words in errors[0] and errors[0].endswith(
      f"Received: json_out={path!r}"), errors
  assert proc.stdout == ""  # nothing was measured


def test_xla_benchmark_out_is_refused_before_the_run(tmp_path):
  # make benchmark's second table: the same check, under its own flag name.
  path = str(tmp_path / "no" / "x.json")
  proc = run_binary("research.xla_benchmark", f"--out={path}", check=False)
  errors = proc.stderr.strip().splitlines()
  assert proc.returncode == 1 and len(errors) == 1, errors
  assert "does not exist; create it first" in errors[0] and errors[0].endswith(
      f"Received: out={path!r}"), errors
  assert proc.stdout == ""


def test_a_fifo_or_device_json_out_is_refused_before_the_run(tmp_path):
  # A FIFO was "replaced at the end": the whole benchmark ran first, then
  # its report blocked on the FIFO (or went into /dev/null).
  fifo = str(tmp_path / "p")
  os.mkfifo(fifo)
  results = refusals.run("research.benchmark", [[f"--json_out={fifo}"],
                                                ["--json_out=/dev/null"]])
  for result, path in zip(results, (fifo, "/dev/null")):
    errors = result["stderr"].strip().splitlines()
    assert result["code"] == 1 and len(errors) == 1, errors
    kind = "a FIFO" if path == fifo else "a character device"
    assert errors[0] == (f"error: --json_out={path} is not a regular file "
                         f"({kind}, which would block or take the "
                         "output); give a file path. Received: "
                         f"json_out={path!r}"), errors
