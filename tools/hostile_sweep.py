r"""Hostile sweep: bad flags, hostile folders, full disks, TF_CONFIG
faults, impostor and frozen workers, signals in every phase and API misuse,
through the binaries (cases: tools/hostile_cases.py, tools/hostile_stops.py,
tools/hostile_containment.py).

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
from tools import hostile_containment  # pylint: disable=g-import-not-at-top,wrong-import-position
from tools import hostile_mismatch_cases  # pylint: disable=g-import-not-at-top,wrong-import-position
from tools import hostile_stops  # pylint: disable=g-import-not-at-top,wrong-import-position
from tools.hostile_judge import (_env, _orphans, checkpoint_hash, judge,  # pylint: disable=g-import-not-at-top,wrong-import-position
                                 judge_resume, snapshot)


def cases():
  """The sweep's cases, in order."""
  return (hostile_cases.bad_flag_cases() + hostile_cases.folder_cases() +
          hostile_stops.cluster_cases() + hostile_stops.signal_cases() +
          hostile_stops.api_cases() + hostile_containment.containment_cases() +
          hostile_mismatch_cases.cases())


def _listener():
  """A port that accepts and never answers (kept open for the sweep)."""
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  sock.listen(64)
  _listener.socks.append(sock)
  return f"127.0.0.1:{sock.getsockname()[1]}"


_listener.socks = []


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
    elif step[0] == "call":  # a function of the binary's process and folder
      step[1](proc, work)
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


def batchable(case):
  """A flag refusal that cannot block (no FIFO, loop or mount in reach):
  run through the binary's main in one process with others of its binary
  and environment (tests.refusals), TF's import paid once."""
  # train.worker's boundary leaves by os._exit (its gRPC threads): alone.
  return (case.expect == "refuse" and not case.hold and not case.act and
          not getattr(case, "alone", False) and
          case.module != "train.worker" and
          "PEERS" not in " ".join(case.args) and "IMPOSTOR" not in
          " ".join(case.args) and not any(
              a.endswith(("WORK/p", "WORK/a/c")) for a in case.args))


def batch_groups(chosen, base):
  """The batchable cases as groups of one binary and environment, each
  group ready to run in one child: (module, env, members, command lines,
  folders, cleanups and kept snapshots)."""
  groups = {}
  for index, case in chosen:
    groups.setdefault((case.module, json.dumps(case.env)), []).append(
        (index, case))
  found = []
  for (module, env), members in groups.items():
    works, keeps, lines = [], [], []
    for index, case in members:
      work = os.path.join(base, f"case_{index}")
      os.makedirs(work)
      cleanup = case.setup(work) if case.setup else None
      keeps.append((cleanup, case.keep and snapshot(
          case.keep.replace("WORK", work))))
      works.append(work)
      lines.append([a.replace("WORK", work) for a in case.args])
    found.append((module, json.loads(env), members, lines, works, keeps))
  return found


def start_batch(group, base):
  module, env, members, lines, _, _ = group
  path = os.path.join(base, f"batch_{members[0][0]}")
  with open(path + ".in", "w", encoding="utf-8") as f:
    json.dump(lines, f)
  return subprocess.Popen(
      [sys.executable, "-m", "tests.refusals", module], cwd=ROOT,
      env=_env(**env), stdin=open(path + ".in", encoding="utf-8"),
      stdout=open(path + ".out", "w"), stderr=subprocess.DEVNULL)


def finish_batch(group, base, seconds, rows):
  """Judges every case of a finished group from the child's JSON."""
  _, _, members, _, works, keeps = group
  seconds /= len(members)
  with open(os.path.join(base, f"batch_{members[0][0]}.out"),
            encoding="utf-8") as f:
    out = f.read().strip().splitlines()
  try:
    results = json.loads(out[-1])
  except (IndexError, ValueError):
    results = [{"code": None, "stderr": "the batch died"}] * len(members)
  for (index, case), work, (cleanup, kept), result in zip(
      members, works, keeps, results):
    with open(os.path.join(work, ".stderr"), "w", encoding="utf-8") as f:
      f.write(result["stderr"])
    verdict, first = judge(case, result["code"], work, None, seconds, False)
    if case.keep and snapshot(case.keep.replace("WORK", work)) != kept:
      verdict = "LOSS (" + case.keep.replace("WORK/", "") + " changed)"
    if cleanup:
      cleanup()
    rows.append((index, case.name, result["code"], seconds, first,
                 verdict + " [in-process]"))
    print(f"{index:3d} {verdict:40s} {seconds:6.1f}s rc={result['code']} "
          f"{case.name}: {first[:100]}", flush=True)


def run(all_cases, parallel=2, report=lambda rows: None):
  """Runs the cases, `parallel` at a time; the table's rows."""
  base = tempfile.mkdtemp(prefix="hostile_sweep_")
  reference = prepare(base)
  rows, running = [], []
  pending = [(None, group) for group in batch_groups(
      [(i, c) for i, c in all_cases if batchable(c)], base)]
  pending += [(i, c) for i, c in all_cases if not batchable(c)]
  while pending or running:
    while pending and len(running) < parallel:
      index, case = pending.pop(0)
      if index is None:  # a batch of refusals
        running.append([None, case, start_batch(case, base),
                        time.monotonic()])
        continue
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
      if item[0] is None:
        if item[2].poll() is not None:
          finish_batch(item[1], base, time.monotonic() - item[3], rows)
          running.remove(item)
          report(rows)
        continue
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
        report(rows)
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
    key = row[5].split(" (")[0].split(" [")[0]
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

  def report(rows, final=False):
    if options.out:
      write(options.out, sorted(rows), started, final)
  rows = run(chosen, options.parallel, report)
  print(table(rows)[0])
  report(rows, final=True)


def write(out, rows, started, final):
  """Writes the table so far (the sweep's results survive a cut-off)."""
  text, counts = table(rows)
  if out:
    with open(out, "w", encoding="utf-8") as f:
      f.write(f"# Hostile sweep{'' if final else ' (in progress)'} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, "
              f"{time.time() - started:.0f} s, two cases at a time on a "
              f"loaded 2-core host)\n\nCommand: `python tools/hostile_sweep.py "
              f"--out={out}`\n\n" + text)
    with open(os.path.splitext(out)[0] + ".json", "w",
              encoding="utf-8") as f:
      json.dump({"counts": counts, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
