r"""Hostile sweep: bad flags, hostile folders, full disks, TF_CONFIG
faults, impostor and frozen workers, signals in every phase and API misuse,
through the binaries (cases: tools/hostile_cases.py, tools/hostile_stops.py).

  python tools/hostile_sweep.py --out=docs/results/hostile_sweep/sweep.md

Each case runs one binary (or a `python -c` snippet) as a user would and
is judged (see `hostile_cases.Case`): HANG (past its limit, or not gone
30 s after its signal), TRACEBACK, SILENT (no "error:" line where one is
due), UNCLEAR (more than one), SLOW STOP (gone later than 5 s after the
signal), WROTE (created what a refusal must not), LOSS (a folder it had to
keep changed; or its resume did not end at the last step, or differs from
the uninterrupted run), LEFTOVER (a half-written save or export left after
the resume), ORPHAN (a child still running after the binary died). Prints
and writes the table: case, exit, seconds, first line, verdict. Two cases
run at a time. Needs root (tmpfs and read-only bind mounts).
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools import hostile_cases  # pylint: disable=g-import-not-at-top,wrong-import-position
from tools import hostile_stops  # pylint: disable=g-import-not-at-top,wrong-import-position

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


def cases():
  """The sweep's cases, in order."""
  return (hostile_cases.bad_flag_cases() + hostile_cases.folder_cases() +
          hostile_stops.cluster_cases() + hostile_stops.signal_cases() +
          hostile_stops.api_cases())


def _listener():
  """A port that accepts and never answers (kept open for the sweep)."""
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  sock.listen(64)
  _listener.socks.append(sock)
  return f"127.0.0.1:{sock.getsockname()[1]}"


_listener.socks = []


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


def prepare(base):
  """Trains the runs cases copy (HOSTILE_TRAINED, HOSTILE_OTHER_EXPORT) and
  the uninterrupted reference of RESUME; returns the reference's hash."""
  def train(args, folder):
    subprocess.run([sys.executable, "-m", "train.train", *[
        a.replace("WORK", folder) for a in args]], cwd=ROOT, env=_env(),
                   check=True, capture_output=True)
  trained, other, ref = (os.path.join(base, n) for n in ("t", "o", "r"))
  train(hostile_cases.TT + ["--model_dir=WORK/run"], trained)
  train(hostile_cases.TT + ["--num_modules=2", "--model_dir=WORK/run"], other)
  train(hostile_cases.RESUME, ref)
  os.environ["HOSTILE_TRAINED"] = os.path.join(trained, "run")
  os.environ["HOSTILE_OTHER_EXPORT"] = os.path.join(other, "run", "export")
  return checkpoint_hash(os.path.join(ref, "run"))


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


def _start(case, work, args, module, hold=None):
  args = [a.replace("WORK", work) for a in args]
  cluster = os.path.join(work, ".cluster")
  if os.path.exists(cluster):
    with open(cluster, encoding="utf-8") as f:
      peers = f.read()
    args = [a.replace("PEERS", peers) for a in args]
  args = [a.replace("IMPOSTOR0", _listener()).replace(
      "IMPOSTOR1", _listener()) for a in args]
  if module == "-c":
    command = [sys.executable, "-c", *args]
  elif hold:
    command = [sys.executable, "-m", "tests.hold",
               os.path.join(work, ".ready"), hold[0], str(hold[1]), module,
               *args]
  else:
    command = [sys.executable, "-m", module, *args]
  return subprocess.Popen(
      command, cwd=ROOT, env=_env(**case.env),
      stdout=open(os.path.join(work, ".stdout"), "w"),
      stderr=open(os.path.join(work, ".stderr"), "w"),
      stdin=subprocess.DEVNULL)


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
    good = errors and errors[0].startswith(("error: ValueError",
                                            "error: TypeError"))
    verdict = ("held" if rc == 0 else "FAILED") if case.api_ok else (
        "held" if rc == 1 and good and "Received" in stderr and
        len(errors) == 1 else ("SILENT" if rc == 0 else "UNCLEAR"))
  elif case.expect == "refuse":
    verdict = one if rc == 1 else ("SILENT" if rc == 0 else one)
  elif case.expect == "killed":
    verdict = "held" if acted_at is not None else "held (ended first)"
  elif acted_at is None:
    verdict = "held (ended first)" if rc == 0 or len(errors) == 1 else one
  elif seconds - acted_at > case.stop_within:
    verdict = f"SLOW STOP ({seconds - acted_at:.1f} s)"
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


def _act(case, proc, work):
  for step in case.act:
    if step[0] == "sig":
      proc.send_signal(step[1])
    elif step[0] == "fill":  # writes zeros until the disk is full
      with open(os.path.join(work, step[1], "filler"), "wb") as f:
        try:
          while True:
            f.write(b"\0" * (1 << 16))
            f.flush()
        except OSError:
          pass
    elif step[0] == "worker":
      hostile_stops.PEERS[work][step[1]].send_signal(step[2])
    else:
      with open(os.path.join(work, ".ready.go"), "w", encoding="utf-8"):
        pass


def _finish(item, rows, reference, now, hung):
  """Judges an item's ended process; True when the item is done."""
  index, case, proc, started, work, acted_at, phase, state = item
  if phase == "main":
    verdict, first = judge(case, proc.returncode, work, acted_at, now,
                           os.path.exists(os.path.join(work, ".ready")))
    if hung:
      verdict = "HANG"
    if case.keep:
      if snapshot(case.keep.replace("WORK", work)) != state["keep"]:
        verdict = "LOSS (" + case.keep.replace("WORK/", "") + " changed)"
    left = _orphans(work)
    if left:
      time.sleep(5)
      left = _orphans(work)
      for pid in left:
        os.kill(pid, signal.SIGKILL)
      if left:
        verdict = f"ORPHAN ({len(left)} left running)"
    state.update(rc=proc.returncode, seconds=now, first=first,
                 verdict=verdict)
    if case.resume and verdict.startswith("held") and (
        case.expect != "either" or proc.returncode == 0):
      module, args = (case.resume if isinstance(case.resume, tuple)
                      else (case.module, case.resume))
      item[2] = _start(case, work, args, module)
      item[6] = "resume"
      return False
  else:
    state["verdict"] = ("HANG (resume)" if hung else
                        judge_resume(case, work, reference))
  if state.get("cleanup"):
    state["cleanup"]()
  rows.append((index, case.name.replace("\n", " "), state["rc"],
               state["seconds"], state["first"], state["verdict"]))
  print(f"{index:3d} {state['verdict'][:40]:40s} {state['seconds']:6.1f}s "
        f"rc={state['rc']} {case.name}: {state['first'][:100]}", flush=True)
  return True


def run(all_cases, parallel=2):
  """Runs the cases, `parallel` at a time; the table's rows."""
  base = tempfile.mkdtemp(prefix="hostile_sweep_")
  reference = prepare(base)
  rows, pending, running = [], list(all_cases), []
  while pending or running:
    while pending and len(running) < parallel:
      index, case = pending.pop(0)
      work = os.path.join(base, f"case_{index}")
      os.makedirs(work)
      state = {"cleanup": case.setup(work) if case.setup else None}
      if case.keep:
        state["keep"] = snapshot(case.keep.replace("WORK", work))
      proc = _start(case, work, case.args, case.module, case.hold)
      running.append([index, case, proc, time.monotonic(), work, None,
                      "main", state])
    time.sleep(0.05)
    for item in list(running):
      index, case, proc, started, work, acted_at, phase, _ = item
      now = time.monotonic() - started
      if phase == "main" and acted_at is None and case.act and (
          proc.poll() is None) and (
              os.path.exists(os.path.join(work, ".ready")) if case.hold
              else now >= (case.signal_after or 0)):
        _act(case, proc, work)
        item[5] = acted_at = now
      hung = proc.poll() is None and (now > case.limit_s * (
          2 if phase == "resume" else 1) or (
              phase == "main" and acted_at is not None and
              now - acted_at > max(30, case.stop_within + 25)))
      if hung:
        proc.kill()
        proc.wait()
      if proc.poll() is not None and _finish(item, rows, reference, now,
                                             hung):
        running.remove(item)
  shutil.rmtree(base, ignore_errors=True)
  return sorted(rows)


def table(rows):
  lines = ["| # | case | exit | seconds | first line | verdict |",
           "|---|---|---|---|---|---|"]
  for index, name, rc, seconds, first, verdict in rows:
    cell = first.replace("|", "\\|").replace("\n", " ")[:300]
    lines.append(f"| {index} | `{name.replace('|', '/')}` | {rc} | "
                 f"{seconds:.1f} | {cell} | {verdict} |")
  counts = {}
  for row in rows:
    key = row[5].split(" (")[0]
    counts[key] = counts.get(key, 0) + 1
  lines.append("")
  lines.append(f"{len(rows)} cases: " + ", ".join(
      f"{v} {k}" for k, v in sorted(counts.items())))
  return "\n".join(lines) + "\n", counts


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=None, help="Markdown table to write.")
  parser.add_argument("--only", default=None, help="Substrings of case names, |-separated.")
  parser.add_argument("--parallel", type=int, default=2)
  options = parser.parse_args()
  chosen = [(i, c) for i, c in enumerate(cases())
            if not options.only or any(
                part in c.name for part in options.only.split("|"))]
  started = time.time()
  rows = run(chosen, options.parallel)
  text, counts = table(rows)
  print(text)
  if options.out:
    with open(options.out, "w", encoding="utf-8") as f:
      f.write(f"# Hostile sweep ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, "
              f"{time.time() - started:.0f} s, two cases at a time on a "
              f"loaded 2-core host)\n\nCommand: `python tools/hostile_sweep.py "
              f"--out={options.out}`\n\n" + text)
    with open(os.path.splitext(options.out)[0] + ".json", "w",
              encoding="utf-8") as f:
      json.dump({"counts": counts, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
