"""Imports run one way, down the floors: research -> train -> tf_interlock ->
layers.

* `layers/`: the Keras custom layers (the module type, the aux heads, the
  ready-made networks, the partition of a block stack); imports only Keras/TF.
* `tf_interlock/`: the model-agnostic library (engine, trainer, Keras front
  door, placement, export) on top of layers.
* `train/`: the production binaries and their config.
* `research/`: studies, benchmarks and the schedule model's validation.

An import from a lower floor of a higher one would make two packages a cycle
(Bazel refuses to build one) and is what docs/architecture.md forbids.
"""

import ast
import os

import pytest

from tests.binaries import ROOT

FLOORS = ("layers", "tf_interlock", "train", "research")


def _imported_modules(path):
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):  # nested imports count too
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield node.module


def _upward_imports(root, floor):
  """'path imports module' for each import of a floor above `floor`."""
  above = FLOORS[FLOORS.index(floor) + 1:]
  found = []
  for folder, _, names in os.walk(os.path.join(root, floor)):
    for name in sorted(names):
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        for module in _imported_modules(path):
          if module.split(".")[0] in above:
            found.append(f"{os.path.relpath(path, root)} imports {module}")
  return found


@pytest.mark.parametrize("floor", FLOORS[:-1])
def test_no_floor_imports_one_above_it(floor):
  assert os.listdir(os.path.join(ROOT, floor))  # the files are visible
  assert not _upward_imports(ROOT, floor)


def test_the_check_sees_an_upward_import(tmp_path):
  (tmp_path / "train" / "presets").mkdir(parents=True)
  (tmp_path / "train" / "presets" / "bad.py").write_text(
      "def f():\n  from research import benchmark\n")
  (tmp_path / "train" / "good.py").write_text("from tf_interlock import x\n")
  assert _upward_imports(str(tmp_path), "train") == [
      "train/presets/bad.py imports research"]
