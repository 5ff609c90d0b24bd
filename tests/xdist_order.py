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

# Seconds of make test's tests per file: pytest's --durations (setup, call
# and teardown) summed per file, from one quiet `make test` run here (Dec 3,
# -n 2, 221 s in all). A session fixture (conftest's synthetic_run) counts
# in the first file of a worker that uses it. A file not named here counts
# DEFAULT_S. Rank again after a file gains or loses a binary run:
# `pytest -n 2 --dist loadfile --durations=0 --durations-min=0.3`.
COSTS_S = {
    "test_keras_state.py": 60,  # estimated (Dec 4, loaded host)
    "test_readme.py": 35,
    "test_user_study.py": 29,
    "test_checkpoint_safety.py": 28,
    "test_xla.py": 26,
    "test_keras_model.py": 24,
    "test_module_functions.py": 20,
    "test_step_loop.py": 18,
    "test_keras_user_models.py": 18,
    "test_benchmark.py": 14,
    "test_keras_graphs.py": 14,  # estimated (Dec 4)
    "test_memory_count.py": 12,  # estimated (Dec 4)
    "test_keras_inputs.py": 12,  # estimated (Dec 4)
    "test_fit_guards.py": 10,  # estimated (Dec 4)
    "test_recompute.py": 8,  # estimated (Dec 4)
    "test_trainer_distributed.py": 13,
    "test_export.py": 13,
    "test_train_binaries.py": 11,
    "test_flag_validation.py": 11,
    "test_keras_habits.py": 10,
    "test_hostile_inputs.py": 10,
    "test_build_file.py": 10,
    "test_train_threading.py": 9,
    "test_reliability.py": 9,
    "test_engine_equivalence.py": 6,
    "test_collapse_probe.py": 6,
    "test_callbacks.py": 6,
    "test_trainer_checks.py": 5,
    "test_resnet.py": 5,
    "test_ram_filesystem.py": 5,
    "test_microbatch_embedding.py": 5,
    "test_mixed_float16.py": 4,
    "test_flag_help.py": 4,
    "test_evaluation.py": 4,
    "test_data_text.py": 4,
    "test_custom_placement.py": 4,
}
DEFAULT_S = 2


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
