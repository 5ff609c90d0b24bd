"""The README's and docs/keras.md's Python examples run as written, from an
installed copy.

The library is installed with `pip install --target` from a copy of the
project (so the checkout stays untouched), and each example runs in a
directory outside the checkout with only that install on its path: what a
user gets from `pip install .`.

In `make test` the examples run one after another in one child process
(TensorFlow imported once, Keras's state cleared between them); in `make
test-slow` each runs alone in a fresh process, as a user pastes it.
"""

import json
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
KERAS_MD = os.path.join("docs", "keras.md")

# The examples run, by name: (file, index of its ```python block). The
# Keras example first: it splits the CPU before the TF runtime starts.
EXAMPLES = {
    "keras": ("README.md", 1),
    "trainer": ("README.md", 0),
    "transformer": ("README.md", 2),
    # A frozen module, a metric list, train_on_batch, a time budget and
    # test_on_batch.
    "keras_doc": (KERAS_MD, -1),
}

# What the child of the shared run prints first: the copy it imports.
_PROBE = ("import importlib.util\n"
          "import tf_interlock as ti, layers\n"
          "print(ti.__file__); print(layers.__file__)\n"
          "print(ti.InterlockModel, ti.from_keras, ti.InterlockModule,"
          " ti.InterlockTrainer, ti.placement.make_placement)\n"
          "print([importlib.util.find_spec(name)"
          " for name in ('train', 'research')])\n")

# Runs the jobs of the JSON file argv[1] in turn, in this one process: each
# job's code as a script (`__main__`) in its own folder, its stdout (the file
# descriptor: every write, Keras's and TF's too) into its "out" file, a
# traceback into its "error" file; Keras's state (layer names, settings) is
# cleared after each example, as a fresh process would start.
_RUN_EACH = r"""
import json, os, sys, traceback
with open(sys.argv[1]) as f:
  jobs = json.load(f)
for job in jobs:
  os.chdir(job["cwd"])
  sys.stdout.flush()
  saved = os.dup(1)
  with open(job["out"], "w") as out:
    os.dup2(out.fileno(), 1)
    try:
      exec(compile(job["code"], job["name"], "exec"), {"__name__": "__main__"})
    except (Exception, SystemExit):
      with open(job["error"], "w") as error:
        traceback.print_exc(file=error)
    finally:
      sys.stdout.flush()
      os.dup2(saved, 1)
      os.close(saved)
  if job["clear"]:
    import keras
    keras.backend.clear_session()
"""


def _blocks(name="README.md"):
  with open(os.path.join(ROOT, name)) as f:
    return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def _code(name, folder):
  """Example `name` as written, its files under `folder` instead of /tmp."""
  path, index = EXAMPLES[name]
  code = _blocks(path)[index]
  return code.replace('"/tmp/', '"' + str(folder) + "/")


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


def _env(site):
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(site))


def _run(code, cwd, site):
  proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=_env(site),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


@pytest.fixture(scope="module")
def ran(installed, tmp_path_factory):
  """The probe and every example, run in turn in one child process:
  {name: (its stdout, its traceback or "", its folder)}."""
  top = tmp_path_factory.mktemp("examples")
  jobs = []
  for name in ["installed"] + list(EXAMPLES):
    folder = top / name
    folder.mkdir()
    jobs.append({"name": name, "cwd": str(folder),
                 "out": str(folder / "stdout"),
                 "error": str(folder / "traceback"),
                 "code": (_PROBE if name == "installed"
                          else _code(name, folder)),
                 "clear": name != "installed"})
  jobs_file = top / "jobs.json"
  jobs_file.write_text(json.dumps(jobs))
  proc = subprocess.run([sys.executable, "-c", _RUN_EACH, str(jobs_file)],
                        cwd=top, env=_env(installed), capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = {}
  for job in jobs:
    out, error = (_read(job[key]) for key in ("out", "error"))
    results[job["name"]] = (out, error, job["cwd"])
  return results


def _read(path):
  """The file's text; "" if there is none."""
  if not os.path.exists(path):
    return ""
  with open(path) as f:
    return f.read()


def _output(ran, name):
  """What example `name` printed in the shared run, and its folder; fails
  with its traceback if it raised."""
  out, error, folder = ran[name]
  assert not error, error[-3000:]
  return out, folder


def test_installed_copy_is_the_one_imported(installed, ran):
  lines = _output(ran, "installed")[0].splitlines()
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
  for block in blocks + _blocks(KERAS_MD):
    # The public front door: no submodule imports in the examples.
    assert "import tf_interlock as ti" in block
    assert not re.search(r"from (tf_interlock|layers)\.", block)
  assert "ti.InterlockTrainer(" in blocks[0]
  assert "ti.from_keras(" in blocks[1] and ".fit(" in blocks[1]
  assert "summary()" in blocks[1] and "LearningRateScheduler" in blocks[1]
  assert "MultiHeadAttention" in lm and "use_causal_mask" in lm
  assert "ti.from_keras(lm" in lm and ".fit(" in lm
  # Every example run writes under its test's folder, none in /tmp.
  for name in EXAMPLES:
    assert "/tmp/" not in _code(name, "FOLDER"), name


def _check_trainer(out, folder):
  loss, accuracy = map(float, out.split())
  assert 0 < loss < 5 and 0 <= accuracy <= 1
  assert any(name.startswith("ckpt") for name in os.listdir(folder))


def _check_keras(out, folder):
  lines = out.splitlines()
  cnn = os.path.join(folder, "cnn")
  # summary(): one row per module.
  rows = [line for line in lines if re.match(r"[123] +\S+ \.\. ", line)]
  assert len(rows) == 3, lines
  keys = [line for line in lines if line.startswith("['")]
  assert keys and "'module_1/loss'" in keys[0] and "'val_loss'" in keys[0]
  assert "'learning_rate'" in keys[0]
  assert lines[-1] == "(4, 10)"
  assert os.path.exists(os.path.join(cnn, "best.keras"))
  assert os.path.exists(os.path.join(cnn, "export", "saved_model.pb"))
  assert any("tfevents" in name for _, _, names in
             os.walk(os.path.join(cnn, "logs")) for name in names)


def _check_transformer(out, folder):
  lines = out.splitlines()
  # Exit 1's top-5 accuracy per epoch, then its per-token logits.
  top5 = [float(v) for v in lines[-2].strip("[]").split(",")]
  assert len(top5) == 2 and all(0 <= v <= 1 for v in top5), lines
  assert lines[-1] == "(2, 16, 32)"
  assert os.path.exists(os.path.join(folder, "lm", "export",
                                     "saved_model.pb"))


def _check_keras_doc(out, folder):
  del folder  # writes no file
  lines = out.splitlines()
  assert lines[0] == str(["module_1/accuracy", "module_1/grad_norm",
                          "module_1/loss",
                          "module_1/sparse_top_k_categorical_accuracy"])
  assert lines[1] == "True False"  # module 1 unchanged; budget not spent
  assert 0.0 <= float(lines[2]) <= 1.0


CHECKS = {"trainer": _check_trainer, "keras": _check_keras,
          "transformer": _check_transformer, "keras_doc": _check_keras_doc}


def test_readme_trainer_example_runs(ran):
  _check_trainer(*_output(ran, "trainer"))


def test_readme_keras_example_runs(ran):
  _check_keras(*_output(ran, "keras"))


def test_readme_transformer_example_runs(ran):
  _check_transformer(*_output(ran, "transformer"))


def test_keras_doc_examples_run(ran):
  """docs/keras.md's last block, in the shared run."""
  _check_keras_doc(*_output(ran, "keras_doc"))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_runs_alone_in_a_fresh_process(name, installed,
                                                    tmp_path):
  # What a user who pastes one example gets: nothing run before it.
  CHECKS[name](_run(_code(name, tmp_path), tmp_path, installed), tmp_path)
