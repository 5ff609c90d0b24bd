"""The order in which pytest-xdist hands test files to its workers.

`make test` runs `-n 2 --dist loadfile --no-loadscope-reorder`: each file
is one unit of work, handed out in collection order to whichever worker is
nearly done. The run ends when the busier worker ends, so the costliest
files go first and the cheap ones fill the gaps at the end (longest job
first). xdist's own reorder (`--loadscope-reorder`, its default) sorts
files by their number of tests instead, which puts the costly files,
those with a few tests that each start a binary, last: one worker then
runs a minute-long file while the other waits.

conftest.py applies this order only inside xdist's workers (all of them
collect, and must collect the same order); a run without xdist keeps
pytest's order.
"""

import os

# Seconds of make test's tests per file (setup, call and teardown; one
# file at a time, -n 0, on a loaded 2-core host: good for ranking only).
# A file not named here counts DEFAULT_S. Rank again after a file gains
# a binary run: `pytest -n 0 --durations=0 tests/test_x.py`.
COSTS_S = {
    "test_reliability.py": 89,
    "test_keras_habits.py": 71,
    "test_user_study.py": 70,
    "test_readme.py": 64,
    "test_keras_user_models.py": 56,
    "test_hostile_inputs.py": 50,
    "test_checkpoint_safety.py": 46,
    "test_train_threading.py": 46,
    "test_flag_validation.py": 43,
    "test_build_file.py": 37,
    "test_export.py": 16,
    "test_collapse_probe.py": 12,
    "test_flag_help.py": 12,
}
DEFAULT_S = 5


def cost_s(path):
  """The rank of a test file: its seconds in COSTS_S, else DEFAULT_S."""
  return COSTS_S.get(os.path.basename(str(path)), DEFAULT_S)


def costliest_files_first(items):
  """Sorts collected items in place: files by falling cost, each file's
  tests kept together and in their order (the sort is stable)."""
  first_seen = {}
  for item in items:
    first_seen.setdefault(str(item.path), len(first_seen))
  items.sort(key=lambda item: (-cost_s(item.path),
                               first_seen[str(item.path)]))
