"""Imports run one way: tf_interlock builds on layers, never the reverse.

`layers/` holds the module type, the heads, the ready-made networks and the
partition of a block stack; `tf_interlock/` (engine, trainer, Keras front
door, export) imports them. An import of tf_interlock from layers would make
the two packages a cycle again (Bazel refuses to build one).
"""

import ast
import os

from tests.binaries import ROOT


def _imported_modules(path):
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):  # nested imports count too
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield node.module


def test_layers_never_imports_tf_interlock_or_train():
  upward = []
  folder = os.path.join(ROOT, "layers")
  for name in sorted(os.listdir(folder)):
    if name.endswith(".py"):
      for module in _imported_modules(os.path.join(folder, name)):
        if module.split(".")[0] in ("tf_interlock", "train"):
          upward.append(f"layers/{name} imports {module}")
  assert not upward, upward


def test_the_check_sees_an_upward_import(tmp_path):
  path = tmp_path / "bad.py"
  path.write_text("def f():\n  from tf_interlock import trainer\n")
  assert list(_imported_modules(str(path))) == ["tf_interlock"]
