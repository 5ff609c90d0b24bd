"""Runs pytest on the test files named on the command line.

Bazel's native py_test runs a Python script; every py_test in BUILD uses this
one as `main` and passes its test file in `args`. Bazel starts tests in the
runfiles copy of the workspace, where pytest.ini (in the test's data) sets
the options that `make test` uses. Temporary files go to the test's own
TEST_TMPDIR, and when Bazel asks for a JUnit XML report (XML_OUTPUT_FILE),
pytest writes it, so Bazel sees each test case.
"""

import os
import sys

import pytest


def main(argv):
  """Runs pytest with `argv[1:]`; returns its exit code."""
  args = list(argv[1:])
  test_tmpdir = os.environ.get("TEST_TMPDIR")
  if test_tmpdir:
    args.append(f"--basetemp={os.path.join(test_tmpdir, 'pytest')}")
  xml_output = os.environ.get("XML_OUTPUT_FILE")
  if xml_output:
    args.append(f"--junitxml={xml_output}")
  return pytest.main(args)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
