"""The hostile sweep's judge (tools/hostile_sweep.py): what a finished
case left, read back: its lines, the folders it had to keep, the
checkpoint its resume ended at, and processes it left running."""

import hashlib
import os
import subprocess
import sys

from tools import hostile_cases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAILURES = ("HANG", "TRACEBACK", "SILENT", "UNCLEAR", "WROTE", "LOSS",
            "LEFTOVER", "ORPHAN", "SLOW STOP", "FAILED", "NOT HELD")

HASH = r"""
import hashlib, sys, numpy as np, tensorflow as tf
reader = tf.train.load_checkpoint(sys.argv[1])
h = hashlib.sha256()
for name in sorted(reader.get_variable_to_shape_map()):
  if "save_counter" in name or name.startswith("_CHECKPOINTABLE"):
    continue
  value = np.asarray(reader.get_tensor(name))
  h.update(name.encode())
  h.update(repr(value.tolist()).encode() if value.dtype == object
           else value.tobytes())
print(h.hexdigest())
"""


def _env(**extra):
  return dict(os.environ, PYTHONPATH=ROOT, **extra)


def latest_step(model_dir):
  """The highest ckpt-N with an index in model_dir/checkpoints, or None."""
  try:
    names = os.listdir(os.path.join(model_dir, "checkpoints"))
  except OSError:
    return None
  steps = [int(n[5:-6]) for n in names
           if n.startswith("ckpt-") and n.endswith(".index")
           and n[5:-6].isdigit()]
  return max(steps) if steps else None


def checkpoint_hash(model_dir):
  """sha256 of every variable of model_dir's latest ckpt (not its count)."""
  prefix = os.path.join(model_dir, "checkpoints",
                        f"ckpt-{latest_step(model_dir)}")
  proc = subprocess.run([sys.executable, "-c", HASH, prefix], env=_env(
      TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True, text=True, check=False)
  return proc.stdout.strip() or f"unreadable: {proc.stderr[-300:]}"


def snapshot(path):
  """{relative path: kind and content hash} of `path`, links not followed,
  FIFOs never opened."""
  found = {}
  if not os.path.lexists(path):
    return None
  for top, dirs, files in os.walk(path):
    for name in dirs + files:
      full = os.path.join(top, name)
      st = os.lstat(full)
      key = os.path.relpath(full, path)
      if os.path.isfile(full) and not os.path.islink(full):
        with open(full, "rb") as f:
          found[key] = hashlib.sha256(f.read()).hexdigest()
      else:
        found[key] = oct(st.st_mode)
  if os.path.isfile(path):
    with open(path, "rb") as f:
      found["."] = hashlib.sha256(f.read()).hexdigest()
  return found


def _orphans(work):
  """Pids of live processes whose command line names `work`."""
  found = []
  for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
      continue
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if work.encode() in f.read():
          found.append(int(pid))
    except OSError:
      pass
  return found


def _lines(work):
  with open(os.path.join(work, ".stderr"), encoding="utf-8",
            errors="replace") as f:
    stderr = f.read()
  errors = [line for line in stderr.splitlines()
            if line.startswith(("error:", "FATAL Flags parsing error"))]
  first = (errors or [line for line in stderr.splitlines() if line.strip()]
           or [""])[0]
  return stderr, errors, first


def judge(case, rc, work, acted_at, seconds, held):
  """The first phase's verdict."""
  stderr, errors, first = _lines(work)
  one = "held" if len(errors) == 1 else ("SILENT" if not errors else "UNCLEAR")
  if "Traceback (most recent call last)" in stderr:
    verdict = "TRACEBACK"
  elif case.hold and not held:
    verdict = "NOT HELD"
  elif case.expect == "ok":
    verdict = "held" if rc == 0 else "FAILED"
  elif case.expect == "either":
    verdict = "held" if rc == 0 and not errors else one
  elif case.expect == "api":
    first_error = errors[0] if errors else ""
    # A refusal names the value ("Received: ..."); a run stopped on bad
    # data names the module (NonFiniteError) or TF's kernel names the label.
    good = (first_error.startswith(("error: ValueError", "error: TypeError"))
            and "Received" in stderr) or (
                first_error.startswith("error: NonFiniteError") and
                " in module_" in first_error) or (
                    first_error.startswith("error: InvalidArgumentError: "
                                           "Received a label value"))
    verdict = ("held" if rc == 0 else "FAILED") if case.api_ok else (
        "held" if rc == 1 and good and len(errors) == 1 else
        ("SILENT" if rc == 0 else "UNCLEAR"))
  elif case.expect == "refuse":
    verdict = one if rc == 1 else ("SILENT" if rc == 0 else one)
  elif case.expect == "killed":
    verdict = "held" if acted_at is not None else "held (ended first)"
  elif acted_at is None:
    verdict = "held (ended first)" if rc == 0 or len(errors) == 1 else one
  elif seconds - acted_at > case.stop_within:
    verdict = f"SLOW STOP ({seconds - acted_at:.1f} s)"
  elif case.module == "train.worker":
    # A worker holds no state (the run's checkpoints are its client's): a
    # signal is its way to stop, exit 0 with one line on stdout.
    with open(os.path.join(work, ".stdout"), encoding="utf-8",
              errors="replace") as f:
      said = [line for line in f.read().splitlines()
              if line.startswith("worker stopped (")]
    verdict = "held" if rc == 0 and len(said) == 1 else "SILENT"
    first = said[0] if said else first
  else:
    verdict = one
  if case.absent and os.path.lexists(case.absent.replace("WORK", work)):
    verdict = "WROTE"
  return verdict, first


def judge_resume(case, work, reference):
  """The verdict of a case's resume: it must finish, restorable, equal."""
  stderr, errors, _ = _lines(work)
  if "Traceback (most recent call last)" in stderr:
    return "TRACEBACK (resume)"
  if case.module == "train.export":
    ok = os.path.exists(os.path.join(work, "run/export/saved_model.pb"))
    if errors or not ok:
      return f"LOSS (re-export: {(errors or ['no export'])[0][:80]})"
  else:
    run = os.path.join(work, "run")
    step = latest_step(run)
    if errors or step is None:
      return f"LOSS (resume: {(errors or ['no checkpoint'])[0][:80]})"
    if case.reference:
      if step != hostile_cases.RESUME_STEP:
        return f"LOSS (resumed run ends at ckpt-{step})"
      if checkpoint_hash(run) != reference:
        return "LOSS (resumed run differs from the uninterrupted one)"
  for top, dirs, files in os.walk(work):
    for name in dirs + files:
      if name.endswith("_temp") or ".export.old" in name or ".tmp-" in name:
        return f"LEFTOVER ({os.path.relpath(os.path.join(top, name), work)})"
  return "held (resumed" + (", equal)" if case.reference else ")")
