r"""Several command lines of one binary in one process, for its refusals.

  python -m tests.refusals MODULE < command_lines.json

reads a JSON list of command lines (each a list of flags) and prints, as
JSON, one {"code": exit status, "stderr": text} per command line: what
`python -m MODULE FLAG ...` exits with and writes on stderr, through
absl's `app.run`, the binary's own `main` and its error boundary. Only
the process is shared: absl's flags are reset to their defaults before
each command line. TensorFlow's import (seconds of CPU) is paid once.

  python -m tests.refusals --each < {module: command_lines}.json

does the same for several binaries in one process ({module: [results]}):
it imports them in turn, and before the next one it deletes the flags the
previous one defined and forgets the modules that defined them, so that
the next import defines its own flags of the same names afresh. It also
reports the help of each binary's flags ({module: {defining module:
{flag: help}}}), read once the binary is imported.

A binary is imported in a process of its own (here, not the test's):
research binaries define flags of the same names as train's, so two of
them cannot be imported into one process without that forgetting. What
TF's C++ logs straight to the file descriptor is not captured; a test of
such lines needs the real binary (`tests.binaries.run_binary`).
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


def _child(argument, command_lines):
  """What `python -m tests.refusals ARGUMENT` prints for `command_lines`."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=binaries.ROOT)
  proc = subprocess.run(
      [sys.executable, "-m", "tests.refusals", argument],
      input=json.dumps(command_lines), cwd=binaries.ROOT, env=env,
      capture_output=True, text=True, timeout=300, check=False)
  if proc.returncode != 0:
    raise AssertionError(f"tests.refusals {argument} failed: {proc.stderr}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def run(module, command_lines):
  """[{"code", "stderr"}] of `module` on each of `command_lines`, run in
  one child process."""
  return _child(module, [list(flags) for flags in command_lines])


def run_each(command_lines_by_module):
  """{module: [{"code", "stderr"}]} of each module on its command lines:
  all of them in one child process, the modules imported in turn."""
  return run_each_with_helps(command_lines_by_module)[0]


def run_each_with_helps(command_lines_by_module):
  """As `run_each`, and the help of every flag of each module: a pair
  ({module: [{"code", "stderr"}]}, {module: {defining module: {flag:
  help}}}) from one child process. A module given no command lines is
  only imported."""
  found = _child("--each", {
      module: [list(flags) for flags in command_lines]
      for module, command_lines in command_lines_by_module.items()})
  return found["results"], found["helps"]


def _exit_code(e):
  """The process's status for SystemExit `e`, as the interpreter sets it."""
  if e.code is None:
    return 0
  return e.code if isinstance(e.code, int) else 1


def _our_flags():
  """{defining module: {flag: help}} of the flags that train/ and
  research/ modules defined."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  return {name: {flag.name: flag.help for flag in found}
          for name, found in flags.FLAGS.flags_by_module_dict().items()
          if name.split(".")[0] in ("train", "research")}


def _forget_flags_of(module_name):
  """Deletes the flags that train/ and research/ modules defined, and
  forgets those modules and `module_name` (the binary just run), so that
  the next binary's import runs their DEFINEs again."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  defined = _our_flags()
  for names in defined.values():
    for name in names:
      if name in flags.FLAGS:
        delattr(flags.FLAGS, name)
  for name in set(defined) | {module_name}:
    sys.modules.pop(name, None)
    package, _, child = name.rpartition(".")
    # `from package import child` would find the old module on the package.
    if package in sys.modules and hasattr(sys.modules[package], child):
      delattr(sys.modules[package], child)


def _run_lines(module_name, command_lines):
  """[{"code", "stderr"}] of the binary `module_name` on each command line,
  in this process."""
  sys.argv = [module_name]
  module = importlib.import_module(module_name)
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  results = []
  if not command_lines:
    return results
  for flags_given in command_lines:
    # On the real stderr: if the binary ends the process (os._exit), the
    # test's error names the command line it was running.
    print(f"tests.refusals: running {module_name} {' '.join(flags_given)}",
          file=sys.__stderr__, flush=True)
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
  return results


def main(argv):
  given = json.load(sys.stdin)
  if argv[1] != "--each":
    print(json.dumps(_run_lines(argv[1], given)))
    return
  results, helps = {}, {}
  for module_name, command_lines in given.items():
    results[module_name] = _run_lines(module_name, command_lines)
    helps[module_name] = _our_flags()
    _forget_flags_of(module_name)
  print(json.dumps({"results": results, "helps": helps}))


if __name__ == "__main__":
  main(sys.argv)
