"""Runs the project's binaries in subprocesses, as a user would."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_binary(module, *flags, check=True):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, "-m", module, *flags], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300)
  if check and proc.returncode != 0:
    raise AssertionError(f"{module} failed:\n{proc.stdout}\n{proc.stderr}")
  return proc
