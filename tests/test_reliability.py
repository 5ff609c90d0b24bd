"""Faults through the real binaries: bad flags, preemption, NaNs, corrupt
checkpoints, broken exports, truncated data, and the data-safety refusals
(export targets, checkpoint pointers, the run lock, bad paths).

A refusal case builds a directory tree, runs one binary that must refuse,
and checks: exit code 1, exactly one "error:" line holding the expected
words (the flag or file at fault), no traceback, and every file of the tree
byte for byte unchanged (nothing added, nothing removed).

A fault that is not about the process itself (a NaN, a corrupt checkpoint,
a broken export, truncated data) runs through the binary's own main and
error boundary in this process (`tests.binaries.run_main`): the same
lines and exit codes, without seconds of process start; signals and kills need real processes."""

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests import hold
from tests.binaries import ROOT, run_binary, run_main, tree_digest
from train import config as config_lib
from train import flags_lib

SYNTH = ["--preset=synthetic_mlp", "--steps_per_loop=5",
         "--checkpoint_every_steps=10", "--eval_every_steps=10"]

# (flags, words the one-line error must contain)
BAD_INPUTS = [
    (["--strategy=0wise"], ["--strategy='0wise'"]),
    (["--strategy=2wise", "--variant=mean"], ["--variant='mean'", "only"]),
    (["--strategy=2wise-sum", "--variant=only"],
     ["--strategy='2wise-sum'", "names variant 'sum'"]),
    (["--num_modules=0"], ["--num_modules=0"]),
    (["--preset=fashion_mnist_resnet", "--num_modules=10"],
     ["--num_modules=10", "9 blocks"]),
    (["--preset=fashion_mnist_resnet", "--split=2,2,2,2"],
     ["--split='2,2,2,2'", "adding up to the 9 blocks"]),
    (["--placement=gpu"], ["--placement='gpu'", "4 modules but 0"]),
    (["--batch_size=30", "--num_microbatches=4"],
     ["--batch_size=30", "4 microbatches"]),
    (["--preset=nope"], ["--preset=nope"]),
    (["--dataset=mnist"], ["--dataset='mnist'", "cifar10"]),
    (["--model=vgg"], ["--model='vgg'"]),
    (["--time_budget_s=0"], ["--time_budget_s=0.0", "> 0"]),
    (["--data_dir=/nonexistent/dir"], ["--data_dir='/nonexistent/dir'"]),
    (["--learning_rate=abc"], ["--learning_rate='abc'", "float"]),
    (["--model=transformer"], ["--dataset='synthetic'", "text dataset"]),
]


@pytest.fixture
def trained(synthetic_run):
  """A 10-step run of SYNTH (ckpt-10, its export; conftest.py's, shared
  by the files that need one); tests copy it."""
  return synthetic_run


def _copy(trained_dir, tmp_path):
  model_dir = str(tmp_path / "run")
  shutil.copytree(trained_dir, model_dir)
  return model_dir


def _start(module, *flags):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  return subprocess.Popen([sys.executable, "-m", module, *flags], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_bad_inputs_fail_cleanly_and_write_nothing(tmp_path):
  runs = []
  for i, (flags, words) in enumerate(BAD_INPUTS):
    model_dir = tmp_path / f"case{i}"
    runs.append((flags, words, model_dir, _start(
        "train.train", *SYNTH, f"--model_dir={model_dir}", *flags)))
  for flags, words, model_dir, proc in runs:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0, flags
    lines = [line for line in err.splitlines() if words[0] in line]
    assert lines, (flags, err)
    for word in words:
      assert word in lines[0], (flags, lines[0])
    assert not model_dir.exists(), flags


def _case_other_architecture(trained, tmp_path):
  model_dir = _copy(trained, tmp_path)
  return [*SYNTH, f"--model_dir={model_dir}", "--train_steps=10",
          "--mlp_width=64"], (model_dir, sorted(os.listdir(model_dir)))


def _case_corrupt_checkpoint(trained, tmp_path):
  model_dir = _copy(trained, tmp_path)
  ckpt_dir = os.path.join(model_dir, "checkpoints")
  data = [f for f in os.listdir(ckpt_dir) if f.startswith("ckpt-10.data")][0]
  path = os.path.join(ckpt_dir, data)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)
  snapshot = {f: os.path.getsize(os.path.join(ckpt_dir, f))
              for f in os.listdir(ckpt_dir)}
  return [*SYNTH, f"--model_dir={model_dir}", "--train_steps=20"], (
      ckpt_dir, snapshot)


def _case_truncated_data(unused_trained, tmp_path):
  source = tmp_path / "idx"
  source.mkdir()
  # A labels file whose header promises 100 labels but holds 10.
  header = np.array([0x00000801, 100], dtype=">u4").tobytes()
  (source / "train-labels-idx1-ubyte").write_bytes(header + bytes(10))
  images = np.array([0x00000803, 100, 28, 28], dtype=">u4").tobytes()
  (source / "train-images-idx3-ubyte").write_bytes(images + bytes(784 * 100))
  for stem in ("t10k-labels-idx1-ubyte", "t10k-images-idx3-ubyte"):
    shutil.copy(source / stem.replace("t10k", "train"), source / stem)
  return ["--preset=fashion_mnist_resnet", f"--source_dir={source}",
          f"--data_dir={tmp_path}/tfds", f"--model_dir={tmp_path}/run",
          "--placement=single"], tmp_path


REFUSED = {name[len("_case_"):]: fn for name, fn in globals().items()
           if name.startswith("_case_")}


def _refused(name, trained, tmp_path, capfd):
  """(train.train's {"code", "stderr"}, what the _case_ function returned)
  for the refusal `name` of REFUSED, through train.train's main and error
  boundary in this process (`tests.binaries.run_main`)."""
  flags, kept = REFUSED[name](trained, tmp_path)
  code, _, err = run_main("train.train", flags, capfd)
  return {"code": code, "stderr": err}, kept


def test_other_architecture_in_model_dir_is_refused(trained, tmp_path, capfd):
  result, (model_dir, before) = _refused("other_architecture", trained,
                                         tmp_path, capfd)
  assert result["code"] != 0
  assert "mlp_width=256" in result["stderr"]
  assert "mlp_width=64" in result["stderr"]
  assert sorted(os.listdir(model_dir)) == before


def _final_weights(model_dir):
  reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints"))
  # Every saved variable (weights may sit under an optimizer's path: a
  # checkpoint stores each variable once, under its shortest path).
  names = sorted(n for n in reader.get_variable_to_shape_map()
                 if "VARIABLE_VALUE" in n and not n.startswith("save_counter"))
  return {n: reader.get_tensor(n) for n in names}


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
  flags = SYNTH + ["--train_steps=40", "--deterministic=true", "--seed=3"]
  straight = str(tmp_path / "straight")
  killed = str(tmp_path / "killed")
  run_binary("train.train", *flags, f"--model_dir={straight}")
  # Killed at step 15, held there (tests.hold): after ckpt-10, before 20.
  ready = str(tmp_path / "held")
  proc = _start("tests.hold", ready, "train.actions.Progress.after_loop", "3",
                "train.train", *flags, f"--model_dir={killed}")
  hold.wait_until_held(ready, proc)
  proc.send_signal(signal.SIGKILL)
  out, _ = proc.communicate(timeout=60)
  assert proc.returncode == -signal.SIGKILL
  assert out.splitlines()[-1].startswith("step 15/40"), out
  # The killed run's lock names a dead process on this host: taken over.
  assert os.path.exists(os.path.join(killed, "lock.json"))
  resumed = run_binary("train.train", *flags, f"--model_dir={killed}")
  assert "at step 10" in resumed.stdout
  assert "warning: taking over" in resumed.stderr
  assert not os.path.exists(os.path.join(killed, "lock.json"))
  a, b = _final_weights(straight), _final_weights(killed)
  assert a.keys() == b.keys() and len(a) >= 40
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
def test_sigterm_and_sigint_save_a_checkpoint(tmp_path):
  procs = {}
  for signum in (signal.SIGTERM, signal.SIGINT):
    model_dir = str(tmp_path / signum.name)
    procs[signum] = model_dir, _start(
        "train.train", *SYNTH, "--train_steps=100000",
        "--checkpoint_every_steps=100000", f"--model_dir={model_dir}")
  for signum, (model_dir, proc) in procs.items():
    for line in proc.stdout:
      if line.startswith("step 25/"):
        proc.send_signal(signum)
        break
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and f"{signum.name} at step" in lines[0], err
    step = int(err.split(f"{signum.name} at step ")[1].split(":")[0])
    assert step >= 25
    latest = tf.train.latest_checkpoint(os.path.join(model_dir,
                                                     "checkpoints"))
    assert latest.endswith(f"ckpt-{step}")
    assert not os.path.exists(os.path.join(model_dir, "lock.json"))


def test_nan_stops_and_keeps_last_good_checkpoint(trained, tmp_path, capfd):
  model_dir = _copy(trained, tmp_path)
  good = _final_weights(model_dir)
  code, _, err = run_main("train.train", [
      *SYNTH, f"--model_dir={model_dir}", "--train_steps=30",
      "--learning_rate=1e30"], capfd)
  assert code != 0
  assert "non-finite" in err and "module_" in err
  assert "at steps 1" in err  # steps 11..15 or later
  latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  assert latest.endswith("ckpt-10")
  for name, value in _final_weights(model_dir).items():
    np.testing.assert_array_equal(value, good[name])
  code, out, err = run_main("train.train", [
      *SYNTH, f"--model_dir={model_dir}", "--train_steps=30",
      "--learning_rate=1e30", "--on_nan=skip"], capfd)
  assert out.count("skipped: rolled back to") == 3
  assert code != 0 and "non-finite" in err


def test_corrupt_checkpoint_is_reported_and_kept(trained, tmp_path, capfd):
  result, (ckpt_dir, snapshot) = _refused("corrupt_checkpoint", trained,
                                          tmp_path, capfd)
  assert result["code"] != 0
  err = result["stderr"]
  assert "cannot restore checkpoint" in err and "ckpt-10" in err
  assert "it is corrupt" in err and "Traceback" not in err
  assert {f: os.path.getsize(os.path.join(ckpt_dir, f))
          for f in os.listdir(ckpt_dir)} == snapshot


def test_broken_export_is_reported(trained, tmp_path, capfd):
  broken = tmp_path / "broken"
  shutil.copytree(os.path.join(trained, "export"), broken)
  shutil.rmtree(broken / "variables")
  code, _, err = run_main("train.evaluate", [f"--saved_model={broken}",
                                             "--preset=synthetic_mlp"], capfd)
  assert code != 0
  last = err.strip().splitlines()[-1]
  assert "variables" in last and str(broken) in last


def test_truncated_data_file_is_reported(trained, tmp_path, capfd):
  result, _ = _refused("truncated_data", trained, tmp_path, capfd)
  assert result["code"] != 0
  last = result["stderr"].strip().splitlines()[-1]
  assert "train-labels-idx1-ubyte" in last
  assert not (tmp_path / "run").exists()


def test_flag_types_parse():
  fields = {f.name: f for f in config_lib.flat_fields()}
  parse = flags_lib._parse  # pylint: disable=protected-access
  assert parse(fields["lr_decay_fractions"], "0.3,0.6") == (0.3, 0.6)
  assert parse(fields["split"], "2,3,4") == (2, 3, 4)
  assert parse(fields["split"], "none") is None
  assert parse(fields["train_steps"], "12") == 12
  assert parse(fields["deterministic"], "true") is True
  assert parse(fields["time_budget_s"], "1.5") == 1.5
  with pytest.raises(ValueError, match="Received: deterministic='yes'"):
    parse(fields["deterministic"], "yes")


PARALLEL = 4


_tree = tree_digest


def _user_dir(case):
  os.makedirs(case / "user")
  (case / "user" / "notes.txt").write_text("mine")
  return case / "user"


def _write(path, data):
  path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _ckpt_data(run):
  return next((run / "checkpoints").glob("ckpt-10.data-*"))


def _lock(run):
  now = time.time()
  (run / "lock.json").write_text(json.dumps({
      "host": socket.gethostname(), "pid": os.getpid(), "started": now,
      "updated": now, "token": "test"}))


# (name, binary, setup(case, run) -> None, flags(case, run), words).
# `run` is a copy of a trained 10-step run inside `case`.
CASES = [
    ("export_dir holds user files", "train.train",
     lambda c, r: _user_dir(c), lambda c, r: [f"--export_dir={c}/user"],
     ["--export_dir=", "/user", "not an export of this run"]),
    ("export_dir is model_dir", "train.train", None,
     lambda c, r: [f"--export_dir={r}"],
     ["--export_dir=", "would replace the run directory"]),
    ("export_dir above model_dir", "train.train", None,
     lambda c, r: [f"--export_dir={c}"],
     ["--export_dir=", "would replace the run directory"]),
    ("export_dir in checkpoints", "train.train", None,
     lambda c, r: [f"--export_dir={r}/checkpoints/export"],
     ["--export_dir=", "lies in the run's checkpoints"]),
    ("export_dir under a file", "train.train",
     lambda c, r: _user_dir(c),
     lambda c, r: [f"--export_dir={c}/user/notes.txt/export"],
     ["--export_dir=", "lies under the file", "notes.txt"]),
    ("model_dir/export holds user files", "train.train",
     lambda c, r: (shutil.rmtree(r / "export"), _user_dir(r),
                   os.rename(r / "user", r / "export")), lambda c, r: [],
     ["--export_dir=", "/run/export", "not an export of this run"]),
    ("train.export onto model_dir", "train.export", None,
     lambda c, r: [f"--export_dir={r}"],
     ["--export_dir=", "would replace the run directory"]),
    ("train.export onto a file", "train.export",
     lambda c, r: _user_dir(c),
     lambda c, r: [f"--export_dir={c}/user/notes.txt"],
     ["--export_dir=", "notes.txt is a file"]),
    ("pointer holds text garbage", "train.train",
     lambda c, r: _write(r / "checkpoints" / "checkpoint", "garbage"),
     lambda c, r: [], ["checkpoints/checkpoint is unreadable",
                       "--resume_from=ckpt-10"]),
    ("pointer holds binary garbage", "train.train",
     lambda c, r: _write(r / "checkpoints" / "checkpoint", b"\xff\xfe\x00"),
     lambda c, r: [], ["checkpoints/checkpoint is unreadable",
                       "--resume_from=ckpt-10"]),
    ("pointer deleted", "train.train",
     lambda c, r: os.remove(r / "checkpoints" / "checkpoint"),
     lambda c, r: [], ["checkpoints/checkpoint is missing",
                       "--resume_from=ckpt-10"]),
    ("resume_from names no checkpoint", "train.train", None,
     lambda c, r: ["--resume_from=ckpt-99"],
     ["--resume_from=ckpt-99", "no checkpoint ckpt-99 in",
      "the run has: ckpt-10."]),
    ("train.export with a bad pointer", "train.export",
     lambda c, r: _write(r / "checkpoints" / "checkpoint", "garbage"),
     lambda c, r: [], ["checkpoints/checkpoint is unreadable",
                       "--checkpoint=ckpt-10"]),
    ("another run holds the lock", "train.train", lambda c, r: _lock(r),
     lambda c, r: [], [f"in use by pid {os.getpid()}", "lock.json",
                       "--break_lock=true"]),
    ("model_dir is a file", "train.train",
     lambda c, r: _user_dir(c), lambda c, r: [
         f"--model_dir={c}/user/notes.txt"],
     ["--model_dir=", "notes.txt is a file"]),
    ("model_dir under a file", "train.train",
     lambda c, r: _user_dir(c), lambda c, r: [
         f"--model_dir={c}/user/notes.txt/run"],
     ["--model_dir=", "lies under the file", "notes.txt"]),
    ("checkpoints is a file", "train.train",
     lambda c, r: (shutil.rmtree(r / "checkpoints"),
                   _write(r / "checkpoints", "x")), lambda c, r: [],
     ["checkpoints should be a directory"]),
    ("resume with another batch size", "train.train", None,
     lambda c, r: ["--batch_size=16"],
     ["batch_size=32", "--batch_size=32", "Received: batch_size=16"]),
    ("garbage config.json", "train.train",
     lambda c, r: _write(r / "config.json", "{not json"), lambda c, r: [],
     ["config.json is not a readable JSON object"]),
    ("train.export from a truncated checkpoint", "train.export",
     lambda c, r: _truncate(_ckpt_data(r)), lambda c, r: [],
     ["cannot restore checkpoint", "ckpt-10"]),
    ("evaluate: variables data truncated", "train.evaluate",
     lambda c, r: _truncate(next((r / "export" / "variables").glob(
         "variables.data-*"))), lambda c, r: [f"--saved_model={r}/export"],
     ["damaged or truncated", "/run/export"]),
    ("evaluate: variables data missing", "train.evaluate",
     lambda c, r: os.remove(next((r / "export" / "variables").glob(
         "variables.data-*"))), lambda c, r: [f"--model_dir={r}"],
     ["missing variables/variables.data-*", "/run/export"]),
]


@pytest.mark.slow
def test_refusals_change_nothing(trained, tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  started = []
  for i, (name, binary, setup, flags, words) in enumerate(CASES):
    case = tmp_path / f"case{i}"
    run = case / "run"
    shutil.copytree(trained, run)
    if setup:
      setup(case, run)
    before = _tree(case)
    args = flags(case, run)
    if binary == "train.train":
      args = SYNTH + ["--train_steps=20"] + (
          [] if any(a.startswith("--model_dir") for a in args) else
          [f"--model_dir={run}"]) + args
    elif not any(a.startswith(("--model_dir", "--saved_model"))
                 for a in args) or binary == "train.export":
      args = [f"--model_dir={run}"] + args
    if len(started) >= PARALLEL:  # a few TF processes at a time
      started[-PARALLEL][-1].wait(timeout=300)
    started.append((name, words, case, before, subprocess.Popen(
        [sys.executable, "-m", binary, *args], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
  for name, words, case, before, proc in started:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, (name, err)
    assert "Traceback" not in err, (name, err)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, (name, err)
    for word in words:
      assert word in errors[0], (name, word, errors[0])
    assert _tree(case) == before, name
