"""pyproject.toml: `pip install .` ships the library and nothing else.

This test checks what decides the install's contents: the configuration
parses with the setuptools of this environment, and its package list is
exactly the package folders (with an __init__.py) of what a library user
imports, tf_interlock and layers; the binaries (train/), the step-time
model (step_model/) and the research tools (research/) run from a checkout,
so no generic top-level `train`, `step_model` or `research` lands in
site-packages. tests/test_readme.py runs a real, offline `pip install --target`
and the README's examples against it.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest
from setuptools.config import pyprojecttoml

# realpath: under `bazel test` this file is a runfiles symlink into the
# checkout, whose package folders the test compares with.
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
TOP_LEVEL = ("tf_interlock", "layers")


def _package_folders():
  found = []
  for top in TOP_LEVEL:
    for folder, subfolders, files in os.walk(os.path.join(ROOT, top)):
      subfolders[:] = [s for s in subfolders if not s.startswith((".", "_"))]
      if "__init__.py" in files:
        found.append(os.path.relpath(folder, ROOT).replace(os.sep, "."))
  return sorted(found)


# setuptools calls [tool.setuptools] in pyproject.toml beta; it is what
# setuptools >= 61 reads.
@pytest.mark.filterwarnings("ignore:Support for `\\[tool.setuptools\\]`")
def test_pyproject_lists_every_package():
  config = pyprojecttoml.read_configuration(
      os.path.join(ROOT, "pyproject.toml"))
  assert config["project"]["name"] == "tf_interlock"
  assert {"tensorflow", "keras"} <= {
      dep.split(">")[0].split("=")[0]
      for dep in config["project"]["dependencies"]}
  assert sorted(config["tool"]["setuptools"]["packages"]) == (
      _package_folders())
  assert not {"train", "step_model", "research"} & {
      name.split(".")[0] for name in config["tool"]["setuptools"]["packages"]}



def _setup_command():
  """The `pip install -e` line of the Makefile's setup recipe, as words."""
  with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
    lines = re.findall(r"^\t\$\(PYTHON\) -m pip install (.* -e .*)$",
                       f.read(), re.M)
  assert len(lines) == 1, lines
  return lines[0].split()


def test_make_setup_installs_the_checkout_editable(tmp_path):
  """After `make setup`, a script outside the checkout imports the
  checkout's own tf_interlock and layers (and no train or research)."""
  checkout, venv = tmp_path / "checkout", tmp_path / "venv"
  checkout.mkdir()
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(os.path.join(ROOT, name), checkout / name)
  for name in TOP_LEVEL:
    shutil.copytree(os.path.join(ROOT, name), checkout / name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
  # A venv whose other packages (pip, setuptools, TensorFlow) are this
  # one's, as `make setup` installs them from requirements.txt first.
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                 check=True, timeout=120)
  python = venv / "bin" / "python"
  site = subprocess.run(
      [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
       "['purelib'])"], check=True, capture_output=True, text=True).stdout
  with open(os.path.join(site.strip(), "parent.pth"), "w",
            encoding="utf-8") as f:
    f.write(sysconfig.get_paths()["purelib"] + "\n")
  proc = subprocess.run(
      [str(python), "-m", "pip", "install", "--no-index"] + _setup_command(),
      cwd=checkout, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  proc = subprocess.run(
      [str(python), "-c", "import importlib.util, tf_interlock, layers; "
       "print(tf_interlock.__file__); print(layers.__file__); "
       "print(importlib.util.find_spec('train'), "
       "importlib.util.find_spec('research'))"],
      cwd=elsewhere, capture_output=True, text=True, timeout=300,
      env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
           "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  assert lines[:2] == [str(checkout / "tf_interlock" / "__init__.py"),
                       str(checkout / "layers" / "__init__.py")]
  assert lines[2] == "None None"
