"""tests/xdist_order.py: the costliest test files go to xdist first."""

import os
import types

from tests import xdist_order

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_every_ranked_file_exists():
  # A renamed or removed file would silently lose its rank.
  missing = [name for name in xdist_order.COSTS_S
             if not os.path.isfile(os.path.join(TESTS, name))]
  assert not missing, missing


def test_costliest_files_first_keeps_each_files_tests_in_order():
  cheap, costly = sorted(xdist_order.COSTS_S, key=xdist_order.COSTS_S.get)[-2:]
  unranked = ["tests/test_a.py", "tests/test_b.py"]
  items = [types.SimpleNamespace(path=path, name=f"{path}:{i}")
           for path in (unranked[0], f"tests/{cheap}", unranked[1],
                        f"tests/{costly}")
           for i in range(2)]
  xdist_order.costliest_files_first(items)
  assert [item.name for item in items] == [
      f"tests/{costly}:0", f"tests/{costly}:1",
      f"tests/{cheap}:0", f"tests/{cheap}:1",
      "tests/test_a.py:0", "tests/test_a.py:1",
      "tests/test_b.py:0", "tests/test_b.py:1"]
