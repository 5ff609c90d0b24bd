"""research.compare cleans only what it wrote, at every depth (issue 35).

An unfinished compare run is emptied before its rerun; these are the traps
that emptying must not fall into: a TensorBoard folder that is a symbolic
link to the user's logs, and a user's file one level down. Through
research.compare's `main` (its own process: its flags clash with
train.train's), with the outside files hashed before and after. Also: a
--model_fn that returns no Keras model (os:system, builtins:exit) is one
line, before anything is written.
"""

import os

import pytest

from research import study_owner
from tests.binaries import one_error, run_main, tree_digest, user_folder

# research.compare against links and foreign files: make test-slow (and
# CI) runs them.
pytestmark = pytest.mark.slow

COMPARE = ["--preset=synthetic_mlp", "--strategies=e2e", "--seeds=1",
           "--seed=0", "--train_steps=20", "--eval_points=2", "--noplots",
           "--cost_repeats=1"]


def _unfinished_compare(tmp_path):
  """An out_dir whose e2e run compare started and did not finish: the
  study's markers, plus a checkpoint of the killed run."""
  out_dir = str(tmp_path / "out")
  owner = study_owner.claim(out_dir, None)
  run_dir = os.path.join(out_dir, "e2e", "seed_0")
  study_owner.prepare(out_dir, run_dir, owner, "e2e", 0)
  os.makedirs(os.path.join(run_dir, "checkpoints"))
  with open(os.path.join(run_dir, "checkpoints", "ckpt-5.index"), "w") as f:
    f.write("weights")
  return out_dir, run_dir


def test_compare_refuses_to_clean_a_linked_tensorboard_folder(
    tmp_path, capfd):
  out_dir, run_dir = _unfinished_compare(tmp_path)
  mine = user_folder(str(tmp_path))
  os.symlink(mine, os.path.join(run_dir, "train"))
  outside, before = tree_digest(mine), tree_digest(out_dir)
  code, _, err = run_main("research.compare",
                          [*COMPARE, f"--out_dir={out_dir}"], capfd)
  assert code == 1, err
  one_error(err, os.path.join(run_dir, "train"), "symbolic link")
  assert tree_digest(mine) == outside
  assert tree_digest(out_dir) == before


def test_compare_refuses_a_users_file_one_level_down(tmp_path, capfd):
  out_dir, run_dir = _unfinished_compare(tmp_path)
  with open(os.path.join(run_dir, "checkpoints", "README.txt"), "w") as f:
    f.write("what these checkpoints are\n")
  before = tree_digest(out_dir)
  code, _, err = run_main("research.compare",
                          [*COMPARE, f"--out_dir={out_dir}"], capfd)
  assert code == 1, err
  one_error(err, run_dir, "checkpoints/README.txt")
  assert tree_digest(out_dir) == before


@pytest.mark.parametrize("model_fn,words", [
    ("os:system", ["model_fn raised (TypeError"]),
    ("builtins:exit", ["model_fn exited (SystemExit"]),
    ("builtins:dict", ["model_fn returned dict, not a keras.Model"])])
def test_a_model_fn_that_returns_no_keras_model_is_one_line(
    tmp_path, capfd, model_fn, words):
  out_dir = str(tmp_path / "study")
  code, _, err = run_main("research.compare", [
      f"--model_fn={model_fn}", "--data=tests.test_user_study:tiny_data",
      "--strategies=local", "--seeds=1", "--train_steps=2", "--eval_points=2",
      "--noplots",
      f"--out_dir={out_dir}"], capfd)
  assert code == 1, err
  one_error(err, *words, f"model_fn={model_fn!r}")
  assert not os.path.exists(out_dir)
