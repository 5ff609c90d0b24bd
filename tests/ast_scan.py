"""Parsing our packages for the checks on private names.

test_private_access.py (our packages' private names across packages),
test_keras_private.py (Keras's private names outside the adapter) and
test_tf_private.py (any library's private names outside the adapters) walk
the packages' files with `ast` and need the names a file defines or sets
itself; they read them from here.
"""

import ast
import os


def is_private(name):
  """`_name`, not a dunder (`__init__` is public)."""
  return name.startswith("_") and not (
      name.startswith("__") and name.endswith("__"))


def parsed_files(root, packages):
  """(path relative to root, parsed tree) for each .py file of packages."""
  for package in packages:
    for folder, _, names in os.walk(os.path.join(root, package)):
      for name in sorted(names):
        if name.endswith(".py"):
          path = os.path.join(folder, name)
          with open(path, encoding="utf-8") as f:
            yield os.path.relpath(path, root), ast.parse(f.read(), path)


def set_name(node):
  """The constant name of `setattr(x, "name", v)` or
  `x.__setattr__("name", v)`, else None."""
  if not (isinstance(node, ast.Call) and len(node.args) > 1 and
          isinstance(node.args[1], ast.Constant)):
    return None
  func = node.func
  if ((isinstance(func, ast.Name) and func.id == "setattr") or
      (isinstance(func, ast.Attribute) and func.attr == "__setattr__")):
    return node.args[1].value
  return None


def defined_names(tree):
  """Names a file defines itself: defs and classes, names it binds
  (parameters too), attributes it stores (`self._x = ...`, setattr)."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      names.add(node.id)
    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
      names.add(node.attr)
    elif isinstance(node, ast.arg):
      names.add(node.arg)
    elif set_name(node) is not None:
      names.add(set_name(node))
  return names
