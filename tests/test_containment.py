"""Nothing outside what a run owns is deleted or replaced (issue 35, §1).

Each case builds the trap a user, a copied folder or another process
leaves (a symbolic link inside a run, a checkpoint pointer naming files
elsewhere, a user's file one level down, two exports racing for one
folder), runs the binary's `main` (or, for the race, two of them), and
checks: one `error:` line naming the entry at fault, no traceback, and
the files outside the run hashed byte for byte the same before and after.
"""

import json
import os
import shutil
import subprocess
import uuid

import pytest

from tests import hold
from tests.binaries import (ROOT, one_error, run_binary, run_main,
                            tree_digest, user_folder)
from train import export_dir as export_dir_lib
from train import owned_dir

# The binaries against links and pointers that lead outside their folders:
# make test-slow (and CI) runs them.
pytestmark = pytest.mark.slow

TT = ["--preset=synthetic_mlp", "--steps_per_loop=10",
      "--checkpoint_every_steps=10", "--eval_every_steps=10"]


def _copy(synthetic_run, tmp_path, name="run"):
  model_dir = str(tmp_path / name)
  shutil.copytree(synthetic_run, model_dir)
  return model_dir


def test_a_linked_unfinished_checkpoint_is_refused_not_emptied(
    synthetic_run, tmp_path, capfd):
  model_dir = _copy(synthetic_run, tmp_path)
  mine = user_folder(str(tmp_path))
  link = os.path.join(model_dir, "checkpoints", "ckpt-7_temp")
  os.symlink(mine, link)
  outside, run_before = tree_digest(mine), tree_digest(model_dir)
  code, _, err = run_main("train.train", [*TT, "--train_steps=20",
                                          f"--model_dir={model_dir}"], capfd)
  assert code == 1, err
  one_error(err, link, "symbolic link", "nothing was deleted")
  assert tree_digest(mine) == outside
  assert tree_digest(model_dir) == run_before


def test_a_checkpoints_folder_linked_to_another_run_is_refused(
    synthetic_run, tmp_path, capfd):
  run_a = _copy(synthetic_run, tmp_path, "a")
  run_b = str(tmp_path / "b")
  os.makedirs(run_b)
  os.symlink(os.path.join(run_a, "checkpoints"),
             os.path.join(run_b, "checkpoints"))
  shutil.copy(os.path.join(run_a, "config.json"), run_b)
  before = tree_digest(run_a)
  code, _, err = run_main("train.train", [
      *TT, "--train_steps=30", "--keep_checkpoints=1",
      f"--model_dir={run_b}"], capfd)
  assert code == 1, err
  one_error(err, os.path.join(run_b, "checkpoints"), "symbolic link")
  assert tree_digest(run_a) == before


@pytest.mark.parametrize("where", ["absolute", "relative"])
def test_a_pointer_entry_outside_checkpoints_is_refused(
    synthetic_run, tmp_path, capfd, where):
  model_dir = _copy(synthetic_run, tmp_path)
  # Another run's checkpoint files, elsewhere: what a copied pointer names.
  other = str(tmp_path / "outside" / "x")
  os.makedirs(other)
  for suffix in (".index", ".data-00000-of-00001"):
    shutil.copy(os.path.join(model_dir, "checkpoints", "ckpt-10" + suffix),
                os.path.join(other, "ckpt-1" + suffix))
  entry = (os.path.join(other, "ckpt-1") if where == "absolute" else
           "../../outside/x/ckpt-1")
  with open(os.path.join(model_dir, "checkpoints", "checkpoint"), "w") as f:
    f.write(f'model_checkpoint_path: "ckpt-10"\n'
            f'all_model_checkpoint_paths: "{entry}"\n'
            f'all_model_checkpoint_paths: "ckpt-10"\n')
  outside, run_before = tree_digest(other), tree_digest(model_dir)
  code, _, err = run_main("train.train", [
      *TT, "--train_steps=30", "--keep_checkpoints=1",
      f"--model_dir={model_dir}"], capfd)
  assert code == 1, err
  one_error(err, repr(entry), "lies outside", "nothing was changed")
  assert tree_digest(other) == outside
  assert tree_digest(model_dir) == run_before


def test_the_rule_refuses_links_at_every_depth_and_paths_outside(tmp_path):
  root = str(tmp_path / "owned")
  mine = user_folder(str(tmp_path))
  os.makedirs(os.path.join(root, "a", "b"))
  os.symlink(mine, os.path.join(root, "a", "b", "c"))
  outside = tree_digest(mine)
  for path in (root, os.path.join(root, "a"), os.path.join(root, "a", "b"),
               os.path.join(root, "a", "b", "c"),
               os.path.join(root, "a", "b", "c", "deep")):
    with pytest.raises(ValueError, match="symbolic link"):
      owned_dir.remove(root, path)
  with pytest.raises(ValueError, match="symbolic link"):
    owned_dir.clear(root)
  with pytest.raises(ValueError, match="lies outside"):
    owned_dir.remove(root, os.path.join(root, "..", "mine"))
  assert tree_digest(mine) == outside
  os.remove(os.path.join(root, "a", "b", "c"))
  owned_dir.remove(root, os.path.join(root, "a"))  # ours, link-free: gone
  assert os.listdir(root) == []


def test_an_export_dir_that_is_a_link_is_refused_before_training(
    tmp_path, capfd):
  mine = user_folder(str(tmp_path))
  link = str(tmp_path / "export_link")
  os.symlink(mine, link)
  model_dir = str(tmp_path / "run")
  outside = tree_digest(mine)
  code, _, err = run_main("train.train", [
      *TT, "--train_steps=10", f"--model_dir={model_dir}",
      f"--export_dir={link}"], capfd)
  assert code == 1, err
  one_error(err, f"--export_dir={link}", "symbolic link")
  assert tree_digest(mine) == outside
  assert not os.path.exists(model_dir)  # refused before the first step


def test_an_export_dir_too_long_for_its_sibling_is_refused_before_training(
    tmp_path, capfd):
  name = "e" * 240  # fits the file system's 255; ".e...e.tmp-<12>" not
  model_dir = str(tmp_path / "run")
  code, _, err = run_main("train.train", [
      *TT, "--train_steps=10", f"--model_dir={model_dir}",
      f"--export_dir={tmp_path / name}"], capfd)
  assert code == 1, err
  one_error(err, "too long", "258 characters", "limit of 255")
  assert not os.path.exists(model_dir)


def test_two_exports_into_one_new_folder_never_replace_each_other(
    synthetic_run, tmp_path):
  """Export A holds with its SavedModel written, before the move into
  place; export B of another run writes the same new folder meanwhile.
  A must not replace B's export: A refuses in one line."""
  run_a, run_b = (_copy(synthetic_run, tmp_path, name) for name in "ab")
  with open(os.path.join(run_b, "run.json"), "w") as f:
    json.dump({"run_id": uuid.uuid4().hex}, f)  # another run: another owner
  target = str(tmp_path / "served")
  ready = str(tmp_path / "held")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  proc = subprocess.Popen(
      hold.command(ready, "tf_interlock.export._stop_gradients_to_identities",
                   1, "train.export", f"--model_dir={run_a}",
                   f"--export_dir={target}"),
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)
  try:
    hold.wait_until_held(ready, proc)
    assert not os.path.exists(target)  # A checked a new folder
    run_binary("train.export", f"--model_dir={run_b}",
               f"--export_dir={target}")  # its own process: flags clash
    b_export = tree_digest(target)
    with open(ready + ".go", "w"):
      pass
    _, err = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  assert proc.returncode == 1, err
  one_error(err, f"export_dir={target}", "nothing was replaced")
  assert tree_digest(target) == b_export
  with open(os.path.join(run_b, "run.json")) as f:
    assert export_dir_lib.read_marker(target)["owner"] == json.load(f)[
        "run_id"]
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".served.")]
