"""The README's Python examples run as written, from outside the checkout."""

import os
import re
import subprocess
import sys

# The examples import these; importing them here also makes them the test's
# Bazel deps.
from layers import interlock_module  # noqa: F401  pylint: disable=unused-import
from tests.binaries import ROOT
from tf_interlock import keras_model  # noqa: F401  pylint: disable=unused-import
from tf_interlock import keras_split  # noqa: F401  pylint: disable=unused-import
from tf_interlock import trainer  # noqa: F401  pylint: disable=unused-import


def _blocks():
  with open(os.path.join(ROOT, "README.md")) as f:
    return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def _run(code, cwd):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  return proc.stdout


def test_readme_has_the_trainer_and_the_keras_examples():
  blocks = _blocks()
  assert len(blocks) == 2
  assert "InterlockTrainer(" in blocks[0]
  assert "from_keras(" in blocks[1] and ".fit(" in blocks[1]


def test_readme_trainer_example_runs(tmp_path):
  code = _blocks()[0].replace('"/tmp/ckpt"', repr(str(tmp_path / "ckpt")))
  loss, accuracy = map(float, _run(code, tmp_path).split())
  assert 0 < loss < 5 and 0 <= accuracy <= 1
  assert any(name.startswith("ckpt") for name in os.listdir(tmp_path))


def test_readme_keras_example_runs(tmp_path):
  out = tmp_path / "cnn"
  code = _blocks()[1].replace('"/tmp/cnn/', '"' + str(out) + "/")
  lines = _run(code, tmp_path).splitlines()
  keys = [line for line in lines if line.startswith("['")]
  assert keys and "'module_1/loss'" in keys[0] and "'val_loss'" in keys[0]
  assert lines[-1] == "(4, 10)"
  assert (out / "best.keras").exists()
  assert (out / "export" / "saved_model.pb").exists()
  assert any(out.joinpath("logs").rglob("*tfevents*"))
