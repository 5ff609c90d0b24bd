"""The research tools and their numeric flags, read from the source (no
import: the tools define flags of the same names)."""

import ast
import os

from tests.binaries import ROOT
from tools import gen_build


def _trees():
  folder = os.path.join(ROOT, "research")
  for name in sorted(os.listdir(folder)):
    if name.endswith(".py"):
      with open(os.path.join(folder, name)) as f:
        yield name[:-3], ast.parse(f.read())


def research_binaries():
  """Module names of the research/ files with a __main__ block."""
  return [f"research.{name}" for name, tree in _trees()
          if gen_build.has_main_block(tree)]


def research_numeric_flags():
  """(tool, flag, help) of every DEFINE_integer/DEFINE_float in
  research/*.py (tool: the file's name without .py)."""
  found = []
  for name, tree in _trees():
    for node in ast.walk(tree):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr in ("DEFINE_integer", "DEFINE_float")):
        flag, _, text = (node.args + [None] * 3)[:3]
        found.append((name, ast.literal_eval(flag),
                      ast.literal_eval(text) if text is not None else ""))
  return found
