"""No file outside the placement classes compares a placement's name.

Each placement is one class (`tf_interlock/placements/`) whose attributes
and methods say what the rest of the code decides by placement; a caller
that writes `config.placement == "simulated"` or `kind in ("gpu", ...)`
instead brings back the string scheme, where a new placement means editing
every such test. The check parses tf_interlock/, train/ and research/ with
`ast` and flags a comparison (`==`, `!=`, `in`, `not in`) of a built-in
placement name (a string literal, alone or in a literal tuple, list or set)
with an expression that names a placement or a kind (`placement`, `kind`).
"""

import ast
import os

from tests.binaries import ROOT
from tf_interlock import placement as placement_lib

PACKAGES = ("tf_interlock", "train", "research")
# The placement classes themselves may name their kinds.
EXEMPT = (os.path.join("tf_interlock", "placement.py"),
          os.path.join("tf_interlock", "placements") + os.sep)


def _literals(node):
  """The string literals `node` is, or holds (a literal tuple/list/set)."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return {node.value}
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return {e.value for e in node.elts
            if isinstance(e, ast.Constant) and isinstance(e.value, str)}
  return set()


def _names_a_placement(node):
  """Whether a non-literal operand names a placement or a kind."""
  if _literals(node):
    return False
  text = ast.unparse(node).lower()
  return "placement" in text or text == "kind" or text.endswith(".kind")


def kind_comparisons(source, filename="<source>"):
  """`(line, code)` of each comparison of a placement name in `source`."""
  found = []
  for node in ast.walk(ast.parse(source, filename)):
    if not isinstance(node, ast.Compare):
      continue
    operands = [node.left, *node.comparators]
    named = set().union(*map(_literals, operands)) & set(placement_lib.KINDS)
    if named and any(map(_names_a_placement, operands)):
      found.append((node.lineno, ast.unparse(node)))
  return found


def _files():
  for package in PACKAGES:
    for folder, _, names in os.walk(os.path.join(ROOT, package)):
      for name in sorted(names):
        path = os.path.join(folder, name)
        relative = os.path.relpath(path, ROOT)
        if name.endswith(".py") and not relative.startswith(EXEMPT):
          yield relative, path


def test_the_scan_finds_the_string_scheme():
  source = "\n".join([
      'if config.placement == "tpu": pass',
      'if placement.kind in ("simulated", "gpu"): pass',
      'ok = "cluster" != spec["placement"]',
      'x = kind not in ["single"]',
      # Not placements: a role, a tokenizer kind, a value passed along.
      'if role == "simulated": pass',
      'if kind == "wordpiece": pass',
      'make_placement("simulated", 4)',
  ])
  assert [line for line, _ in kind_comparisons(source)] == [1, 2, 3, 4]


def test_no_file_compares_a_placement_name():
  found = []
  for relative, path in _files():
    with open(path, encoding="utf-8") as f:
      source = f.read()
    found += [f"{relative}:{line}: {code}"
              for line, code in kind_comparisons(source, relative)]
  assert not found, (
      "Ask the placement class (tf_interlock/placements/: its attributes "
      "and methods) instead of comparing its name:\n" + "\n".join(found))
