"""research.compare deletes only what it made, and refuses the rest in one line.

Each case sets up an out_dir (or report_dir) the way a user or another
process would leave it, runs the binary, and checks: exit 1, one `error:`
line naming the folder or file at fault, no traceback, and the whole tree
byte for byte unchanged. The binaries start together (each refuses before
training, so most of their time is importing TensorFlow). The library
tests below cover the remaining rules: the study marker, what a restart
deletes, incomplete stored results, --report_dir and strategy spellings.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.binaries import ROOT, tree_digest
from train.run_lock import RunLock
from research import study_lib
from research import study_owner
from research import study_report
from research import study_store

# Locks this process holds for a case, as a live train.train would.
HELD = []
FLAGS = ("--preset=synthetic_mlp", "--strategies=e2e", "--seeds=1",
         "--seed=0", "--train_steps=20", "--eval_points=2", "--noplots",
         "--cost_repeats=1")


def _write(path, text):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


def _user_run(run_dir):
  """What `train.train --model_dir=run_dir` leaves, plus the user's notes."""
  _write(os.path.join(run_dir, "config.json"), '{"strategy": "e2e"}')
  _write(os.path.join(run_dir, "run.json"), '{"run_id": "mine"}')
  _write(os.path.join(run_dir, "checkpoints", "checkpoint"),
         'model_checkpoint_path: "ckpt-10"\n')
  _write(os.path.join(run_dir, "checkpoints", "ckpt-10.index"), "weights")
  _write(os.path.join(run_dir, "NOTES.txt"), "my best run so far\n")


def _our_run(out_dir, owner="ours"):
  """An unfinished run folder made by compare for study `owner`."""
  owner = study_owner.claim(out_dir, None) if owner == "ours" else owner
  run_dir = os.path.join(out_dir, "e2e", "seed_0")
  study_owner.prepare(out_dir, run_dir, owner, "e2e", 0)
  _write(os.path.join(run_dir, "checkpoints", "ckpt-5.index"), "weights")
  return run_dir


def _hold(run_dir):
  """Takes run_dir's lock: this process is the live train.train."""
  lock = RunLock(os.path.join(run_dir, "lock.json"))
  lock.acquire()
  HELD.append(lock)


def _case_user_run(root):
  run_dir = os.path.join(root, "out", "e2e", "seed_0")
  _user_run(run_dir)
  return [], [run_dir, "did not make"]


def _case_user_run_in_use(root):
  run_dir = os.path.join(root, "out", "e2e", "seed_0")
  _user_run(run_dir)
  _hold(run_dir)
  return [], [run_dir, "did not make", f"in use by pid {os.getpid()}"]


def _case_other_study(root):
  out_dir = os.path.join(root, "out")
  study_owner.claim(out_dir, None)
  run_dir = _our_run(out_dir, owner="another-study")
  _write(os.path.join(run_dir, "NOTES.txt"), "from the other study\n")
  return [], [run_dir, "did not make"]


def _case_live_lock(root):
  run_dir = _our_run(os.path.join(root, "out"))
  _hold(run_dir)
  return [], [os.path.join(run_dir, "lock.json"), f"pid {os.getpid()}",
              "in use"]


def _case_empty_result(root):
  run_dir = _our_run(os.path.join(root, "out"))
  _write(os.path.join(run_dir, "result.json"), "{}")
  return [], [os.path.join(run_dir, "result.json"), "lacks settings"]


def _case_one_strategy_twice(root):
  os.makedirs(root, exist_ok=True)
  return ["--strategies=2wise,pairwise"], ["'2wise' and 'pairwise'",
                                           "strategies=2wise,pairwise"]


CASES = {name[len("_case_"):]: fn for name, fn in globals().items()
         if name.startswith("_case_")}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
  """{case: (proc, its stderr, expected words, tree before, after)}."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  started = {}
  for name, setup in CASES.items():
    root = str(tmp_path_factory.mktemp(name))
    flags, words = setup(root)
    before = tree_digest(root)
    proc = subprocess.Popen(
        [sys.executable, "-m", "research.compare", *FLAGS,
         f"--out_dir={os.path.join(root, 'out')}", *flags],
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    started[name] = (root, proc, words, before)
  done = {}
  for name, (root, proc, words, before) in started.items():
    _, stderr = proc.communicate(timeout=300)
    done[name] = (proc.returncode, stderr, words, before, tree_digest(root))
  for lock in HELD:
    lock.release()
  return done


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_compare_refuses_in_one_line_and_changes_nothing(refusals, case):
  returncode, stderr, words, before, after = refusals[case]
  lines = stderr.strip().splitlines()
  assert returncode == 1, stderr
  assert len(lines) == 1 and lines[0].startswith("error: "), stderr
  assert "Traceback" not in stderr
  for word in words:
    assert word in lines[0], (word, lines[0])
  assert after == before


def _study(out_dir):
  return study_lib.Study(
      preset="synthetic_mlp", overrides={"seed": "0"}, strategies=("e2e",),
      seeds=(0,), train_steps=20, eval_every_steps=10, metric="accuracy",
      num_modules=4, out_dir=out_dir)


def test_a_non_empty_out_dir_without_the_study_marker_is_refused(tmp_path):
  out_dir = str(tmp_path / "out")
  _write(os.path.join(out_dir, "report.md"), "my own report\n")
  before = tree_digest(tmp_path)
  with pytest.raises(ValueError, match=r"--out_dir=.*/out holds files that "
                     r"research.compare did not write \(no compare_study.json\)"):
    study_lib.check_study(_study(out_dir), repeats=1)
  assert tree_digest(tmp_path) == before
  # Empty, it is claimed; claimed, it stays this study's.
  empty = str(tmp_path / "empty")
  os.makedirs(empty)
  assert study_lib.check_study(_study(empty), repeats=1) is None
  owner = study_owner.claim(empty, None)
  assert study_lib.check_study(_study(empty), repeats=1) == owner
  assert study_owner.claim(empty, owner) == owner


def test_restart_empties_only_an_unfinished_run_of_this_study(tmp_path):
  out_dir = str(tmp_path / "out")
  run_dir = _our_run(out_dir)
  owner = study_owner.study_owner(out_dir)
  _write(os.path.join(run_dir, "train", "events.out.tfevents.1"), "x")
  assert study_owner.run_state(out_dir, run_dir, owner, "e2e", 0,
                               "result.json") == study_owner.UNFINISHED
  study_owner.prepare(out_dir, run_dir, owner, "e2e", 0)
  # What the killed run left is gone; the marker stays, no lock is left.
  assert os.listdir(run_dir) == [study_owner.RUN_MARKER]
  # The same folder is not this study's under another seed or study.
  for other in ((owner, "e2e", 1), ("another", "e2e", 0)):
    with pytest.raises(ValueError, match=f"{run_dir} holds a run that this "
                       "research.compare study did not make"):
      study_owner.run_state(out_dir, run_dir, other[0], *other[1:],
                            "result.json")
    with pytest.raises(ValueError, match="did not make"):
      study_owner.prepare(out_dir, run_dir, *other)
  assert os.listdir(run_dir) == [study_owner.RUN_MARKER]
  # A folder that appeared after the checks is left alone too.
  user = str(tmp_path / "out" / "local" / "seed_0")
  _user_run(user)
  before = tree_digest(user)
  with pytest.raises(ValueError, match="did not make"):
    study_owner.prepare(out_dir, user, owner, "local", 0)
  assert tree_digest(user) == before


def test_restart_refuses_a_run_of_this_study_holding_a_user_file(tmp_path):
  out_dir = str(tmp_path / "out")
  run_dir = _our_run(out_dir)
  owner = study_owner.study_owner(out_dir)
  _write(os.path.join(run_dir, "train", "events.out.tfevents.1"), "x")
  _write(os.path.join(run_dir, ".tmp-0123abcd-result.json"), "{")
  _write(os.path.join(run_dir, "NOTES.txt"), "why this run matters\n")
  before = tree_digest(run_dir)
  with pytest.raises(ValueError, match=r"holds files that neither "
                     r"train.train nor research.compare writes \(NOTES.txt\); "
                     "nothing was changed"):
    study_owner.prepare(out_dir, run_dir, owner, "e2e", 0)
  assert tree_digest(run_dir) == before
  # Without the user's file, what train.train and compare wrote goes.
  os.remove(os.path.join(run_dir, "NOTES.txt"))
  study_owner.prepare(out_dir, run_dir, owner, "e2e", 0)
  assert os.listdir(run_dir) == [study_owner.RUN_MARKER]


def test_a_fifo_in_a_study_is_one_line_not_a_hang(tmp_path):
  result = str(tmp_path / "result.json")
  os.mkfifo(result)
  with pytest.raises(ValueError, match=f"^{result} is a FIFO, not a regular "
                     "file: .*nothing was changed"):
    study_store.read(result, {}, study_store.RESULT_FIELDS)
  out_dir = str(tmp_path / "out")
  run_dir = _our_run(out_dir)
  owner = study_owner.study_owner(out_dir)
  os.mkfifo(os.path.join(run_dir, "lock.json"))
  listing = lambda: sorted(os.path.join(top, name) for top, dirs, files  # noqa
                           in os.walk(run_dir) for name in dirs + files)
  before = listing()
  with pytest.raises(ValueError, match="lock.json"):
    study_owner.prepare(out_dir, run_dir, owner, "e2e", 0)
  marker = os.path.join(run_dir, study_owner.RUN_MARKER)
  os.remove(marker)
  os.mkfifo(marker)
  with pytest.raises(ValueError, match="did not make"):
    study_owner.run_state(out_dir, run_dir, owner, "e2e", 0, "result.json")
  assert listing() == before  # nothing deleted, the FIFOs never opened


@pytest.mark.parametrize("text, problem", [
    ("{}", "lacks settings, seed, steps"),
    ("null", r"is not a readable JSON object \(not a JSON object\)"),
    ("[1]", r"is not a readable JSON object \(not a JSON object\)"),
    ('{"settings": ', r"is not a readable JSON object \(Expecting value"),
])
def test_a_stored_result_that_is_not_complete_is_one_line(tmp_path, text,
                                                          problem):
  path = str(tmp_path / "result.json")
  _write(path, text)
  with pytest.raises(ValueError, match=f"^{path} {problem}.*nothing was "
                     f"changed: delete it to redo that part. Received: "
                     f"file='{path}'$"):
    study_store.read(path, {}, study_store.RESULT_FIELDS,
                     study_store.result_problem)


def test_a_stored_result_needs_every_field_the_report_reads(tmp_path):
  path = str(tmp_path / "result.json")
  result = {"settings": {"a": 1}, "seed": 0, "steps": 20,
            "median_step_s": 0.1, "compile_s": 1.0, "training_s": 2.0,
            "eval_s": 0.5, "wall_s": 4.0,
            "eval": {"final": {"accuracy": 0.5}},
            "curve": [{"step": 20, "seconds": 2.0, "value": 0.5,
                       "eval_s": 0.5}]}
  for broken, problem in (
      ({"curve": None}, "lacks curve"), ({"seed": True}, "lacks seed"),
      ({"wall_s": "4"}, "lacks wall_s"),
      ({"curve": [{"step": 20}]}, "its curve needs points with step, "
       "seconds, value, eval_s"),
      ({"eval": {"final": 0.5}}, "its eval needs")):
    _write(path, json.dumps({**result, **broken}))
    with pytest.raises(ValueError, match=f"{path} {problem}"):
      study_store.read(path, {"a": 1}, study_store.RESULT_FIELDS,
                       study_store.result_problem)
  _write(path, json.dumps(result))
  assert study_store.read(path, {"a": 1}, study_store.RESULT_FIELDS,
                          study_store.result_problem) == result
  with pytest.raises(ValueError, match="comes from other settings"):
    study_store.read(path, {"a": 2}, study_store.RESULT_FIELDS)


def test_report_dir_outputs_are_replaced_only_over_a_compare_report(
    tmp_path):
  report_dir = str(tmp_path / "docs")
  study_report.check_report_dir(report_dir, plots=True)  # new: fine
  _write(os.path.join(report_dir, "reading.md"), "our reading\n")
  study_report.check_report_dir(report_dir, plots=True)  # never written
  _write(os.path.join(report_dir, "metric_vs_steps.png"), "my plot")
  with pytest.raises(ValueError, match=r"--report_dir=.* holds "
                     r".*metric_vs_steps.png, which is not an output of "
                     r"research.compare"):
    study_report.check_report_dir(report_dir, plots=True)
  study_report.check_report_dir(report_dir, plots=False)  # not written
  _write(os.path.join(report_dir, "results.json"), json.dumps(
      {"command": "python -m research.compare --out_dir=x",
       "strategies": {"e2e": {}}}))
  study_report.check_report_dir(report_dir, plots=True)
  # A report of the same binary from before the research tools left train/.
  _write(os.path.join(report_dir, "results.json"), json.dumps(
      {"command": "python -m train.compare --out_dir=x",
       "strategies": {"e2e": {}}}))
  study_report.check_report_dir(report_dir, plots=True)
  _write(os.path.join(report_dir, "results.json"), json.dumps(
      {"command": "python -m train.train --out_dir=x",
       "strategies": {"e2e": {}}}))
  with pytest.raises(ValueError, match="results.json, which is not an "
                     "output of research.compare"):
    study_report.check_report_dir(report_dir, plots=True)


def test_each_strategy_once_whatever_its_spelling():
  assert study_lib.strategy_names(
      ["E2E", "pairwise", "2wise-sum", "local", "3wise"], 4) == [
          "e2e", "2wise", "2wise-sum", "local", "3wise"]
  for spellings, pair in ((["2wise", "2wise-only"], "'2wise' and "
                           "'2wise-only'"),
                          (["local", "local-sum"], "'local' and 'local-sum'"),
                          (["e2e", "4wise-sum"], "'e2e' and '4wise-sum'"),
                          (["3wise", "3wise-sum"], "'3wise' and '3wise-sum'")):
    k = 3 if spellings[0] == "3wise" else 4
    with pytest.raises(ValueError, match=f"names one strategy twice: {pair} "
                       f"train the same way with num_modules={k}"):
      study_lib.strategy_names(spellings, k)
  with pytest.raises(ValueError, match=r"^--strategies: strategy must be .* "
                     r"Received: strategies=e2e,2-wise$"):
    study_lib.strategy_names(["e2e", "2-wise"], 4)
  with pytest.raises(ValueError, match="at least one"):
    study_lib.strategy_names([], 4)
