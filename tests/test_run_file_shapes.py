"""Files we read back, paths that must outlive the process, exports of
another run and list flags with an empty entry: each refused in one line,
through the binaries' main or the public API, with nothing changed.

The hostile shapes are JSON nested deeper than Python's recursion (which
ended in a RecursionError traceback) and JSON that is not the object a run
file holds.
"""

import json
import os
import shutil

import pytest

from research import study_owner
from research import study_store
from tests import refusals
from tests.binaries import run_main, tree_digest
from train import export_dir as export_dir_lib
from train import owned_dir
from train.data import text as text_lib

# Every run file we read, made hostile, through the binaries' mains:
# make test-slow (and CI) runs them.
pytestmark = pytest.mark.slow

DEEP = "[" * 100000 + "]" * 100000
DEEP_OBJECT = '{"a": ' * 5000 + "1" + "}" * 5000
HOSTILE = {"deep": DEEP, "deep_object": DEEP_OBJECT, "list": "[1, 2]",
           "string": '"run"'}


def _copy(synthetic_run, tmp_path):
  run = str(tmp_path / "run")
  shutil.copytree(synthetic_run, run)
  return run


def _errors(err):
  return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_shared_reader_refuses_hostile_json_in_one_line(tmp_path, text):
  path = tmp_path / "f.json"
  path.write_text(text)
  with pytest.raises(ValueError) as e:
    owned_dir.load_json(str(path), received="file='f.json'")
  line = str(e.value)
  assert "\n" not in line and line.startswith(f"{path} is not a readable "
                                              "JSON object"), line
  # Markers and locks read as "not ours" (the caller decides), no error.
  assert owned_dir.read_json(str(path)) == {}


def test_the_shared_reader_checks_nesting_and_fields(tmp_path):
  path = tmp_path / "f.json"
  limit = owned_dir.MAX_JSON_DEPTH
  path.write_text('{"a": ' * (limit - 1) + "1" + "}" * (limit - 1))
  assert owned_dir.load_json(str(path))  # as deep as allowed
  path.write_text('{"a": ' * (limit + 1) + "1" + "}" * (limit + 1))
  with pytest.raises(ValueError, match=f"nested deeper than {limit} levels"):
    owned_dir.load_json(str(path))
  path.write_text('{"run_id": 5, "on": true}')
  with pytest.raises(ValueError, match="its 'run_id' is '5', not str"):
    owned_dir.load_json(str(path), {"run_id": str})
  with pytest.raises(ValueError, match="its 'on' is 'True', not int"):
    owned_dir.load_json(str(path), {"on": int})
  assert owned_dir.load_json(str(path), {"on": bool, "run_id": int})


@pytest.mark.parametrize("name", ["config.json", "run.json"])
@pytest.mark.parametrize("kind", ["deep", "deep_object", "list"])
def test_train_resume_with_a_hostile_run_file_is_one_line(
    synthetic_run, tmp_path, capfd, name, kind):
  run = _copy(synthetic_run, tmp_path)
  with open(os.path.join(run, name), "w", encoding="utf-8") as f:
    f.write(HOSTILE[kind])
  before = tree_digest(run)
  code, _, err = run_main("train.train", [
      "--preset=synthetic_mlp", "--train_steps=20", f"--model_dir={run}"],
                          capfd)
  assert code == 1 and "Traceback" not in err, err
  assert _errors(err) == [_errors(err)[0]] and (
      os.path.join(run, name) in _errors(err)[0]), err
  assert tree_digest(run) == before


@pytest.mark.parametrize("kind", ["deep", "list"])
def test_evaluate_names_a_hostile_config_json(synthetic_run, tmp_path, capfd,
                                              kind):
  run = _copy(synthetic_run, tmp_path)
  config = os.path.join(run, "config.json")
  with open(config, "w", encoding="utf-8") as f:
    f.write(HOSTILE[kind])
  before = tree_digest(run)
  code, _, err = run_main("train.evaluate", [f"--model_dir={run}"], capfd)
  assert code == 1 and "Traceback" not in err, err
  assert len(_errors(err)) == 1 and config in err, err
  assert tree_digest(run) == before


def test_export_refuses_hostile_config_and_in_memory_export_dir(
    synthetic_run, tmp_path):
  """train.export (its own process: it defines --model_dir as train.train
  does), each command line through its main and error boundary."""
  runs = {}
  for kind in ("deep", "list", None):
    runs[kind] = _copy(synthetic_run, tmp_path / str(kind))
    if kind:
      with open(os.path.join(runs[kind], "config.json"), "w",
                encoding="utf-8") as f:
        f.write(HOSTILE[kind])
  before = {kind: tree_digest(run) for kind, run in runs.items()}
  results = refusals.run("train.export", [
      [f"--model_dir={runs['deep']}"], [f"--model_dir={runs['list']}"],
      [f"--model_dir={runs[None]}", "--export_dir=ram://exp"]])
  for result, kind in zip(results, ("deep", "list", None)):
    errors = _errors(result["stderr"])
    assert result["code"] == 1 and len(errors) == 1, result
    assert "Traceback" not in result["stderr"], result
    assert (f"{runs[kind]}/config.json is not a readable JSON object" if kind
            else "--export_dir=ram://exp is in this process's memory"
            ) in errors[0], errors
  assert {kind: tree_digest(run) for kind, run in runs.items()} == before


def test_a_history_that_is_not_a_list_is_one_line(synthetic_run, tmp_path,
                                                  capfd):
  run = _copy(synthetic_run, tmp_path)
  path = os.path.join(run, "config.json")
  with open(path, encoding="utf-8") as f:
    fields = json.load(f)
  fields["history"] = 5  # list(5) was a TypeError traceback
  with open(path, "w", encoding="utf-8") as f:
    json.dump(fields, f)
  code, _, err = run_main("train.train", [
      "--preset=synthetic_mlp", "--train_steps=20", f"--model_dir={run}"],
                          capfd)
  assert code == 1 and _errors(err) == [
      f"error: {path} has history='5', which must be a list of objects; "
      f"nothing was changed: repair or move it. Received: "
      f"model_dir={run!r}"], err


@pytest.mark.parametrize("kind", ["deep", "list"])
def test_a_hostile_lock_or_export_marker_is_no_traceback(
    synthetic_run, tmp_path, capfd, kind):
  """An unreadable lock.json is one line (its holder is unknown:
  --break_lock decides); so is a damaged interlock_export.json, which
  train.evaluate names (issue 46: it was taken as no record, and the
  evaluation's errors then spoke of feature shapes)."""
  run = _copy(synthetic_run, tmp_path)
  lock = os.path.join(run, "lock.json")
  with open(lock, "w", encoding="utf-8") as f:
    f.write(HOSTILE[kind])
  code, _, err = run_main("train.train", [
      "--preset=synthetic_mlp", "--train_steps=20", f"--model_dir={run}"],
                          capfd)
  assert code == 1 and "Traceback" not in err and _errors(err) == [
      f"error: {lock} is unreadable; if no run is using this model_dir, pass "
      f"--break_lock=true. Received: lock={lock!r}"], err
  marker = os.path.join(run, "export", export_dir_lib.MARKER)
  with open(marker, "w", encoding="utf-8") as f:
    f.write(HOSTILE[kind])
  assert export_dir_lib.read_marker(os.path.join(run, "export")) is None
  code, _, err = run_main("train.evaluate", [
      f"--saved_model={run}/export", "--preset=synthetic_mlp"], capfd)
  errors = _errors(err)
  assert code == 1 and "Traceback" not in err and len(errors) == 1, err
  assert f"{marker} is not a readable JSON object" in errors[0], errors


@pytest.mark.parametrize("kind", ["deep", "string"])
def test_research_files_are_read_by_the_shared_reader(tmp_path, kind):
  out_dir = tmp_path / "c"
  out_dir.mkdir()
  (out_dir / study_owner.STUDY_MARKER).write_text(HOSTILE[kind])
  with pytest.raises(ValueError, match="is not a research.compare marker"):
    study_owner.study_owner(str(out_dir))
  result = tmp_path / "result.json"
  result.write_text(HOSTILE[kind])
  with pytest.raises(ValueError) as e:
    study_store.read(str(result), {}, study_store.RESULT_FIELDS)
  assert str(e.value).startswith(f"{result} is not a readable JSON object")


def test_a_hostile_cached_vocabulary_is_one_line_naming_it(tmp_path):
  corpus_dir = tmp_path / "corpus"
  corpus_dir.mkdir()
  (corpus_dir / "a.txt").write_text("\n%\n".join(
      f"the quick fox {i}" for i in range(50)))
  corpus = text_lib.TextCorpus(paths=(str(corpus_dir),), val_fraction=0.2)
  cache = tmp_path / "cache"
  vocab = text_lib.get_vocabulary(corpus, kind="char", vocab_size=64,
                                  cache_dir=str(cache))
  with open(vocab.path, "w", encoding="utf-8") as f:
    f.write(DEEP)
  with pytest.raises(ValueError) as e:
    text_lib.get_vocabulary(corpus, kind="char", vocab_size=64,
                            cache_dir=str(cache))
  assert str(e.value).startswith(f"The cached vocabulary {vocab.path} is not "
                                 "a readable JSON object"), e.value


@pytest.mark.parametrize("flags", [
    ["--model_dir=ram://run"],
    ["--model_dir=WORK/run", "--export_dir=ram://exp"]])
def test_train_refuses_in_memory_folders_before_training(tmp_path, capfd,
                                                         flags):
  flags = [f.replace("WORK", str(tmp_path)) for f in flags]
  code, out, err = run_main("train.train", [
      "--preset=synthetic_mlp", "--train_steps=10", *flags], capfd)
  name = flags[-1].split("=")[0]
  assert code == 1 and _errors(err) == [
      f"error: {flags[-1]} is in this process's memory, which is lost when "
      f"the binary exits: nothing was written; use a local folder or a "
      f"lasting file system such as gs://. Received: "
      f"{name[2:]}={flags[-1].split('=', 1)[1]!r}"], err
  assert not out and os.listdir(tmp_path) == []


def test_an_export_of_another_run_is_refused_in_one_line(
    synthetic_run, tmp_path, capfd):
  """Run B's export (its marker records B's config: another K) evaluated
  with run A's --model_dir."""
  run = _copy(synthetic_run, tmp_path)
  other = str(tmp_path / "b" / "export")
  shutil.copytree(os.path.join(run, "export"), other)
  marker = os.path.join(other, export_dir_lib.MARKER)
  with open(marker, encoding="utf-8") as f:
    record = json.load(f)
  assert record["step"] == 10 and record["model_dir"] == synthetic_run
  record["config"]["num_modules"] = 2
  record["config"]["split"] = None
  record["model_dir"] = str(tmp_path / "b")
  with open(marker, "w", encoding="utf-8") as f:
    json.dump(record, f)
  code, out, err = run_main("train.evaluate", [
      f"--model_dir={run}", f"--saved_model={other}"], capfd)
  assert code == 1 and not out and _errors(err) == [
      f"error: --saved_model={other} was exported from the run "
      f"{tmp_path / 'b'} with num_modules=2, but --model_dir={run} has "
      f"num_modules=4: evaluate it with its own run's --model_dir, or with "
      f"--saved_model alone. Received: saved_model={other!r}"], err
  # Its own export, named explicitly, is evaluated.
  code, out, err = run_main("train.evaluate", [
      f"--model_dir={run}", f"--saved_model={run}/export"], capfd)
  assert code == 0 and json.loads(out.splitlines()[-1]), err


@pytest.mark.parametrize("flag", ["--split=1,,1,1,1", "--split=1,1,1,1,",
                                  "--lr_decay_fractions=0.5,,0.75"])
def test_a_config_list_flag_with_an_empty_entry_is_refused(tmp_path, capfd,
                                                           flag):
  code, _, err = run_main("train.train", [
      "--preset=synthetic_mlp", flag, f"--model_dir={tmp_path}/run"], capfd)
  name, text = flag[2:].split("=")
  assert code == 1 and _errors(err) == [
      f"error: --{name}={text!r} has an empty entry: give one value between "
      f"each two commas. Received: {name}={text!r}"], err
  assert not os.path.exists(tmp_path / "run")
