"""Runs the project's binaries in subprocesses, as a user would."""

import hashlib
import importlib
import os
import re
import subprocess
import sys
import types
import time

import pytest
from absl import flags as absl_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# {flag name: {name of the module that defined it: its Flag}}, for the
# names that several imported binaries (or their libraries) define.
_DEFINED = {}


def _own_modules(module):
  """The module's name and those of the modules it imports by name: where
  the flags its main reads are defined (its own, or train.flags_lib's)."""
  return {module.__name__} | {
      value.__name__ for value in vars(module).values()
      if isinstance(value, types.ModuleType)}


def _install_flags(module):
  """Puts under each shared name the Flag that `module`'s own code defined,
  and returns {name: the Flag it replaced} to put back after the run."""
  flags, replaced = absl_flags.FLAGS, {}
  own = _own_modules(module)
  for name, defined in _DEFINED.items():
    for definer, flag in defined.items():
      if definer in own and flags[name] is not flag:
        replaced[name] = flags[name]
        delattr(flags, name)
        flags[name] = flag
  return replaced


def _put_back(replaced):
  flags = absl_flags.FLAGS
  for name, flag in replaced.items():
    delattr(flags, name)
    flags[name] = flag


def _import_binary(binary):
  """`binary`'s module. Each binary runs alone in its process, so two may
  name a flag alike (train.export's --model_dir and train.flags_lib's, which
  train.train and train.evaluate read); when one test process imports
  both, each name keeps every definer's Flag, keyed by the defining module,
  and `run_main` puts the running binary's own under the name while it runs,
  whichever binary was imported first."""
  flags = absl_flags.FLAGS
  while True:
    try:
      module = importlib.import_module(binary)
      break
    except absl_flags.DuplicateFlagError as e:
      name = re.search(r"flag '([^']+)' is defined twice", str(e)).group(1)
      _DEFINED.setdefault(name, {})[
          flags.find_module_defining_flag(name)] = flags[name]
      delattr(flags, name)
      sys.modules.pop(binary, None)
  for name, defined in _DEFINED.items():
    if name in flags:
      defined.setdefault(flags.find_module_defining_flag(name), flags[name])
  return module


def run_main(binary, flags_given, capfd):
  """(exit code, stdout, stderr) of `binary`'s main in this process, its
  flags parsed as absl does: the binary's error boundary and all, less the
  seconds of a process start. `capfd` is pytest's fixture."""
  module = _import_binary(binary)
  replaced = _install_flags(module)
  absl_flags.FLAGS.unparse_flags()
  try:
    absl_flags.FLAGS([binary, *flags_given])
    capfd.readouterr()
    code = 0
    try:
      module.main([binary])
    except SystemExit as e:
      code = e.code
  finally:
    absl_flags.FLAGS.unparse_flags()  # the next test parses its own
    _put_back(replaced)
  out = capfd.readouterr()
  return code, out.out, out.err


def run_binary(module, *flags, check=True, timeout=300, env=None):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT,
             **(env or {}))
  proc = subprocess.run([sys.executable, "-m", module, *flags], cwd=ROOT,
                        env=env, capture_output=True, text=True,
                        timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f"{module} failed:\n{proc.stdout}\n{proc.stderr}")
  return proc


def tree_digest(root):
  """{relative path: sha256 of its bytes, None for a folder} under root.

  Equal before and after a binary ran: it changed nothing there.
  """
  found = {}
  for top, dirs, files in os.walk(root):
    for name in dirs:
      found[os.path.relpath(os.path.join(top, name), root)] = None
    for name in files:
      path = os.path.join(top, name)
      with open(path, "rb") as f:
        found[os.path.relpath(path, root)] = hashlib.sha256(
            f.read()).hexdigest()
  return found


def stop_and_time(proc, signum):
  """Sends `signum`; returns (seconds until exit, stderr's error lines)."""
  sent = time.monotonic()
  proc.send_signal(signum)
  try:
    proc.wait(timeout=60)
  except subprocess.TimeoutExpired:
    proc.kill()
    pytest.fail(f"still running 60 s after {signum!r}")
  seconds = time.monotonic() - sent
  errors = [line for line in proc.stderr.read().splitlines()
            if line.startswith("error:")]
  return seconds, errors


def one_error(err, *words):
  """The single "error:" line of `err`, holding every word."""
  assert "Traceback" not in err, err
  lines = [line for line in err.splitlines() if line.startswith("error:")]
  assert len(lines) == 1, err
  for word in words:
    assert word in lines[0], (word, lines[0])
  return lines[0]


def user_folder(root):
  """A user's folder of their own, outside every run: what must survive."""
  mine = os.path.join(root, "mine")
  os.makedirs(os.path.join(mine, "deep"))
  for name, text in (("notes.txt", "my notes\n"),
                     ("deep/results.csv", "1,2,3\n")):
    with open(os.path.join(mine, name), "w") as f:
      f.write(text)
  return mine
