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

