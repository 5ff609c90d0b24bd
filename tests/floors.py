"""The floor a test file checks: library, train or research.

The code has five floors, research -> train -> step_model -> tf_interlock ->
layers (see test_import_direction.py); the tests have three. A test file
belongs to the highest floor it reaches: the packages it imports (nested
imports too), and the binaries it runs by module name (a string such as
"train.train" or "research.benchmark"). layers, tf_interlock and step_model
together are the library.
conftest.py marks every test with its file's floor, so that

  pytest -m library     # or train, research

runs one floor, with no file list to keep up to date. A helper module of
tests/ that a file imports (tests/cluster_jobs.py, say) counts as part of
it.
"""

import ast
import functools
import os
import re

FLOORS = ("library", "train", "research")
_PACKAGE_FLOOR = {"layers": "library", "tf_interlock": "library",
                  "train": "train", "research": "research"}
_BINARY = re.compile(r"^(train|research)\.[a-z_0-9]+$")


def _reached(tree):
  """The modules a parsed file imports or runs by name."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield node.module
      if node.module == "tests":  # from tests import helpers
        yield from (f"{node.module}.{alias.name}" for alias in node.names)
    elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and
          _BINARY.match(node.value)):
      yield node.value


@functools.lru_cache(maxsize=None)
def floor_of(path):
  """"library", "train" or "research": the highest floor `path` reaches
  (a file that reaches none, e.g. one that checks BUILD, is library)."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  found = {"library"}
  for module in set(_reached(tree)):
    package, _, name = module.partition(".")
    helper = os.path.join(os.path.dirname(path), f"{name}.py")
    if package == "tests" and os.path.isfile(helper) and helper != path:
      found.add(floor_of(helper))
    elif package in _PACKAGE_FLOOR:
      found.add(_PACKAGE_FLOOR[package])
  return max(found, key=FLOORS.index)
