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
# and teardown) summed per file, from one `make test` run here (Dec 6, -n 2,
# 436 s, 1,159 tests, after test_readme's examples shared one child and the
# shared fixtures of test_keras_state, test_step_loop and test_keras_hub).
# A session fixture (conftest's synthetic_run) counts in the first file of
# a worker that uses it. A file not named here counts DEFAULT_S.
# Rank again after a file gains or loses a binary run:
# `pytest -n 2 --dist loadfile --durations=0 --durations-min=0.3`.
COSTS_S = {
    "test_keras_model.py": 71,
    "test_step_loop.py": 68,
    "test_keras_state.py": 57,
    "test_readme.py": 52,
    "test_keras_hub.py": 48,
    "test_keras_user_models.py": 42,
    "test_module_functions.py": 33,
    "test_build_file.py": 32,
    "test_trainer_distributed.py": 31,
    "test_export.py": 29,
    "test_keras_habits.py": 28,
    "test_train_binaries.py": 27,
    "test_device_pools.py": 21,
    "test_callbacks.py": 19,
    "test_recompute.py": 14,
    "test_flag_validation.py": 13,
    "test_keras_fine_tuning.py": 13,
    "test_reliability.py": 11,
    "test_keras_graphs.py": 10,
    "test_engine_equivalence.py": 9,
    "test_keras_inputs.py": 9,
    "test_check_costs.py": 9,
    "test_resnet.py": 7,
    "test_microbatch_embedding.py": 7,
    "test_tied_weights.py": 6,
    "test_evaluation.py": 6,
    "test_mixed_float16.py": 6,
    "test_trainer_checks.py": 6,
    "test_memory_count.py": 6,
    "test_ram_filesystem.py": 6,
    "test_timeline.py": 5,
    "test_data_text.py": 5,
    "test_api_edges.py": 5,
    "test_custom_placement.py": 5,
    "test_install.py": 5,
    "test_keras_applications.py": 5,
    "test_flag_help.py": 4,
    "test_real_models.py": 4,
    "test_plot_frontier.py": 4,
    "test_tracing_time.py": 4,
    "test_fit_guards.py": 4,
    "test_benchmark_spec.py": 4,
    "test_export_dir.py": 3,
    "test_keras_outputs.py": 3,
    "test_placement.py": 3,
    "test_stop_signals.py": 3,
    "test_transformer.py": 3,
    "test_profile_steps.py": 3,
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
