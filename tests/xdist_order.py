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
# and teardown) summed per file, from one `make test` run here (Dec 7, -n 2,
# 350 s, 1,214 tests, after tests/test_pipelined_loop.py came in).
# A session fixture (conftest's synthetic_run) counts in the first file of
# a worker that uses it. A file not named here counts DEFAULT_S.
# Rank again after a file gains or loses a binary run:
# `pytest -n 2 --dist loadfile --durations=0 --durations-min=0.3`.
COSTS_S = {
    "test_pipelined_loop.py": 51,
    "test_keras_model.py": 33,
    "test_step_loop.py": 31,
    "test_keras_state.py": 29,
    "test_keras_hub.py": 26,
    "test_keras_user_models.py": 25,
    "test_readme.py": 24,
    "test_module_functions.py": 22,
    "test_train_binaries.py": 20,
    "test_trainer_distributed.py": 16,
    "test_build_file.py": 16,
    "test_recompute.py": 14,
    "test_keras_habits.py": 14,
    "test_flag_validation.py": 13,
    "test_keras_fine_tuning.py": 13,
    "test_keras_weighted_metrics.py": 13,
    "test_tied_weights.py": 12,
    "test_keras_graphs.py": 12,
    "test_reliability.py": 12,
    "test_export.py": 11,
    "test_device_pools.py": 10,
    "test_callbacks.py": 9,
    "test_check_costs.py": 9,
    "test_ram_filesystem.py": 8,
    "test_microbatch_embedding.py": 8,
    "test_engine_equivalence.py": 8,
    "test_keras_inputs.py": 8,
    "test_data_text.py": 8,
    "test_benchmark_spec.py": 7,
    "test_evaluation.py": 7,
    "test_memory_count.py": 7,
    "test_trainer_checks.py": 6,
    "test_api_edges.py": 6,
    "test_mixed_float16.py": 6,
    "test_install.py": 5,
    "test_resnet.py": 5,
    "test_custom_placement.py": 5,
    "test_timeline.py": 5,
    "test_keras_applications.py": 5,
    "test_flag_help.py": 5,
    "test_plot_frontier.py": 5,
    "test_tracing_time.py": 4,
    "test_fit_guards.py": 4,
    "test_real_models.py": 4,
    "test_keras_outputs.py": 3,
    "test_stop_signals.py": 3,
    "test_transformer.py": 3,
    "test_front_door_errors.py": 3,
    "test_export_dir.py": 3,
    "test_profile_steps.py": 3,
    "test_data_images.py": 3,
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
