r"""Several command lines of one binary in one process, for its refusals.

  python -m tests.refusals MODULE < command_lines.json

reads a JSON list of command lines (each a list of flags) and prints, as
JSON, one {"code": exit status, "stderr": text} per command line: what
`python -m MODULE FLAG ...` exits with and writes on stderr, through
absl's `app.run`, the binary's own `main` and its error boundary. Only
the process is shared: absl's flags are reset to their defaults before
each command line. TensorFlow's import (seconds of CPU) is paid once.

A binary is imported in a process of its own (here, not the test's):
research binaries define flags of the same names as train's, so two of
them cannot be imported into one process. What TF's C++ logs straight to
the file descriptor is not captured; a test of such lines needs the real
binary (`tests.binaries.run_binary`).
"""

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
import traceback

from tests import binaries


def run(module, command_lines):
  """[{"code", "stderr"}] of `module` on each of `command_lines`, run in
  one child process."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=binaries.ROOT)
  proc = subprocess.run(
      [sys.executable, "-m", "tests.refusals", module],
      input=json.dumps([list(flags) for flags in command_lines]),
      cwd=binaries.ROOT, env=env, capture_output=True, text=True,
      timeout=300, check=False)
  if proc.returncode != 0:
    raise AssertionError(f"tests.refusals {module} failed: {proc.stderr}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _exit_code(e):
  """The process's status for SystemExit `e`, as the interpreter sets it."""
  if e.code is None:
    return 0
  return e.code if isinstance(e.code, int) else 1


def main(argv):
  module_name = argv[1]
  command_lines = json.load(sys.stdin)
  sys.argv = [module_name]
  module = importlib.import_module(module_name)
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  results = []
  for flags_given in command_lines:
    flags.FLAGS.unparse_flags()
    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(
        io.StringIO()):
      try:
        app.run(module.main, argv=[module_name, *flags_given])
      except SystemExit as e:
        code = _exit_code(e)
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()  # as the interpreter would, then status 1
        code = 1
    results.append({"code": code, "stderr": err.getvalue()})
  print(json.dumps(results))


if __name__ == "__main__":
  main(sys.argv)
