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

# CPU seconds of make test's tests per file (user + sys, subprocesses
# included, less the 4 s of a pytest process's start-up; one file at a
# time, -n 0, on a loaded 2-core host: good for ranking only). A file not
# named here counts DEFAULT_S. Rank again after a file gains a binary run:
# `/usr/bin/time -v pytest -n 0 tests/test_x.py`.
COSTS_S = {
    "test_module_functions.py": 68,
    "test_xla.py": 42,
    "test_keras_model.py": 42,
    "test_readme.py": 40,
    "test_user_study.py": 37,
    "test_checkpoint_safety.py": 36,
    "test_train_binaries.py": 35,
    "test_reliability.py": 35,
    "test_hostile_inputs.py": 28,
    "test_keras_user_models.py": 26,
    "test_trainer_distributed.py": 21,
    "test_benchmark.py": 20,
    "test_flag_validation.py": 19,
    "test_train_threading.py": 17,
    "test_keras_habits.py": 16,
    "test_export.py": 16,
    "test_engine_equivalence.py": 12,
    "test_trainer_checks.py": 11,
    "test_resnet.py": 11,
    "test_callbacks.py": 11,
    "test_build_file.py": 10,
    "test_ram_filesystem.py": 8,
    "test_mixed_float16.py": 8,
    "test_microbatch_embedding.py": 8,
    "test_evaluation.py": 8,
    "test_data_text.py": 8,
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
