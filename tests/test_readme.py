"""The README's and docs/keras.md's Python examples run as written, from an
installed copy.

The library is installed with `pip install --target` from a copy of the
project (so the checkout stays untouched), and each example runs in a
directory outside the checkout with only that install on its path: what a
user gets from `pip install .`.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

# The examples import these; importing them here also makes them the test's
# Bazel deps.
import tf_interlock  # noqa: F401  pylint: disable=unused-import

# realpath: under `bazel test` this file is a runfiles symlink into the
# checkout, which holds every package pip installs.
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
SOURCES = ("pyproject.toml", "README.md", "tf_interlock", "layers")


def _blocks(name="README.md"):
  with open(os.path.join(ROOT, name)) as f:
    return re.findall(r"```python\n(.*?)```", f.read(), re.S)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """A `pip install --target` of the project: the folder to put on the path.

  Offline: no index and no build isolation (setuptools from this venv), no
  dependencies (TensorFlow and Keras come from the running interpreter).
  """
  top = tmp_path_factory.mktemp("install")
  source, target = top / "source", top / "site"
  source.mkdir()
  for name in SOURCES:
    path = os.path.join(ROOT, name)
    if os.path.isdir(path):
      shutil.copytree(path, source / name,
                      ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
      shutil.copy(path, source / name)
  proc = subprocess.run(
      [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
       "--no-index", "--no-build-isolation", "--target", str(target),
       str(source)], cwd=top, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return target


def _run(code, cwd, site):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(site))
  proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def test_installed_copy_is_the_one_imported(installed, tmp_path):
  out = _run("import importlib.util\n"
             "import tf_interlock as ti, layers\n"
             "print(ti.__file__); print(layers.__file__)\n"
             "print(ti.InterlockModel, ti.from_keras, ti.InterlockModule,"
             " ti.InterlockTrainer, ti.placement.make_placement)\n"
             "print([importlib.util.find_spec(name)"
             " for name in ('train', 'research')])\n",
             tmp_path, installed)
  lines = out.splitlines()
  assert all(line.startswith(str(installed)) for line in lines[:2]), lines
  # Only the library is installed: no generic top-level binaries package.
  assert lines[-1] == "[None, None]"
  assert sorted(os.listdir(installed)) == [
      name for name in sorted(os.listdir(installed))
      if name.startswith(("tf_interlock", "layers"))]


def test_another_layers_package_first_on_the_path_fails_in_one_line(
    installed, tmp_path):
  shadow = tmp_path / "shadow" / "layers"
  shadow.mkdir(parents=True)
  (shadow / "__init__.py").write_text("")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=f"{tmp_path / 'shadow'}{os.pathsep}{installed}")
  proc = subprocess.run([sys.executable, "-c", "import tf_interlock"],
                        cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == (
      "ImportError: tf_interlock needs its own `layers` package, installed "
      "beside it; another one comes first on sys.path. Received: "
      f"layers={shadow}")


def test_readme_has_the_trainer_and_the_keras_examples():
  blocks = _blocks()
  assert len(blocks) == 3
  lm = blocks[2]
  for block in blocks + _blocks(os.path.join("docs", "keras.md")):
    # The public front door: no submodule imports in the examples.
    assert "import tf_interlock as ti" in block
    assert not re.search(r"from (tf_interlock|layers)\.", block)
  assert "ti.InterlockTrainer(" in blocks[0]
  assert "ti.from_keras(" in blocks[1] and ".fit(" in blocks[1]
  assert "summary()" in blocks[1] and "LearningRateScheduler" in blocks[1]
  assert "MultiHeadAttention" in lm and "use_causal_mask" in lm
  assert "ti.from_keras(lm" in lm and ".fit(" in lm


def test_readme_trainer_example_runs(installed, tmp_path):
  code = _blocks()[0].replace('"/tmp/ckpt"', repr(str(tmp_path / "ckpt")))
  loss, accuracy = map(float, _run(code, tmp_path, installed).split())
  assert 0 < loss < 5 and 0 <= accuracy <= 1
  assert any(name.startswith("ckpt") for name in os.listdir(tmp_path))


def test_readme_keras_example_runs(installed, tmp_path):
  out = tmp_path / "cnn"
  code = _blocks()[1].replace('"/tmp/cnn/', '"' + str(out) + "/")
  lines = _run(code, tmp_path, installed).splitlines()
  # summary(): one row per module.
  rows = [line for line in lines if re.match(r"[123] +\S+ \.\. ", line)]
  assert len(rows) == 3, lines
  keys = [line for line in lines if line.startswith("['")]
  assert keys and "'module_1/loss'" in keys[0] and "'val_loss'" in keys[0]
  assert "'learning_rate'" in keys[0]
  assert lines[-1] == "(4, 10)"
  assert (out / "best.keras").exists()
  assert (out / "export" / "saved_model.pb").exists()
  assert any(out.joinpath("logs").rglob("*tfevents*"))


def test_readme_transformer_example_runs(installed, tmp_path):
  out = tmp_path / "lm"
  code = _blocks()[2].replace('"/tmp/lm/', '"' + str(out) + "/")
  lines = _run(code, tmp_path, installed).splitlines()
  # Exit 1's top-5 accuracy per epoch, then its per-token logits.
  top5 = [float(v) for v in lines[-2].strip("[]").split(",")]
  assert len(top5) == 2 and all(0 <= v <= 1 for v in top5), lines
  assert lines[-1] == "(2, 16, 32)"
  assert (out / "export" / "saved_model.pb").exists()


def test_keras_doc_examples_run(installed, tmp_path):
  """docs/keras.md's block: a frozen module, a metric list,
  train_on_batch, a time budget and test_on_batch."""
  block = _blocks(os.path.join("docs", "keras.md"))[-1]
  lines = _run(block, tmp_path, installed).splitlines()
  assert lines[0] == str(["module_1/accuracy", "module_1/grad_norm",
                          "module_1/loss",
                          "module_1/sparse_top_k_categorical_accuracy"])
  assert lines[1] == "True False"  # module 1 unchanged; budget not spent
  assert 0.0 <= float(lines[2]) <= 1.0
