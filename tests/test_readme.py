"""The README's Python example runs as written."""

import os
import re
import subprocess
import sys

# The example imports these; importing them here also makes them the test's
# Bazel deps.
from layers import interlock_module  # noqa: F401  pylint: disable=unused-import
from tests.binaries import ROOT
from tf_interlock import trainer  # noqa: F401  pylint: disable=unused-import


def test_readme_python_example_runs(tmp_path):
  with open(os.path.join(ROOT, "README.md")) as f:
    blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
  assert len(blocks) == 1
  code = blocks[0].replace('"/tmp/ckpt"', repr(str(tmp_path / "ckpt")))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  loss, accuracy = map(float, proc.stdout.split())
  assert 0 < loss < 5 and 0 <= accuracy <= 1
  assert any(name.startswith("ckpt") for name in os.listdir(tmp_path))
