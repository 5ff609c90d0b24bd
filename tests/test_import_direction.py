"""Imports run one way, down the floors: research -> train -> step_model ->
tf_interlock -> layers.

* `layers/`: the Keras custom layers (the module type, the aux heads, the
  ready-made networks, the partition of a block stack); imports only Keras/TF.
* `tf_interlock/`: the model-agnostic library (engine, trainer, Keras front
  door, placement, export) on top of layers.
* `step_model/`: the step-time model and its profiling, which model the
  library from above it.
* `train/`: the production binaries and their config; of `step_model` it
  uses only the package's public functions (its CPU threading plan), never
  a module of it.
* `research/`: studies, benchmarks and the schedule model's validation.

An import from a lower floor of a higher one would make two packages a cycle
(Bazel refuses to build one) and is what docs/architecture.md forbids.
"""

import ast
import os

import pytest

from tests.binaries import ROOT

FLOORS = ("layers", "tf_interlock", "step_model", "train", "research")


def _imported_modules(path):
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):  # nested imports count too
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield node.module
      # `from package import module` imports package.module.
      yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _upward_imports(root, floor):
  """'path imports module' for each import of a floor above `floor`."""
  above = FLOORS[FLOORS.index(floor) + 1:]
  found = []
  for folder, _, names in os.walk(os.path.join(root, floor)):
    for name in sorted(names):
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        for module in sorted(set(_imported_modules(path))):
          if module.split(".")[0] in above:
            found.append(f"{os.path.relpath(path, root)} imports {module}")
  return sorted(set(found))


def _step_model_modules_in(root, floor):
  """'path imports module' for each module of step_model that `floor`
  imports (a name that is a file or folder of step_model/)."""
  modules = {name[:-3] if name.endswith(".py") else name
             for name in os.listdir(os.path.join(root, "step_model"))
             if not name.startswith(("_", "."))}
  found = []
  for folder, _, names in os.walk(os.path.join(root, floor)):
    for name in sorted(names):
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        for module in sorted(set(_imported_modules(path))):
          parts = module.split(".")
          if parts[0] == "step_model" and len(parts) > 1 and (
              parts[1] in modules):
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
      "train/presets/bad.py imports research",
      "train/presets/bad.py imports research.benchmark"]


def test_train_uses_only_the_step_model_package():
  # The binaries choose a CPU threading plan through step_model's public
  # functions; the model's modules are research's.
  assert os.path.isfile(os.path.join(ROOT, "train", "runtime_setup.py"))
  assert not _step_model_modules_in(ROOT, "train")


def test_the_check_sees_a_step_model_module_in_train(tmp_path):
  (tmp_path / "step_model").mkdir()
  for name in ("__init__.py", "schedule.py", "threading_plan.py"):
    (tmp_path / "step_model" / name).write_text("")
  (tmp_path / "train").mkdir()
  (tmp_path / "train" / "good.py").write_text(
      "import step_model\nfrom step_model import plan_for\n")
  (tmp_path / "train" / "bad.py").write_text(
      "from step_model import schedule\nimport step_model.threading_plan\n")
  assert _step_model_modules_in(str(tmp_path), "train") == [
      "train/bad.py imports step_model.schedule",
      "train/bad.py imports step_model.threading_plan"]
  # step_model sits above tf_interlock: the library may not import it.
  (tmp_path / "tf_interlock").mkdir()
  (tmp_path / "tf_interlock" / "x.py").write_text("import step_model\n")
  assert _upward_imports(str(tmp_path), "tf_interlock") == [
      "tf_interlock/x.py imports step_model"]


def _front_door_imports_below(root):
  """'path imports module' for each top-level file of tf_interlock/ (its
  `__init__.py`, which re-exports the public names, aside) and each file of
  its placements/ that imports the Keras front door, tf_interlock.keras."""
  found = []
  for folder in ("tf_interlock", os.path.join("tf_interlock", "placements")):
    for name in sorted(os.listdir(os.path.join(root, folder))):
      if not name.endswith(".py") or (
          folder == "tf_interlock" and name == "__init__.py"):
        continue
      path = os.path.join(root, folder, name)
      for module in sorted(set(_imported_modules(path))):
        if module == "tf_interlock.keras" or module.startswith(
            "tf_interlock.keras."):
          found.append(f"{os.path.relpath(path, root)} imports {module}")
  return found


def test_the_library_core_never_imports_the_keras_front_door():
  # docs/architecture.md: the step core, placement, cluster, export and
  # evaluation sit below the front door, which builds on them.
  assert os.path.isdir(os.path.join(ROOT, "tf_interlock", "keras"))
  assert not _front_door_imports_below(ROOT)


def test_the_check_sees_the_core_import_the_front_door(tmp_path):
  (tmp_path / "tf_interlock" / "placements").mkdir(parents=True)
  (tmp_path / "tf_interlock" / "__init__.py").write_text(
      "from tf_interlock.keras.model import InterlockModel\n")
  (tmp_path / "tf_interlock" / "trainer.py").write_text(
      "from tf_interlock.keras import fit\n")
  (tmp_path / "tf_interlock" / "placements" / "x.py").write_text(
      "import tf_interlock.keras.split\n")
  assert _front_door_imports_below(str(tmp_path)) == [
      "tf_interlock/trainer.py imports tf_interlock.keras",
      "tf_interlock/trainer.py imports tf_interlock.keras.fit",
      "tf_interlock/placements/x.py imports tf_interlock.keras.split"]
