r"""Hostile sweep: bad flags, hostile folders, TF_CONFIG faults, impostor
workers and signals in every phase, through the binaries.

  python tools/hostile_sweep.py --out=docs/results/hostile_sweep/sweep.md

Each case runs one binary as a user would and is judged:

* refuse: exit 1, exactly one "error:" line on stderr, no traceback, and
  (where the case says) nothing created;
* ok: exit 0 and no traceback;
* stop: a signal after a fixed delay; the binary must be gone within 5 s
  of it, with exactly one "error:" line and no traceback.

A case that runs past its limit is a hang. Prints (and writes) the table:
case, exit code, seconds, first line, verdict. Two cases run at a time.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TT = ["--preset=synthetic_mlp", "--train_steps=20", "--steps_per_loop=10",
      "--checkpoint_every_steps=10"]
LONG = ["--preset=synthetic_mlp", "--train_steps=100000",
        "--steps_per_loop=10", "--checkpoint_every_steps=10",
        "--eval_every_steps=100000"]


class Case:
  """One run: `module` with `args` (WORK in them is the case's folder)."""

  def __init__(self, name, module, args, expect="refuse", env=None,
               signal_after=None, signum=signal.SIGTERM, limit_s=240,
               setup=None, absent=None):
    self.name, self.module, self.args, self.expect = name, module, args, expect
    self.env, self.signal_after, self.signum = env or {}, signal_after, signum
    self.limit_s, self.setup, self.absent = limit_s, setup, absent


def _file(work, name="f", text="x"):
  with open(os.path.join(work, name), "w", encoding="utf-8") as f:
    f.write(text)


def _loop(work):
  os.symlink(os.path.join(work, "b"), os.path.join(work, "a"))
  os.symlink(os.path.join(work, "a"), os.path.join(work, "b"))


def _listener():
  """A port that accepts and never answers (kept open for the sweep)."""
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  sock.listen(64)
  _listener.socks.append(sock)
  return f"127.0.0.1:{sock.getsockname()[1]}"


_listener.socks = []


def cases():
  """The sweep's cases."""
  found = []
  bad_flags = [
      "--num_modules=four", "--seed=None", "--num_modules=0",
      "--num_modules=-2", "--train_steps=-5", "--train_steps=1.5",
      "--batch_size=0", "--batch_size=16.5", "--steps_per_loop=0",
      "--strategy=bogus", "--placement=bogus", "--precision=float64",
      "--learning_rate=abc", "--num_microbatches=0", "--preset=nope",
      "--cluster_timeout_s=-1", "--deterministic=maybe",
      "--checkpoint_every_steps=0", "--epochs=-1", "--eval_every_steps=0",
      "--placement=cluster --cluster=nohost", "--placement=cluster "
      "--cluster=127.0.0.1:1,127.0.0.1:1", "--train_steps=10 --epochs=1"]
  for flag in bad_flags:
    found.append(Case(f"train {flag}", "train.train",
                      ["--preset=synthetic_mlp"] + flag.split() +
                      ["--model_dir=WORK/run"], absent="WORK/run"))
  found.append(Case("train positional arg", "train.train",
                    TT + ["--model_dir=WORK/run", "extra"],
                    absent="WORK/run"))
  found.append(Case("train model_dir under a file", "train.train",
                    TT + ["--model_dir=WORK/f/run"], setup=_file))
  found.append(Case("train model_dir symlink loop", "train.train",
                    TT + ["--model_dir=WORK/a/run"], setup=_loop))
  found.append(Case("train model_dir is a file", "train.train",
                    TT + ["--model_dir=WORK/f"], setup=_file))
  for text in ("[1,2]", '"str"', '{"task": 5}', "{not json",
               '{"task": {"type": "worker", "index": -1}}',
               '{"cluster": {"worker": "h:1"}}',
               '{"cluster": {"worker": [1, 2]}, "task": {"type": "worker"}}'):
    found.append(Case(f"train TF_CONFIG={text}", "train.train",
                      TT + ["--model_dir=WORK/run"],
                      env={"TF_CONFIG": text}, absent="WORK/run"))
  found.append(Case("train impostor worker (timeout 5 s)", "train.train",
                    TT + ["--num_modules=2", "--placement=cluster",
                          "--cluster=IMPOSTOR0,IMPOSTOR1",
                          "--cluster_timeout_s=5", "--model_dir=WORK/run"]))
  found.append(Case("train no worker (timeout 5 s)", "train.train",
                    TT + ["--num_modules=2", "--placement=cluster",
                          "--cluster=127.0.0.1:1,127.0.0.1:2",
                          "--cluster_timeout_s=5", "--model_dir=WORK/run"]))
  for module, args in (("train.export", []),
                       ("train.export", ["--model_dir=WORK/none"]),
                       ("train.export", ["--model_dir=WORK/f"]),
                       ("train.evaluate", []),
                       ("train.evaluate", ["--model_dir=WORK/none"]),
                       ("train.evaluate", ["--saved_model=WORK/none"]),
                       ("train.worker", []),
                       ("train.worker", ["--cluster=127.0.0.1:1", "--task=3"]),
                       ("train.worker", ["--cluster=garbage", "--task=0"]),
                       ("research.benchmark", ["--json_out=WORK"]),
                       ("research.benchmark", ["--json_out=WORK/no/x.json"]),
                       ("research.benchmark", ["--num_modules=four"]),
                       ("research.benchmark", ["--batch_size=-1"]),
                       ("research.compare", ["--out_dir=WORK/f/x"]),
                       ("research.compare", ["--out_dir=WORK/c",
                                             "--strategies=2wise,pairwise"]),
                       ("research.compare", ["--out_dir=WORK/c",
                                             "--seeds=0"]),
                       ("research.compare", ["--out_dir=WORK/c",
                                             "--eval_points=1"])):
    found.append(Case(f"{module} {' '.join(args) or '(no flags)'}", module,
                      args, setup=_file))
  found.append(Case("train ok (tt)", "train.train",
                    TT + ["--model_dir=WORK/run"], expect="ok"))
  # Signals in each phase, at fixed delays from the start.
  for delay in (3, 8, 15, 25, 40):
    for signum in (signal.SIGTERM, signal.SIGINT):
      found.append(Case(f"train {signal.Signals(signum).name} at {delay} s",
                        "train.train", LONG + ["--model_dir=WORK/run"],
                        expect="stop", signal_after=delay, signum=signum))
  for delay in (10, 30):
    found.append(Case(f"train M=32 (tracing) SIGTERM at {delay} s",
                      "train.train", TT + ["--num_microbatches=32",
                                           "--model_dir=WORK/run"],
                      expect="stop", signal_after=delay))
  found.append(Case("train impostor SIGTERM at 15 s", "train.train",
                    TT + ["--num_modules=2", "--placement=cluster",
                          "--cluster=IMPOSTOR0,IMPOSTOR1",
                          "--cluster_timeout_s=600", "--model_dir=WORK/run"],
                    expect="stop", signal_after=15))
  for module, args in (
      ("research.benchmark", []),
      ("research.compare", ["--preset=synthetic_mlp", "--out_dir=WORK/c",
                            "--train_steps=100000", "--strategies=e2e",
                            "--noplots", "--cost_repeats=1"])):
    for delay in (5, 20):
      found.append(Case(f"{module} SIGTERM at {delay} s", module, args,
                        expect="stop", signal_after=delay))
  return found


def _start(case, work):
  args = [a.replace("WORK", work) for a in case.args]
  if any("IMPOSTOR" in a for a in args):
    args = [a.replace("IMPOSTOR0", _listener()).replace(
        "IMPOSTOR1", _listener()) for a in args]
  if case.setup:
    case.setup(work)
  env = dict(os.environ, PYTHONPATH=ROOT, **case.env)
  proc = subprocess.Popen([sys.executable, "-m", case.module, *args],
                          cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=open(os.path.join(work, ".stderr"), "w"),
                          stdin=subprocess.DEVNULL)
  return proc, time.monotonic()


def _judge(case, proc, work, seconds, signalled_at, hung):
  with open(os.path.join(work, ".stderr"), encoding="utf-8") as f:
    stderr = f.read()
  # absl's own refusal of an unknown flag or enum value is one line too.
  errors = [line for line in stderr.splitlines()
            if line.startswith(("error:", "FATAL Flags parsing error"))]
  first = (errors or [line for line in stderr.splitlines() if line.strip()]
           or [""])[0]
  traceback = "Traceback (most recent call last)" in stderr
  rc = proc.returncode
  if hung:
    verdict = "HANG"
  elif traceback:
    verdict = "TRACEBACK"
  elif case.expect == "ok":
    verdict = "held" if rc == 0 else "FAILED"
  elif case.expect == "refuse":
    verdict = "held" if rc == 1 and len(errors) == 1 else (
        "SILENT" if not errors else "UNCLEAR")
    if case.absent and os.path.exists(case.absent.replace("WORK", work)):
      verdict = "WROTE"
  else:
    stop_s = seconds - signalled_at if signalled_at is not None else None
    if signalled_at is None:  # ended before the signal
      verdict = "held (ended first)" if rc == 0 or len(errors) == 1 else (
          "UNCLEAR")
    elif stop_s >= 5.0:
      verdict = f"SLOW STOP ({stop_s:.1f} s)"
    else:
      verdict = "held" if len(errors) == 1 else (
          "SILENT" if not errors else "UNCLEAR")
  return rc, first, verdict


def run(all_cases, parallel=2):
  """Runs the cases, `parallel` at a time; the table's rows."""
  rows, pending, running = [], list(enumerate(all_cases)), []
  base = tempfile.mkdtemp(prefix="hostile_sweep_")
  while pending or running:
    while pending and len(running) < parallel:
      index, case = pending.pop(0)
      work = os.path.join(base, f"case_{index}")
      os.makedirs(work)
      proc, started = _start(case, work)
      running.append([index, case, proc, started, work, None])
    time.sleep(0.05)
    for item in list(running):
      index, case, proc, started, work, signalled = item
      now = time.monotonic() - started
      if (case.signal_after is not None and signalled is None and
          proc.poll() is None and now >= case.signal_after):
        proc.send_signal(case.signum)
        item[5] = signalled = now
      hung = proc.poll() is None and (
          now > case.limit_s or
          (signalled is not None and now - signalled > 30))
      if hung:
        proc.kill()
        proc.wait()
      if proc.poll() is not None:
        rc, first, verdict = _judge(case, proc, work, now, signalled, hung)
        rows.append((index, case.name, rc, now, first, verdict))
        print(f"{index:3d} {verdict:10s} {now:6.1f}s rc={rc} {case.name}: "
              f"{first[:120]}", flush=True)
        running.remove(item)
  return sorted(rows)


def table(rows):
  lines = ["| # | case | exit | seconds | first line | verdict |",
           "|---|---|---|---|---|---|"]
  for index, name, rc, seconds, first, verdict in rows:
    cell = first.replace("|", "\\|")[:300]
    lines.append(f"| {index} | `{name.replace('|', '/')}` | {rc} | "
                 f"{seconds:.1f} | {cell} | {verdict} |")
  counts = {}
  for row in rows:
    key = row[5].split(" (")[0] if row[5].startswith("held") else row[5]
    counts[key] = counts.get(key, 0) + 1
  lines.append("")
  lines.append(f"{len(rows)} cases: " + ", ".join(
      f"{v} {k}" for k, v in sorted(counts.items())))
  return "\n".join(lines) + "\n", counts


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=None, help="Markdown table to write.")
  parser.add_argument("--only", default=None, help="Substring of case names.")
  parser.add_argument("--parallel", type=int, default=2)
  options = parser.parse_args()
  chosen = [c for c in cases() if not options.only or options.only in c.name]
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
