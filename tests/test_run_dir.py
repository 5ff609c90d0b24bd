"""The run directory's layout checks, checkpoint pointer and lock, on a
local disk and on TF's in-memory ram:// file system (gs:// stand-in)."""

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import tensorflow as tf

from train import owned_dir
from train import paths
from train import run_dir
from train import run_lock
from train.run_dir import RunDir
from train.run_lock import RunLock


@pytest.fixture(params=["local", "ram"])
def root(request, tmp_path):
  if request.param == "local":
    return str(tmp_path)
  return f"ram://run_dir_test_{uuid.uuid4().hex[:8]}"


def _write(path, data=b""):
  tf.io.gfile.makedirs(paths.parent(path))
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(data)


def _checkpoints(run, *steps, pointer=True):
  for n in steps:
    _write(run.file("checkpoints", f"ckpt-{n}.index"))
    _write(run.file("checkpoints", f"ckpt-{n}.data-00000-of-00001"))
  if pointer:
    _write(run.file("checkpoints", "checkpoint"),
           f'model_checkpoint_path: "ckpt-{steps[-1]}"\n'.encode())


def test_paths_of_urls_stay_urls():
  assert paths.normalize("gs://b/x/../y/") == "gs://b/y"
  assert paths.parent("ram://a/b") == "ram://a"
  assert run_dir.is_within("gs://b/run/export", "gs://b/run")
  assert not run_dir.is_within("gs://b/run2", "gs://b/run")
  assert paths.normalize("rel") == os.path.abspath("rel")


def test_write_atomic_replaces_or_refuses_and_leaves_no_temporary(root):
  path = paths.join(root, "a.json")
  tf.io.gfile.makedirs(root)
  paths.write_atomic(path, "old")
  paths.write_atomic(path, "new")
  with pytest.raises(tf.errors.AlreadyExistsError):
    paths.write_atomic(path, "refused", overwrite=False)
  with tf.io.gfile.GFile(path) as f:
    assert f.read() == "new"
  assert tf.io.gfile.listdir(root) == ["a.json"]
  paths.write_atomic(paths.join(root, "b.json"), "b", overwrite=False)
  assert sorted(tf.io.gfile.listdir(root)) == ["a.json", "b.json"]


def test_layout_errors_name_the_path(tmp_path):
  _write(str(tmp_path / "file"))
  for model_dir, words in ((tmp_path / "file", "is a file"),
                           (tmp_path / "file" / "run", "under the file")):
    with pytest.raises(ValueError, match=words):
      RunDir(str(model_dir)).check_layout()
  run = RunDir(str(tmp_path / "run"))
  _write(run.file("checkpoints"))
  with pytest.raises(ValueError, match="checkpoints should be a directory"):
    run.check_layout()


def test_garbage_config_names_the_file(root):
  run = RunDir(paths.join(root, "run"))
  _write(run.config_path, b"\xff{not json")
  with pytest.raises(ValueError, match="config.json is not a readable"):
    run.read_config()


@pytest.mark.parametrize("pointer, problem", [
    (None, "is missing"), (b"garbage text", "is unreadable"),
    (b"\xff\xfe\x00\x01", "is unreadable"),
    (b'model_checkpoint_path: "ckpt-30"', "incomplete or missing")])
def test_a_bad_pointer_is_an_error_naming_the_newest_checkpoint(
    root, pointer, problem):
  run = RunDir(paths.join(root, "run"))
  _checkpoints(run, 10, 20, pointer=False)
  _write(run.file("checkpoints", "ckpt-30.index"))  # data never written
  if pointer is not None:
    _write(run.file("checkpoints", "checkpoint"), pointer)
  with pytest.raises(ValueError, match=problem) as info:
    run.latest_checkpoint()
  assert "--resume_from=ckpt-20" in str(info.value)
  assert run.latest_checkpoint("ckpt-20").endswith("ckpt-20")
  with pytest.raises(ValueError, match="would overwrite the newer"):
    run.latest_checkpoint("ckpt-10")
  with pytest.raises(ValueError, match="checkpoint ckpt-30 in .* is "
                     "incomplete") as info:
    run.latest_checkpoint("ckpt-30")
  assert "the run has: ckpt-10, ckpt-20." in str(info.value)
  # TF's file is ckpt-20 exactly: a zero-padded step names no file.
  for select, words in (("ckpt-020", "(did you mean ckpt-20?)"),
                        ("ckpt-5", "no checkpoint ckpt-5 in"),
                        ("latest", "no checkpoint latest in")):
    with pytest.raises(ValueError) as info:
      run.latest_checkpoint(select, flag="--checkpoint", for_writing=False)
    line = str(info.value)
    assert line.startswith(f"--checkpoint={select}: ") and words in line
    assert "the run has: ckpt-10, ckpt-20." in line
    assert line.endswith(f"Received: checkpoint={select!r}")
  run.repair_pointer(run.latest_checkpoint("ckpt-20"))
  assert run.latest_checkpoint().endswith("ckpt-20")
  if pointer is not None:  # the damaged pointer is kept, not deleted
    with tf.io.gfile.GFile(run.file("checkpoints",
                                    "checkpoint.unreadable"), "rb") as f:
      assert f.read() == pointer


def test_a_good_pointer_and_a_fresh_run(root):
  run = RunDir(paths.join(root, "run"))
  assert run.latest_checkpoint() is None
  _checkpoints(run, 10, 20)
  assert run.latest_checkpoint().endswith("ckpt-20")
  assert run.complete_checkpoints() == [10, 20]


def test_export_targets(root):
  run = RunDir(paths.join(root, "run"))
  _write(run.config_path, b"{}")
  user = paths.join(root, "user")
  _write(paths.join(user, "notes.txt"), b"mine")
  for target, words in (
      (run.path, "would replace the run directory"),
      (root, "would replace the run directory"),
      (run.file("checkpoints", "x"), "lies in the run's checkpoints"),
      (run.file("train"), "lies in the run's train"),
      (user, "not an export of this run"),
      (paths.join(user, "notes.txt"), "is a file")):
    with pytest.raises(ValueError, match=words) as info:
      run.check_export_dir(target)
    assert "--export_dir=" in str(info.value), target
  assert run.check_export_dir(None) == run.default_export_dir
  assert run.check_export_dir(paths.join(root, "new")).endswith("new")


def test_run_id_is_made_once(root):
  run = RunDir(paths.join(root, "run"))
  assert run.run_id() is None
  made = run.run_id(create=True)
  assert RunDir(run.path).run_id(create=True) == made


def _holder(lock_path, **fields):
  now = time.time()
  info = {"host": "elsewhere", "pid": 1, "started": now, "updated": now,
          "token": "theirs", **fields}
  _write(lock_path, json.dumps(info).encode())


def _dead_pid():
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def test_lock_refuses_a_live_holder_and_takes_over_stale_ones(root, capsys):
  import socket  # pylint: disable=g-import-not-at-top
  path = paths.join(root, "run", "lock.json")
  here = socket.gethostname()
  cases = [  # (holder fields, taken over without break_lock)
      (dict(host=here, pid=os.getppid()), False),  # alive on this host
      (dict(host=here, pid=_dead_pid()), True),
      (dict(host="elsewhere"), False),  # fresh heartbeat on another host
      (dict(host="elsewhere", updated=time.time() - 7200), True),
  ]
  for fields, stale in cases:
    _holder(path, **fields)
    lock = RunLock(path)
    if not stale:
      with pytest.raises(ValueError, match="in use by pid") as info:
        lock.acquire()
      assert "--break_lock=true" in str(info.value)
      assert json.loads(tf.io.gfile.GFile(path).read())["token"] == "theirs"
      lock.acquire(break_lock=True)
    else:
      lock.acquire()
    assert "warning: taking over" in capsys.readouterr().err
    assert json.loads(tf.io.gfile.GFile(path).read())["pid"] == os.getpid()
    lock.release()
    assert not tf.io.gfile.exists(path)


def test_lock_is_exclusive_and_released_only_by_its_holder(root):
  path = paths.join(root, "run", "lock.json")
  tf.io.gfile.makedirs(paths.parent(path))
  with RunLock(path) as first:
    first.acquire()
    with pytest.raises(ValueError, match=f"pid {os.getpid()}"):
      RunLock(path).acquire()
    first.refresh()
  assert not tf.io.gfile.exists(path)
  _write(path, b"\x00garbage")
  with pytest.raises(ValueError, match="lock.json is unreadable"):
    RunLock(path).acquire()


def test_held_removes_only_a_folder_it_made_for_the_lock(root):
  folder = paths.join(root, "new")
  with run_lock.held(folder) as lock:
    assert lock.held and tf.io.gfile.listdir(folder) == ["lock.json"]
  assert not tf.io.gfile.exists(folder)  # made for the lock only
  with run_lock.held(folder):
    _write(paths.join(folder, "notes.txt"), b"mine")
  assert tf.io.gfile.listdir(folder) == ["notes.txt"]
  _holder(paths.join(folder, "lock.json"), host="elsewhere")
  with pytest.raises(ValueError, match=r"^busy: the run directory is in use "
                     r"by pid 1 on host elsewhere"):
    with run_lock.held(folder, refused="busy: "):
      pass
  assert sorted(tf.io.gfile.listdir(folder)) == ["lock.json", "notes.txt"]


def test_an_owned_folder_is_ours_only_by_its_marker(root):
  folder = paths.join(root, "owned")
  assert owned_dir.create_marker(folder, "m.json", {"owner": "a", "seed": 0})
  assert not owned_dir.create_marker(folder, "m.json", {"owner": "b"})
  marker = owned_dir.read_marker(folder, "m.json")
  assert owned_dir.names(marker, owner="a", seed=0)
  assert not owned_dir.names(marker, owner="a", seed=1)
  # An owner not known yet owns nothing, even a marker without an owner.
  assert not owned_dir.names({"seed": 0}, owner=None, seed=0)
  _write(paths.join(folder, "sub", "ours.txt"))
  _write(paths.join(folder, "notes.txt"))
  ours = {"m.json", "sub", "sub/ours.txt"}.__contains__
  assert owned_dir.foreign_entries(folder, ours, recursive=True) == [
      "notes.txt"]
  _write(paths.join(folder, "bad.json"), b"[1]")
  assert owned_dir.read_json(paths.join(folder, "bad.json")) == {}
  assert owned_dir.read_marker(folder, "bad.json") is None
  owned_dir.remove_marked(folder, "m.json")
  assert not tf.io.gfile.exists(folder)
