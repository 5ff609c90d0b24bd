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
# and teardown) summed per file, from one `make test` run here (Dec 5, -n 2,
# 369 s, load 1-4; test_keras_hub and the trimmed test_recompute timed
# alone). A session fixture (conftest's synthetic_run) counts in the first
# file of a worker that uses it. A file not named here counts DEFAULT_S.
# Rank again after a file gains or loses a binary run:
# `pytest -n 2 --dist loadfile --durations=0 --durations-min=0.3`.
COSTS_S = {
    "test_readme.py": 40,
    "test_tied_weights.py": 15,  # estimated (Dec 5, loaded host)
    "test_profile_steps.py": 6,  # estimated (Dec 5)
    "test_timeline.py": 6,  # estimated (Dec 5)
    "test_xla.py": 39,
    "test_keras_model.py": 36,
    "test_keras_hub.py": 35,
    "test_checkpoint_safety.py": 32,
    "test_keras_state.py": 31,
    "test_module_functions.py": 27,
    "test_step_loop.py": 26,
    "test_keras_user_models.py": 25,
    "test_benchmark.py": 23,
    "test_train_binaries.py": 18,
    "test_build_file.py": 16,
    "test_trainer_distributed.py": 16,
    "test_export.py": 23,
    "test_export_dir.py": 9,  # measured alone (Dec 5)
    "test_predict_frontier.py": 6,  # measured alone (Dec 5)
    "test_user_study.py": 15,
    "test_evaluation.py": 15,
    "test_keras_habits.py": 15,
    "test_flag_validation.py": 15,
    "test_recompute.py": 12,
    "test_device_pools.py": 11,
    "test_callbacks.py": 10,
    "test_train_threading.py": 10,
    "test_keras_graphs.py": 9,
    "test_install.py": 8,
    "test_collapse_probe.py": 7,
    "test_memory_count.py": 7,
    "test_keras_inputs.py": 7,
    "test_microbatch_embedding.py": 7,
    "test_data_text.py": 7,
    "test_first_lines.py": 6,
    "test_engine_equivalence.py": 6,
    "test_flag_help.py": 6,
    "test_resnet.py": 6,
    "test_ram_filesystem.py": 6,
    "test_benchmark_spec.py": 5,
    "test_plot_frontier.py": 5,
    "test_custom_placement.py": 5,
    "test_trainer_checks.py": 5,
    "test_tf_private.py": 5,
    "test_mixed_float16.py": 4,
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
