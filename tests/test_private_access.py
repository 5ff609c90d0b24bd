"""No package of ours reads another's private names (`x._name`).

A name with a leading underscore is free to change inside its package; a
read of it from another package breaks on that package's next refactor
(docs/architecture.md). The check parses every file of our packages with
`ast` and flags, outside the package that owns the name:

* `from package.module import _name`;
* `X._name` where X is bound by an import from another of our packages (a
  module, `module._helper`; or an imported name, `Class._method`);
* `expr._name` on anything else but `self`/`cls` (a parameter, an
  attribute: `trainer.step._own_loss`) when `_name` is defined (a def, a
  class, an assignment) in another of our packages and nowhere in this one.

Dunder names (`__init__`) are public. Private names of Keras and TF are
another matter (issue 30 section 3, the Keras adapter) and not checked here.
Tests may read private names: they are not a package of the library.
"""

import ast
import os

import pytest

from tests import ast_scan
from tests.binaries import ROOT

PACKAGES = ("layers", "tf_interlock", "step_model", "train", "research")


def _defined_private_names(tree):
  """Private names a file defines: defs, classes, assigned names and
  attributes (`self._x = ...`), parameters."""
  return {name for name in ast_scan.defined_names(tree)
          if ast_scan.is_private(name)}


def _foreign_bindings(tree, own):
  """{local name: package} for names an import binds to another package."""
  bound = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        top = alias.name.split(".")[0]
        if top in PACKAGES and top != own:
          bound[alias.asname or top] = top
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      top = node.module.split(".")[0]
      if top in PACKAGES and top != own:
        for alias in node.names:
          bound[alias.asname or alias.name] = top
  return bound


def _root_name(node):
  while isinstance(node, ast.Attribute):
    node = node.value
  return node.id if isinstance(node, ast.Name) else None


def private_reads(root):
  """'path:line: what' for each read of another package's private name."""
  trees = {package: list(ast_scan.parsed_files(root, [package]))
           for package in PACKAGES
           if os.path.isdir(os.path.join(root, package))}
  defined = {package: set().union(*(_defined_private_names(tree)
                                    for _, tree in files))
             for package, files in trees.items()}
  found = []
  for own, files in trees.items():
    others = set().union(*(names for package, names in defined.items()
                           if package != own))
    for path, tree in files:
      bound = _foreign_bindings(tree, own)
      for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and (
            node.module.split(".")[0] in set(PACKAGES) - {own}):
          found += [f"{path}:{node.lineno}: imports {node.module}.{a.name}"
                    for a in node.names if ast_scan.is_private(a.name)]
        if not (isinstance(node, ast.Attribute) and
                ast_scan.is_private(node.attr)):
          continue
        root_name = _root_name(node.value)
        if root_name in bound:
          found.append(f"{path}:{node.lineno}: {root_name}...{node.attr} "
                       f"of {bound[root_name]}")
        elif root_name not in ("self", "cls") and (
            node.attr in others and node.attr not in defined[own]):
          found.append(f"{path}:{node.lineno}: .{node.attr}, defined only "
                       f"outside {own}")
  return sorted(found)


def test_no_package_reads_another_packages_private_names():
  assert os.path.isfile(os.path.join(ROOT, "step_model", "profiling.py"))
  assert private_reads(ROOT) == []


@pytest.mark.parametrize("source,expected", [
    ("from tf_interlock import engine\nengine._scaled(1, 2)\n",
     "research/bad.py:2: engine..._scaled of tf_interlock"),
    ("from tf_interlock.trainer import Trainer as T\nT._add\n",
     "research/bad.py:2: T..._add of tf_interlock"),
    ("import tf_interlock.engine\ntf_interlock.engine._scaled\n",
     "research/bad.py:2: tf_interlock..._scaled of tf_interlock"),
    ("from tf_interlock.engine import _scaled\n",
     "research/bad.py:1: imports tf_interlock.engine._scaled"),
    ("def f(trainer):\n  return trainer.step._own_loss\n",
     "research/bad.py:2: ._own_loss, defined only outside research"),
])
def test_the_check_sees_a_private_read(tmp_path, source, expected):
  (tmp_path / "tf_interlock").mkdir()
  (tmp_path / "tf_interlock" / "engine.py").write_text(
      "def _scaled(a, b):\n  return a * b\n\n\nclass Step:\n"
      "  def _own_loss(self):\n    return self._own_loss\n")
  (tmp_path / "research").mkdir()
  (tmp_path / "research" / "bad.py").write_text(source)
  assert private_reads(str(tmp_path)) == [expected]


def test_the_check_allows_what_is_not_a_foreign_private_name(tmp_path):
  (tmp_path / "tf_interlock").mkdir()
  (tmp_path / "tf_interlock" / "engine.py").write_text(
      "class Step:\n  def _loss(self):\n    return self._loss\n"
      "  def __init__(self):\n    pass\n")
  (tmp_path / "tf_interlock" / "trainer.py").write_text(
      "from tf_interlock import engine\n\n\ndef f(step):\n"
      "  return step._loss, engine.Step.__init__\n")
  (tmp_path / "research").mkdir()
  # A Keras private name (`_tracker`) is not ours; a dunder is public; a
  # private name this package defines too is its own.
  (tmp_path / "research" / "ok.py").write_text(
      "from tf_interlock import engine\n\n\nclass R:\n"
      "  def _loss(self):\n    return 0\n\n\ndef g(model, step):\n"
      "  return model._tracker, engine.Step.__init__, step._loss\n")
  assert private_reads(str(tmp_path)) == []
