"""train.export_dir: the binaries' owned export and its safe replace.

The library writes a plain SavedModel into a new folder
(tests/test_export.py); the binaries export through `export_owned`, which
marks the folder as a run's and replaces only that run's earlier export.
"""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tf_interlock import exits
from tf_interlock import export
from train import export_dir as export_dir_lib


def _owned_export(path, seed=0, owner="run-a"):
  """A fast two-module MLP export of `owner`."""
  modules = helpers.mlp_modules(2, seed=seed)
  x, _ = helpers.batch()
  exits.build(modules, x)
  return export_dir_lib.export_owned(
      modules, tf.TensorSpec((None, 6), tf.float32), path, owner=owner,
      metadata={"step": seed})


def _served(path):
  x, _ = helpers.batch()
  return export.load_exported(path).signatures["serving_default"](
      inputs=x)["logits"]


def _reference(seed):
  x, _ = helpers.batch()
  modules = helpers.mlp_modules(2, seed=seed)
  return modules[1](modules[0](x))


def _files(path):
  return {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_the_marker_names_the_owner_and_every_file(tmp_path):
  path = tmp_path / "export"
  assert _owned_export(path) == str(path)
  marker = export_dir_lib.read_marker(path)
  assert marker["owner"] == "run-a" and marker["step"] == 0
  assert marker["files"] == sorted(
      str(p.relative_to(path)) for p in path.rglob("*"))
  assert export_dir_lib.MARKER in marker["files"]


def test_refuses_to_overwrite_a_non_empty_dir(tmp_path):
  path = tmp_path / "export"
  path.mkdir()
  (path / "notes.txt").write_text("keep me")
  with pytest.raises(ValueError, match="Received: export_dir=") as info:
    _owned_export(path)
  assert "\n" not in str(info.value)
  assert os.listdir(path) == ["notes.txt"]
  assert os.listdir(tmp_path) == ["export"]


def test_a_plain_library_export_is_not_replaced(tmp_path):
  # No marker: the binaries cannot tell it from a user's folder.
  path = tmp_path / "export"
  modules = helpers.mlp_modules(2)
  exits.build(modules, helpers.batch()[0])
  export.export_saved_model(modules, tf.TensorSpec((None, 6)), path)
  before = _files(path)
  with pytest.raises(ValueError, match="not an export of this run"):
    _owned_export(path)
  assert _files(path) == before


def test_an_export_of_the_same_owner_is_replaced_whole(tmp_path):
  path = tmp_path / "export"
  _owned_export(path, seed=0)
  _owned_export(path, seed=1)
  assert os.listdir(tmp_path) == ["export"]  # No temp or backup dir left.
  assert export_dir_lib.read_marker(path)["owner"] == "run-a"
  np.testing.assert_allclose(_served(path), _reference(1), atol=1e-5)


@pytest.mark.parametrize("extra", ["stale.txt", "run/config.json",
                                   "variables/notes.txt"])
def test_an_own_export_holding_other_files_is_kept(tmp_path, extra):
  path = tmp_path / "export"
  _owned_export(path, seed=0)
  (path / extra).parent.mkdir(parents=True, exist_ok=True)
  (path / extra).write_text("not written by the export")
  before = _files(path)
  with pytest.raises(ValueError, match="entries the export did not write"):
    _owned_export(path, seed=1)
  assert _files(path) == before
  assert os.listdir(tmp_path) == ["export"]


@pytest.mark.parametrize("first_owner, second_owner", [
    ("run-a", "run-b"), ("run-a", None), (None, None), (None, "run-a")])
def test_an_export_of_another_owner_is_kept(tmp_path, first_owner,
                                            second_owner):
  path = tmp_path / "export"
  _owned_export(path, owner=first_owner)
  before = _files(path)
  with pytest.raises(ValueError, match="not an export of this run"):
    _owned_export(path, seed=1, owner=second_owner)
  assert _files(path) == before
  assert os.listdir(tmp_path) == ["export"]


def test_leftovers_of_a_killed_export_are_removed_only_if_ours(tmp_path):
  path = tmp_path / "export"
  _owned_export(path)
  ours = tmp_path / ".export.tmp-deadbeef"  # killed mid-write: marker first
  shutil.copytree(path, ours)
  (ours / "variables").rename(tmp_path / "scratch")
  empty = tmp_path / ".export.old-0badc0de"  # killed before anything
  empty.mkdir()
  theirs = tmp_path / ".export.tmp-feedface"  # same pattern, not ours
  theirs.mkdir()
  (theirs / "user.txt").write_text("keep")
  _owned_export(path, seed=1)
  assert sorted(os.listdir(tmp_path)) == [".export.tmp-feedface", "export",
                                          "scratch"]
  assert (theirs / "user.txt").read_text() == "keep"


def test_an_export_killed_while_writing_is_removed_by_the_next(tmp_path):
  # SIGKILL inside tf.saved_model.save: the temporary folder holds the
  # SavedModel's entries and the first marker, which lists only itself.
  path = tmp_path / "export"
  _owned_export(path)
  killed = tmp_path / ".export.tmp-0123abcd"
  shutil.copytree(path, killed)
  marker = json.loads((killed / export_dir_lib.MARKER).read_text())
  marker["files"] = [export_dir_lib.MARKER]
  (killed / export_dir_lib.MARKER).write_text(json.dumps(marker))
  other = tmp_path / ".export.tmp-4567cdef"  # the same, plus a user's file
  shutil.copytree(killed, other)
  (other / "user.txt").write_text("keep")
  _owned_export(path, seed=1)
  assert sorted(os.listdir(tmp_path)) == [".export.tmp-4567cdef", "export"]
  assert (other / "user.txt").read_text() == "keep"


def test_the_marker_is_in_the_temporary_folder_before_the_saved_model(
    tmp_path, monkeypatch):
  # What makes a killed write recognisable (the test above).
  path = tmp_path / "export"
  save, seen = tf.saved_model.save, []

  def save_after_looking(obj, directory, signatures=None):
    seen.append(export_dir_lib.read_marker(directory))
    save(obj, directory, signatures=signatures)

  monkeypatch.setattr(tf.saved_model, "save", save_after_looking)
  _owned_export(path)
  assert seen[0]["owner"] == "run-a"
  assert seen[0]["files"] == [export_dir_lib.MARKER]


def test_a_complete_export_left_aside_is_put_back_not_deleted(tmp_path):
  # Killed between the two moves of a replace: export/ is gone and the only
  # complete export is .export.old-*; the next export must not delete it.
  path = tmp_path / "export"
  _owned_export(path)
  before = (path / "saved_model.pb").read_bytes()
  aside = tmp_path / ".export.old-0123abcd"
  path.rename(aside)
  export_dir_lib.remove_stale(str(path), "run-a")
  assert sorted(os.listdir(tmp_path)) == ["export"]
  assert (path / "saved_model.pb").read_bytes() == before


def test_a_file_added_during_the_export_is_kept(tmp_path, monkeypatch):
  path = tmp_path / "export"
  _owned_export(path)
  save = tf.saved_model.save

  def save_then_user_writes(obj, export_dir, signatures=None):
    save(obj, export_dir, signatures=signatures)
    (path / "NOTES.txt").write_text("mine")  # after the ownership check

  monkeypatch.setattr(tf.saved_model, "save", save_then_user_writes)
  with pytest.raises(ValueError, match="changed during the export.*NOTES"):
    _owned_export(path, seed=1)
  assert (path / "NOTES.txt").read_text() == "mine"
  assert sorted(os.listdir(tmp_path)) == ["export"]


def test_replace_on_the_ram_filesystem(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  path = "ram://export_dir_test/a/export"
  _owned_export(path, owner="run-r")
  _owned_export(path, seed=1, owner="run-r")  # replace: copy, not rename
  assert sorted(tf.io.gfile.listdir("ram://export_dir_test/a")) == ["export"]
  assert export_dir_lib.read_marker(path)["owner"] == "run-r"
  np.testing.assert_allclose(_served(path), _reference(1), atol=1e-5)
  assert os.listdir(tmp_path) == []


def test_failed_overwrite_keeps_the_old_export(tmp_path, monkeypatch):
  path = tmp_path / "export"
  _owned_export(path)
  before = (path / "saved_model.pb").read_bytes()

  def failing_save(obj, export_dir, signatures=None):
    del obj, signatures
    with open(os.path.join(export_dir, "saved_model.pb"), "wb") as f:
      f.write(b"half")
    raise OSError("disk full")

  monkeypatch.setattr(tf.saved_model, "save", failing_save)
  with pytest.raises(OSError, match="disk full"):
    _owned_export(path)
  assert (path / "saved_model.pb").read_bytes() == before
  assert os.listdir(tmp_path) == ["export"]
