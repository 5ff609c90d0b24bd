"""Every checkpoint resumable, one writer per run (issue 29, checkpoints).

Through train.train's main and its error boundary, in process: run names TF
reads as patterns, checkpoints of another architecture, leftovers of killed
saves and exports, a second writer after lock.json was deleted, a run folder
moved mid-run, and the lines that say why a run changed or stopped.
"""

import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.binaries import ROOT, run_main, tree_digest
from train import export_dir as export_dir_lib
from train import run_lock
from train import config as config_lib
from train import error_boundary
from train import run_io
from train import train_lib

# make test-slow (the binaries under attack (a second writer, kills, resumes)).
pytestmark = pytest.mark.slow

TT = ["--preset=synthetic_mlp", "--steps_per_loop=10",
      "--checkpoint_every_steps=10", "--eval_every_steps=10"]


def _main(flags_given, capfd):
  """(exit code, stdout, stderr) of train.train's main on TT + flags."""
  return run_main("train.train", [*TT, *flags_given], capfd)


def _guarded(fn, capfd):
  """(exit code, stderr) of `fn()` behind a binary's error boundary."""
  capfd.readouterr()
  code = 0
  try:
    error_boundary.guard()(lambda argv: fn())([])
  except SystemExit as e:
    code = e.code
  return code, capfd.readouterr().err


def _one_error(err, *words):
  """The single "error:" line of `err`, holding every word."""
  assert "Traceback" not in err, err
  lines = [line for line in err.splitlines() if line.startswith("error:")]
  assert len(lines) == 1, err
  for word in words:
    assert word in lines[0], (word, lines[0])
  return lines[0]


@pytest.fixture
def trained(synthetic_run):
  """A K = 4, 10-step run (ckpt-10 and an export) that tests copy:
  conftest.py's synthetic_run, trained once per process and shared with the
  other files that need one (it ran with --steps_per_loop=5, TT's 10)."""
  return synthetic_run


def _copy(trained, tmp_path, name="run"):
  model_dir = str(tmp_path / name)
  shutil.copytree(trained, model_dir)
  return model_dir


def _config(model_dir, **fields):
  return config_lib.Config(**dict(
      vars(config_lib.load_preset("synthetic_mlp")), steps_per_loop=10,
      checkpoint_every_steps=10, model_dir=model_dir, **fields))


def _checkpoints(model_dir):
  return sorted(n for n in os.listdir(os.path.join(model_dir, "checkpoints"))
                if n.endswith(".index"))


@pytest.mark.parametrize("char", ["[", "]", "*", "?", "{"])
def test_pattern_characters_in_a_run_name_are_refused(tmp_path, capfd,
                                                      char):
  model_dir = tmp_path / f"sweep{char}lr=0.1"
  code, _, err = _main([f"--model_dir={model_dir}", "--train_steps=20"],
                       capfd)
  assert code == 1
  _one_error(err, f"--model_dir={model_dir}", repr(char), "file pattern",
             "nothing was written")
  assert os.listdir(tmp_path) == []


def test_an_existing_run_with_such_a_name_is_not_called_corrupt(
    trained, tmp_path, capfd):
  """A run an older version saved under "sweep[lr=0.1]": TF cannot read it
  there, and the line says to rename the folder, not to throw it away."""
  model_dir = _copy(trained, tmp_path, "sweep[lr=0.1]")
  before = tree_digest(model_dir)
  code, err = _guarded(lambda: run_io.export_run(model_dir), capfd)
  line = _one_error(err, "files are intact", "rename")
  assert code == 1 and "corrupt" not in line
  assert tree_digest(model_dir) == before
  code, err = _guarded(lambda: run_io.evaluation_config(
      os.path.join(model_dir, "export"), None, None, ()), capfd)
  assert code == 1
  _one_error(err, "--saved_model=", "file pattern")


def test_corrupt_only_when_the_bytes_are_damaged():
  path = "/r/checkpoints/ckpt-10"
  lost = train_lib.restore_error(path, tf.errors.DataLossError(
      None, None, "checksum mismatch"))
  missing = train_lib.restore_error(path, tf.errors.NotFoundError(
      None, None, "Failed to find any matching files"))
  assert "it is corrupt" in str(lost) and "move it away" in str(lost)
  assert "corrupt" not in str(missing) and "move it" not in str(missing)


@pytest.mark.parametrize("edit", ["delete", "num_modules"])
def test_the_checkpoint_itself_must_hold_the_model(trained, tmp_path, capfd,
                                                   edit):
  """config.json deleted or edited to K = 2 on a K = 4 run: resuming with
  --num_modules=2 is refused in one line naming the difference."""
  model_dir = _copy(trained, tmp_path)
  config_path = os.path.join(model_dir, "config.json")
  if edit == "delete":
    os.remove(config_path)
  else:
    with open(config_path) as f:
      saved = json.load(f)
    with open(config_path, "w") as f:
      json.dump(dict(saved, num_modules=2), f)
  before = tree_digest(model_dir)
  code, _, err = _main([f"--model_dir={model_dir}", "--train_steps=20",
                        "--num_modules=2"], capfd)
  assert code == 1
  _one_error(err, "ckpt-10", "another model", "4 modules, the model 2")
  assert "could not be found" not in err
  assert tree_digest(model_dir) == before
  if edit == "num_modules":  # train.export rebuilds from config.json
    code, err = _guarded(lambda: run_io.export_run(model_dir), capfd)
    assert code == 1
    _one_error(err, "4 modules, the model 2")
    assert tree_digest(model_dir) == before


def test_a_shape_difference_is_named(trained, tmp_path, capfd):
  model_dir = _copy(trained, tmp_path)
  os.remove(os.path.join(model_dir, "config.json"))
  before = tree_digest(model_dir)
  code, _, err = _main([f"--model_dir={model_dir}", "--train_steps=20",
                        "--mlp_width=128"], capfd)
  assert code == 1
  _one_error(err, "has shape [256", "[128")
  assert tree_digest(model_dir) == before


def test_a_killed_save_and_a_killed_export_leave_nothing_behind(
    trained, tmp_path, capfd, monkeypatch):
  model_dir = _copy(trained, tmp_path)
  # What a save killed midway leaves (TF writes ckpt-N_temp/, then moves).
  temp = os.path.join(model_dir, "checkpoints", "ckpt-200_temp")
  os.makedirs(temp)
  open(os.path.join(temp, "part-00000-of-00001.index"), "wb").close()
  # An export killed while it deleted the export it replaced: every file
  # but the marker (deleted last) is gone.
  real_remove = tf.io.gfile.remove

  def killed(path):
    if ".export.old-" in path and path.endswith(export_dir_lib.MARKER):
      raise KeyboardInterrupt
    real_remove(path)

  monkeypatch.setattr(tf.io.gfile, "remove", killed)
  code, err = _guarded(lambda: run_io.export_run(model_dir), capfd)
  assert code == 1 and "interrupted" in err
  monkeypatch.setattr(tf.io.gfile, "remove", real_remove)
  [old] = [n for n in os.listdir(model_dir) if n.startswith(".export.old-")]
  assert os.listdir(os.path.join(model_dir, old)) == [export_dir_lib.MARKER]
  code, out, err = _main([f"--model_dir={model_dir}", "--train_steps=20"],
                         capfd)
  assert code == 0, err
  assert "removed ckpt-200_temp" in err
  assert not os.path.exists(temp)
  assert not [n for n in os.listdir(model_dir) if n.startswith(".export.")]
  assert _checkpoints(model_dir) == ["ckpt-10.index", "ckpt-20.index"]
  assert json.loads(out.splitlines()[-1])["step"] == 20


class _AtStep:
  """An action that calls `fn()` once, after the loop ending at `step`."""

  def __init__(self, step, fn):
    self.step, self.fn = step, fn

  def after_loop(self, loop):
    if loop.step == self.step:
      self.fn()


def test_a_second_writer_is_refused_and_the_holder_stops(tmp_path, capfd):
  """lock.json of a live run deleted, the same command started again: the
  newcomer is refused (the holder keeps the folder's flock), and the holder
  stops at its next save, since its lock no longer carries its token."""
  model_dir = str(tmp_path / "run")
  newcomer = []

  def intrude():
    os.remove(os.path.join(model_dir, "lock.json"))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    newcomer.append(subprocess.run(
        [sys.executable, "-m", "train.train", *TT, "--train_steps=30",
         f"--model_dir={model_dir}"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300))

  config = _config(model_dir, train_steps=30)
  code, err = _guarded(lambda: train_lib.run(
      config, out=io.StringIO(), extra_actions=[_AtStep(10, intrude)]),
                       capfd)
  [proc] = newcomer
  assert proc.returncode == 1, proc.stderr
  _one_error(proc.stderr, "in use by", "OS lock", "--break_lock cannot")
  assert code == 1
  _one_error(err, "lost the lock", "lock.json is gone")
  assert _checkpoints(model_dir) == ["ckpt-10.index"]  # no ckpt-20
  assert not os.path.exists(os.path.join(model_dir, "export"))


def test_a_run_folder_moved_mid_run_stops_it(tmp_path, capfd):
  model_dir = str(tmp_path / "run")
  moved = str(tmp_path / "moved")
  config = _config(model_dir, train_steps=30)
  code, err = _guarded(lambda: train_lib.run(
      config, out=io.StringIO(),
      extra_actions=[_AtStep(10, lambda: os.rename(model_dir, moved))]),
                       capfd)
  assert code == 1
  _one_error(err, f"{model_dir} was moved or replaced")
  assert not os.path.exists(model_dir)  # not recreated
  assert _checkpoints(moved) == ["ckpt-10.index"]


def test_the_lock_file_alone_on_ram(capfd):
  """ram:// (like gs://) has no flock: lock.json decides, and a heartbeat
  never overwrites another run's lock."""
  del capfd
  path = "ram://lock_test/run/lock.json"
  tf.io.gfile.makedirs("ram://lock_test/run")
  holder = run_lock.RunLock(path, out=io.StringIO())
  holder.acquire()
  other = run_lock.RunLock(path, out=io.StringIO())
  other.acquire(break_lock=True)  # someone broke it and started a run
  with pytest.raises(run_lock.LockLost, match="now names pid"):
    holder.refresh()
  with tf.io.gfile.GFile(path) as f:
    assert json.loads(f.read())["token"] == other.info["token"]
  holder.release()  # not ours: left to its holder
  assert tf.io.gfile.exists(path)
  other.release()
  assert not tf.io.gfile.exists(path)
  tf.io.gfile.rmtree("ram://lock_test")


def test_the_folder_lock_outlives_lock_json(tmp_path):
  path = str(tmp_path / "lock.json")
  holder = run_lock.RunLock(path, out=io.StringIO())
  holder.acquire()
  os.remove(path)
  for break_lock in (False, True):
    with pytest.raises(ValueError, match="OS lock"):
      run_lock.RunLock(path, out=io.StringIO()).acquire(break_lock=break_lock)
  holder.release()  # drops the flock: the next run may start
  newcomer = run_lock.RunLock(path, out=io.StringIO())
  newcomer.acquire()
  newcomer.release()


def test_a_resume_says_what_changed(trained, tmp_path, capfd):
  model_dir = _copy(trained, tmp_path)
  code, out, err = _main([f"--model_dir={model_dir}", "--train_steps=20",
                          "--strategy=e2e"], capfd)
  assert code == 0, err
  [line] = [l for l in out.splitlines() if l.startswith("resumed from")]
  assert "; changed since the last start: " in line
  assert "strategy '2wise' -> 'e2e'" in line
  assert "train_steps 10 -> 20" in line


def test_a_time_budget_says_it_ended_the_run(tmp_path, capfd):
  code, out, err = _main([f"--model_dir={tmp_path / 'run'}",
                          "--train_steps=1000", "--time_budget_s=0.001"],
                         capfd)
  assert code == 0, err
  assert ("--time_budget_s=0.001 ended the run at step 10 of 1000" in out)
  assert json.loads(out.splitlines()[-1])["step"] == 10


def test_train_steps_beyond_any_run_are_refused(tmp_path, capfd):
  code, _, err = _main([f"--model_dir={tmp_path / 'run'}",
                        "--train_steps=99999999999999999999"], capfd)
  assert code == 1
  _one_error(err, "--train_steps=99999999999999999999",
             f"<= {config_lib.MAX_TRAIN_STEPS}")
  assert os.listdir(tmp_path) == []


def test_checkpoints_off_the_loop_grid_are_announced(tmp_path, capfd):
  model_dir = str(tmp_path / "run")
  code, _, err = _main([f"--model_dir={model_dir}", "--train_steps=21",
                        "--steps_per_loop=7"], capfd)
  assert code == 0, err
  notes = [l for l in err.splitlines() if l.startswith("note: checkpoints")]
  assert len(notes) == 1 and "land at steps 14, 21, 35" in notes[0]
  assert _checkpoints(model_dir) == ["ckpt-14.index", "ckpt-21.index"]


def test_the_note_names_where_checkpoints_land():
  base = config_lib.load_preset("synthetic_mlp")

  def note(per_loop, every, start):
    return train_lib.landing_note(dataclasses.replace(
        base, steps_per_loop=per_loop, checkpoint_every_steps=every), start)

  assert note(10, 10, 0) is None and note(10, 20, 0) is None
  assert note(10, 5, 0) is None  # every loop ends on a multiple of 5
  assert "land at steps 14, 21, 35," in note(7, 10, 0)
  resumed = note(10, 10, 14)  # resumed off the loop grid
  assert "land at steps 24, 34, 44," in resumed and "step 14" in resumed
