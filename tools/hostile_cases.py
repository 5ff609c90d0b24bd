"""The hostile sweep's cases (tools/hostile_sweep.py runs and judges them).

A case is one row of data: the binary, its flags (WORK is the case's own
folder, TRAINED a finished run's copy source, IMPOSTOR0/1 ports that accept
and never answer, PEERS a live 2-worker cluster on 127.0.0.1), what it
must do, and where it may be held (`tests.hold`) so that a signal lands in
a known phase. The setups here build hostile folders, mounts and processes.
"""

import os
import shutil
import signal
import subprocess

TERM, INT, KILL = signal.SIGTERM, signal.SIGINT, signal.SIGKILL
STOP = signal.SIGSTOP
TT = ["--preset=synthetic_mlp", "--train_steps=20", "--steps_per_loop=10",
      "--checkpoint_every_steps=10"]
# The resumable run: interrupted anywhere, resumed, it must end equal to
# the uninterrupted run of the same flags (tools/hostile_sweep.REFERENCE).
RESUME = ["--preset=synthetic_mlp", "--train_steps=60", "--steps_per_loop=10",
          "--checkpoint_every_steps=20", "--eval_every_steps=30",
          "--model_dir=WORK/run"]
RESUME_STEP = 60
LONG = ["--preset=synthetic_mlp", "--train_steps=100000",
        "--steps_per_loop=10", "--checkpoint_every_steps=10",
        "--eval_every_steps=100000"]
CLUSTER = TT + ["--num_modules=2", "--placement=cluster"]


class Case:
  """One row. `expect`: refuse (exit 1, one line, `absent` not created,
  `keep` unchanged), ok (exit 0), either (ok or a one-line refusal), stop
  (gone within `stop_within` s of `act` with one line), killed (SIGKILL;
  judged by its resume), api (a `python -c` snippet: exit 1 with one
  ValueError/TypeError line that says 'Received:', or exit 0 where
  `api_ok`). `hold` = (target, n) runs the binary through tests.hold; `act`
  then runs at the hold (or `signal_after` s): ("sig", signum) to the
  binary, ("worker", i, signum), ("go",). `resume`: flags of a rerun that
  must exit 0 with its latest checkpoint at `RESUME_STEP`, equal to the
  uninterrupted run's where `reference`."""

  def __init__(self, name, module, args, expect="refuse", env=None,
               setup=None, absent=None, keep=None, hold=None, act=(),
               signal_after=None, stop_within=5.0, resume=None,
               reference=False, limit_s=240, api_ok=False):
    self.name, self.module, self.args, self.expect = name, module, args, expect
    self.env, self.setup, self.absent, self.keep = env or {}, setup, absent, keep
    self.hold, self.act, self.signal_after = hold, act, signal_after
    self.stop_within, self.resume, self.reference = stop_within, resume, reference
    self.limit_s, self.api_ok = limit_s, api_ok
    if signal_after is not None and not act:
      self.act = (("sig", TERM),)


def _file(work, name="f", text="x"):
  with open(os.path.join(work, name), "w", encoding="utf-8") as f:
    f.write(text)


def _loop(work):
  os.symlink(os.path.join(work, "b"), os.path.join(work, "a"))
  os.symlink(os.path.join(work, "a"), os.path.join(work, "b"))


def _fifo(work):
  os.mkfifo(os.path.join(work, "p"))


def _mine(work):
  """A folder of the user's own files (must survive every case)."""
  os.makedirs(os.path.join(work, "mine"))
  _file(work, "mine/notes.txt", "my notes")


def _trained(work):
  """WORK/run: a copy of the sweep's finished run (ckpt-10, ckpt-20)."""
  shutil.copytree(os.environ["HOSTILE_TRAINED"], os.path.join(work, "run"),
                  symlinks=True)


def _then(*steps):
  def setup(work):
    cleanups = [step(work) for step in steps]
    cleanups = [c for c in cleanups if callable(c)]
    return lambda: [c() for c in reversed(cleanups)]
  return setup


def _edit(path, edit):
  """A setup step that rewrites WORK/`path` by `edit(text)` (None: delete)."""
  def step(work):
    full = os.path.join(work, path)
    if edit is None:
      os.remove(full)
      return
    with open(full, encoding="utf-8", errors="replace") as f:
      text = f.read()
    with open(full, "w", encoding="utf-8") as f:
      f.write(edit(text))
  return step


def _replace_by(path, kind):
  """A setup step replacing WORK/`path` by a fifo, dir, file or loop."""
  def step(work):
    full = os.path.join(work, path)
    if os.path.isdir(full) and not os.path.islink(full):
      shutil.rmtree(full)
    elif os.path.lexists(full):
      os.remove(full)
    if kind == "fifo":
      os.mkfifo(full)
    elif kind == "dir":
      os.makedirs(full)
    elif kind == "loop":
      os.symlink(full, full)
    else:
      _file(work, path, kind)
  return step


def _flip(work):
  """Flips bytes in the middle of ckpt-20's data file."""
  path = os.path.join(work, "run/checkpoints/ckpt-20.data-00000-of-00001")
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    data = f.read(64)
    f.seek(os.path.getsize(path) // 2)
    f.write(bytes(b ^ 0xFF for b in data))


def _tmpfs(path, size):
  """A setup step mounting a `size` tmpfs at WORK/`path` (unmounted after)."""
  def step(work):
    full = os.path.join(work, path)
    os.makedirs(full, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                    full], check=True)
    return lambda: subprocess.run(["umount", "-l", full], check=False)
  return step


def _read_only(path):
  """A setup step bind-mounting WORK/`path` read-only over itself."""
  def step(work):
    full = os.path.join(work, path)
    os.makedirs(full, exist_ok=True)
    subprocess.run(["mount", "--bind", full, full], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", full], check=True)
    return lambda: subprocess.run(["umount", "-l", full], check=False)
  return step


def _mkdir(path):
  return lambda work: os.makedirs(os.path.join(work, path), exist_ok=True)


def _symlink(target, link):
  return lambda work: os.symlink(os.path.join(work, target),
                                 os.path.join(work, link))


def bad_flag_cases():
  found = []
  train_flags = [
      "--num_modules=four", "--seed=None", "--num_modules=0",
      "--num_modules=-2", "--train_steps=-5", "--train_steps=1.5",
      "--batch_size=0", "--batch_size=16.5", "--steps_per_loop=0",
      "--strategy=bogus", "--placement=bogus", "--precision=float64",
      "--learning_rate=abc", "--num_microbatches=0", "--preset=nope",
      "--cluster_timeout_s=-1", "--deterministic=maybe",
      "--checkpoint_every_steps=0", "--epochs=-1", "--eval_every_steps=0",
      "--placement=cluster --cluster=nohost",
      "--placement=cluster --cluster=127.0.0.1:1,127.0.0.1:1",
      "--train_steps=10 --epochs=1", "--train_steps=99999999999999999999",
      "--learning_rate=nan", "--learning_rate=-1", "--learning_rate=inf",
      "--time_budget_s=-3", "--keep_checkpoints=0", "--num_modules=999",
      "--num_microbatches=3 --batch_size=32", "--on_nan=maybe",
      "--optimizer=bogus", "--lr_schedule=bogus", "--momentum=2",
      "--weight_decay=-1", "--strategy=0wise", "--strategy=2wise-bogus",
      "--variant=bogus", "--mixed_precision=float8", "--seq_len=-1",
      "--dataset=nope", "--model=nope", "--steps_per_loop=2.5",
      "--modules_per_device=0", "--split=1,2", "--warmup_steps=-1",
      "--eval_batches=0", "--batch_size=", "--num_modules=2**3",
      "--resume_from=WORK/none", "--data_dir=WORK/f"]
  for flag in train_flags:
    found.append(Case(f"train {flag}", "train.train",
                      ["--preset=synthetic_mlp"] + flag.split() +
                      ["--model_dir=WORK/run"], absent="WORK/run",
                      setup=_file))
  found.append(Case("train positional arg", "train.train",
                    TT + ["--model_dir=WORK/run", "extra"], absent="WORK/run"))
  found.append(Case("train --model_dir= (empty)", "train.train",
                    TT + ["--model_dir="]))
  found.append(Case("train unknown flag --modeldir", "train.train",
                    TT + ["--modeldir=WORK/run"], absent="WORK/run"))
  for module, args in (
      ("train.export", []), ("train.export", ["--model_dir=WORK/none"]),
      ("train.export", ["--model_dir=WORK/f"]),
      ("train.export", ["--model_dir=WORK/run", "--checkpoint=nope"]),
      ("train.export", ["--model_dir=WORK/run", "--export_dir=WORK/f"]),
      ("train.export", ["--model_dir=WORK/run", "--bogus=1"]),
      ("train.export", ["--model_dir=WORK/run", "x"]),
      ("train.evaluate", []), ("train.evaluate", ["--model_dir=WORK/none"]),
      ("train.evaluate", ["--saved_model=WORK/none"]),
      ("train.evaluate", ["--saved_model=WORK/f"]),
      ("train.evaluate", ["--model_dir=WORK/run", "--batch_size=-16"]),
      ("train.evaluate", ["--model_dir=WORK/run", "--eval_batches=0"]),
      ("train.evaluate", ["--model_dir=WORK/run", "--num_modules=four"]),
      ("train.evaluate", ["--saved_model=WORK/run/export",
                          "--preset=fortunes_lm", "--seq_len=16"]),
      ("train.worker", []),
      ("train.worker", ["--cluster=127.0.0.1:1", "--task=3"]),
      ("train.worker", ["--cluster=garbage", "--task=0"]),
      ("train.worker", ["--cluster=127.0.0.1:1", "--task=-1"]),
      ("train.worker", ["--cluster=127.0.0.1:1", "--task=x"]),
      ("train.worker", ["--cluster=127.0.0.1:99999", "--task=0"]),
      ("research.benchmark", ["--json_out=WORK"]),
      ("research.benchmark", ["--json_out=WORK/no/x.json"]),
      ("research.benchmark", ["--num_modules=four"]),
      ("research.benchmark", ["--batch_size=-1"]),
      ("research.benchmark", ["--steps=0"]),
      ("research.benchmark", ["--strategies=bogus"]),
      ("research.benchmark", ["--placement=bogus"]),
      ("research.benchmark", ["--json_out=WORK/p"]),
      ("research.compare", ["--out_dir=WORK/f/x"]),
      ("research.compare", ["--out_dir=WORK/c", "--strategies=2wise,pairwise"]),
      ("research.compare", ["--out_dir=WORK/c", "--seeds=0"]),
      ("research.compare", ["--out_dir=WORK/c", "--eval_points=1"]),
      ("research.compare", ["--out_dir=WORK/c", "--strategies=bogus"]),
      ("research.compare", ["--out_dir=WORK/c", "--jobs=0"]),
      ("research.compare", ["--out_dir=WORK/p"]),
      ("research.compare", ["--out_dir=WORK/a/c"]),
      ("research.compare", ["--out_dir=WORK/c", "--num_modules=four"])):
    found.append(Case(f"{module} {' '.join(args) or '(no flags)'}", module,
                      args, setup=_then(_file, _fifo, _loop, _trained),
                      keep="WORK/run"))
  return found


def folder_cases():
  run = ["--model_dir=WORK/run"]
  found = [
      Case("train model_dir under a file", "train.train",
           TT + ["--model_dir=WORK/f/run"], setup=_file),
      Case("train model_dir symlink loop", "train.train",
           TT + ["--model_dir=WORK/a/run"], setup=_loop),
      Case("train model_dir is a symlink loop", "train.train",
           TT + ["--model_dir=WORK/a"], setup=_loop),
      Case("train model_dir is a file", "train.train",
           TT + ["--model_dir=WORK/f"], setup=_file),
      Case("train model_dir is a FIFO", "train.train",
           TT + ["--model_dir=WORK/p"], setup=_fifo),
      Case("train model_dir under a FIFO", "train.train",
           TT + ["--model_dir=WORK/p/run"], setup=_fifo),
      Case("train model_dir /dev/null", "train.train",
           TT + ["--model_dir=/dev/null"]),
      Case("train model_dir is /proc/self", "train.train",
           TT + ["--model_dir=/proc/self"]),
      Case("train model_dir read-only bind mount", "train.train",
           TT + ["--model_dir=WORK/ro/run"], setup=_read_only("ro"),
           absent="WORK/ro/run"),
      Case("train model_dir = user's folder", "train.train",
           TT + ["--model_dir=WORK/mine"], setup=_mine, expect="either",
           keep="WORK/mine/notes.txt"),
      Case("train model_dir symlink to a folder", "train.train",
           TT + ["--model_dir=WORK/link"],
           setup=_then(_mkdir("real"), _symlink("real", "link")), expect="ok"),
      Case("train model_dir dangling symlink", "train.train",
           TT + ["--model_dir=WORK/link"], setup=_symlink("gone", "link"),
           expect="either"),
      Case("train model_dir with a space and newline", "train.train",
           TT + ["--model_dir=WORK/my run\nx"], expect="either"),
  ]
  for name in ("sweep[lr=0.1]", "a*b", "what?", "x{1,2}", "b]a[", "c\\d"):
    found.append(Case(f"train glob model_dir {name!r} then resume",
                      "train.train", TT + [f"--model_dir=WORK/{name}"],
                      expect="either", resume=TT[:1] + [
                          "--train_steps=40", "--steps_per_loop=10",
                          f"--model_dir=WORK/{name}"]))
  for path, kind in (("run/config.json", "fifo"), ("run/lock.json", "fifo"),
                     ("run/lock.json", "dir"), ("run/lock.json", "{garbage"),
                     ("run/checkpoints", "file"),
                     ("run/checkpoints/checkpoint", "garbage: \"x"),
                     ("run/checkpoints/checkpoint", "fifo"),
                     ("run/config.json", "[1, 2]"), ("run/run.json", "fifo"),
                     ("run/export", "file"), ("run/checkpoints", "loop")):
    found.append(Case(f"train resume with {path} a {kind[:8]}", "train.train",
                      TT[:1] + ["--train_steps=40"] + run, expect="either",
                      setup=_then(_trained, _replace_by(path, kind)),
                      limit_s=120))
  found += [
      Case("train resume, ckpt-20 bit-flipped", "train.train",
           TT[:1] + ["--train_steps=40"] + run,
           setup=_then(_trained, _flip), keep="WORK/run/checkpoints"),
      Case("train resume K=4 run as K=2, config.json gone", "train.train",
           TT[:1] + ["--train_steps=40", "--num_modules=2"] + run,
           setup=_then(_trained, _edit("run/config.json", None)),
           keep="WORK/run/checkpoints"),
      Case("train resume K=4 run, config.json edited to K=2", "train.train",
           TT[:1] + ["--train_steps=40", "--num_modules=2"] + run,
           setup=_then(_trained, _edit("run/config.json", lambda t: t.replace(
               '"num_modules": 4', '"num_modules": 2'))),
           keep="WORK/run/checkpoints"),
      Case("train resume with other width", "train.train",
           TT[:1] + ["--train_steps=40", "--mlp_width=7"] + run,
           setup=_trained, keep="WORK/run/checkpoints"),
      Case("train resume with --strategy=e2e (says what changed)",
           "train.train", TT[:1] + ["--train_steps=40", "--strategy=e2e"] +
           run, setup=_trained, expect="ok"),
      Case("train resume with run.json deleted", "train.train",
           TT[:1] + ["--train_steps=40"] + run,
           setup=_then(_trained, _edit("run/run.json", None)),
           expect="either"),
      Case("train full tmpfs (64k) at start", "train.train",
           TT + ["--model_dir=WORK/full/run"], setup=_tmpfs("full", "64k")),
      Case("train full tmpfs (5m) at the 2nd checkpoint", "train.train",
           TT[:1] + ["--train_steps=40", "--steps_per_loop=10",
                     "--checkpoint_every_steps=10",
                     "--model_dir=WORK/full/run"], setup=_tmpfs("full", "5m")),
      Case("train full tmpfs at the final export", "train.train",
           TT + ["--model_dir=WORK/full/run"], setup=_tmpfs("full", "20m"),
           hold=("train.actions.verify_lock", 3),
           act=(("fill", "full"), ("go",))),
      Case("train.export to a full tmpfs (100k)", "train.export",
           run + ["--export_dir=WORK/full/export"],
           setup=_then(_trained, _tmpfs("full", "100k")), keep="WORK/run"),
      Case("train.export onto a mount point", "train.export",
           run + ["--export_dir=WORK/full"],
           setup=_then(_trained, _tmpfs("full", "100k")), keep="WORK/run"),
      Case("train.export to a read-only mount", "train.export",
           run + ["--export_dir=WORK/ro/export"],
           setup=_then(_trained, _read_only("ro")), keep="WORK/run"),
      Case("train.export into the user's folder", "train.export",
           run + ["--export_dir=WORK/mine"],
           setup=_then(_trained, _mine), keep="WORK/mine"),
      Case("train.export twice (own export replaced)", "train.export", run,
           setup=_trained, expect="ok"),
      Case("train.evaluate with variables/ of another export",
           "train.evaluate", ["--saved_model=WORK/run/export"],
           setup=_then(_trained, _other_variables)),
      Case("train.evaluate a FIFO saved_model", "train.evaluate",
           ["--saved_model=WORK/p"], setup=_fifo),
      Case("train.evaluate an empty folder", "train.evaluate",
           ["--saved_model=WORK/e"], setup=_mkdir("e")),
      Case("train.evaluate model_dir read-only", "train.evaluate",
           ["--model_dir=WORK/run"], setup=_then(_trained, _read_only("run")),
           expect="either"),
      Case("research.benchmark --json_out=existing file", "research.benchmark",
           ["--json_out=WORK/mine/notes.txt"], setup=_mine, expect="stop",
           signal_after=15, keep="WORK/mine/notes.txt"),
      Case("research.compare into a read-only mount", "research.compare",
           ["--out_dir=WORK/ro/c", "--preset=synthetic_mlp",
            "--train_steps=100"],
           setup=_read_only("ro"), absent="WORK/ro/c"),
  ]
  return found


def _other_variables(work):
  """WORK/run/export/variables replaced by a K=2 export's."""
  other = os.environ["HOSTILE_OTHER_EXPORT"]
  target = os.path.join(work, "run/export/variables")
  shutil.rmtree(target)
  shutil.copytree(os.path.join(other, "variables"), target)
