"""The hostile sweep's cases of issue 40 (tools/hostile_sweep.py runs them).

Inputs that do not match what a run expects: one worker named twice (or
workers listed in another order than they were started with), run files
of the wrong shape (deeply nested JSON, a list where an object belongs),
in-memory file systems for what must outlive the process, an export of
another run, an empty entry in a list flag, an empty or too-big data set,
bad TensorFlow and OpenMP environment variables, and a killed stop
watchdog. Each must end in one line (or run on and say so), never hang,
trace back or lose a run.
"""

import os
import shutil
import signal
import subprocess
import sys

import numpy as np

from tools.hostile_cases import (CLUSTER, LONG, TT, Case, _then, _tmpfs,
                                 _trained)
from tools.hostile_stops import HOLDS, PEERS, _free_ports, _workers

RUN = ["--model_dir=WORK/run"]
RESUME40 = TT[:1] + ["--train_steps=40"] + RUN
# Nesting deep enough for json's recursion limit; and a value that is JSON
# but not the object a run file holds.
DEEP = "[" * 100000 + "]" * 100000
DEEP_OBJECT = '{"a": ' * 5000 + "1" + "}" * 5000


def _write(path, text):
  """A setup step writing `text` to WORK/`path` (its folder made)."""
  def step(work):
    full = os.path.join(work, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
      f.write(text)
  return step


def _one_worker_twice(work):
  """One worker, listed twice: 127.0.0.1:P and localhost:P (PEERS)."""
  port = _free_ports(1)[0]
  cluster = f"127.0.0.1:{port},localhost:{port}"
  proc = subprocess.Popen(
      [sys.executable, "-m", "train.worker", f"--cluster={cluster}",
       "--task=0"], env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
      stdin=subprocess.DEVNULL)
  PEERS[work] = [proc]
  with open(os.path.join(work, ".cluster"), "w", encoding="utf-8") as f:
    f.write(cluster)
  return lambda: (proc.kill(), proc.wait())


def _workers_swapped(work):
  """Two live workers (hostile_stops._workers), named in swapped order."""
  stop = _workers(work)
  path = os.path.join(work, ".cluster")
  with open(path, encoding="utf-8") as f:
    first, second = f.read().split(",")
  with open(path, "w", encoding="utf-8") as f:
    f.write(f"{second},{first}")
  return stop


def _idx(train, test=200):
  """A setup step writing Fashion-MNIST-shaped IDX files to WORK/idx."""
  def step(work):
    folder = os.path.join(work, "idx")
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    for stem, n in (("train", train), ("t10k", test)):
      with open(os.path.join(folder, f"{stem}-labels-idx1-ubyte"), "wb") as f:
        f.write(np.array([0x801, n], ">u4").tobytes() +
                (np.arange(n) % 10).astype("u1").tobytes())
      with open(os.path.join(folder, f"{stem}-images-idx3-ubyte"), "wb") as f:
        f.write(np.array([0x803, n, 28, 28], ">u4").tobytes() +
                rng.integers(0, 256, n * 784).astype("u1").tobytes())
  return step


def _other_export(work):
  """WORK/b/export: the K = 2 export of another run."""
  shutil.copytree(os.environ["HOSTILE_OTHER_EXPORT"],
                  os.path.join(work, "b", "export"))


def kill_watchdog(proc, work):
  """Kills the binary's stop watchdog (its child running stop_watchdog.py)."""
  del work
  for pid in os.listdir("/proc"):
    try:
      with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        command = f.read()
    except (OSError, ValueError, IndexError):
      continue
    if parent == proc.pid and b"stop_watchdog.py" in command:
      os.kill(int(pid), signal.SIGKILL)


def cluster_cases():
  timeout = ["--cluster_timeout_s=20", "--model_dir=WORK/run"]
  return [
      Case("cluster one worker twice (127.0.0.1:P,localhost:P), live",
           "train.train", CLUSTER + ["--cluster=PEERS"] + timeout,
           setup=_one_worker_twice, limit_s=150, absent="WORK/run"),
      Case("cluster one worker twice (127.0.0.1:1,localhost:1), none up",
           "train.train", CLUSTER + ["--cluster=127.0.0.1:1,localhost:1"] +
           timeout, absent="WORK/run"),
      Case("cluster workers listed in swapped order", "train.train",
           CLUSTER + ["--cluster=PEERS"] + timeout, setup=_workers_swapped,
           limit_s=150, absent="WORK/run"),
      Case("train.worker one worker twice", "train.worker",
           ["--cluster=127.0.0.1:1,localhost:1", "--task=0"]),
  ]


def run_file_cases():
  found = []
  hostile = {"deeply nested": DEEP, "nested object": DEEP_OBJECT,
             "a list": "[1, 2]", "a string": '"run"', "null": "null"}
  for kind, text in hostile.items():
    for path in ("run/config.json", "run/run.json", "run/lock.json"):
      found.append(Case(f"train resume with {path} {kind}", "train.train",
                        RESUME40, setup=_then(_trained, _write(path, text)),
                        expect="either" if path.endswith("lock.json") else
                        "refuse", keep="WORK/run/checkpoints", limit_s=150))
    found.append(Case(f"train.export with run/config.json {kind}",
                      "train.export", RUN,
                      setup=_then(_trained, _write("run/config.json", text)),
                      keep="WORK/run"))
    found.append(Case(f"train.evaluate with run/config.json {kind}",
                      "train.evaluate", RUN,
                      setup=_then(_trained, _write("run/config.json", text)),
                      keep="WORK/run"))
    found.append(Case(
        f"train.evaluate --saved_model with interlock_export.json {kind}",
        "train.evaluate", ["--saved_model=WORK/run/export"],
        setup=_then(_trained, _write("run/export/interlock_export.json",
                                     text)), expect="either", keep="WORK/run"))
    found.append(Case(
        f"research.compare with compare_study.json {kind}", "research.compare",
        ["--out_dir=WORK/c", "--preset=synthetic_mlp", "--train_steps=100",
         "--strategies=e2e", "--noplots"],
        setup=_write("c/compare_study.json", text), keep="WORK/c"))
  found.append(Case("train resume with config.json history 5", "train.train",
                    RESUME40, setup=_then(_trained, _write_history),
                    keep="WORK/run/checkpoints"))
  return found


def _write_history(work):
  """config.json's history replaced by a number."""
  path = os.path.join(work, "run/config.json")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  with open(path, "w", encoding="utf-8") as f:
    f.write(text.replace('"history": [', '"history": 5, "h": [', 1))


def scheme_cases():
  return [
      Case("train --model_dir=ram://run", "train.train",
           TT + ["--model_dir=ram://run"]),
      Case("train --export_dir=ram://exp", "train.train",
           TT + ["--export_dir=ram://exp", "--model_dir=WORK/run"],
           absent="WORK/run"),
      Case("train.export --export_dir=ram://exp", "train.export",
           RUN + ["--export_dir=ram://exp"], setup=_trained, keep="WORK/run"),
      Case("research.compare --out_dir=ram://c", "research.compare",
           ["--out_dir=ram://c", "--preset=synthetic_mlp",
            "--train_steps=100", "--strategies=e2e", "--noplots"]),
  ]


def export_cases():
  return [
      Case("train.evaluate --model_dir=A --saved_model=B/export (K=2)",
           "train.evaluate", RUN + ["--saved_model=WORK/b/export"],
           setup=_then(_trained, _other_export), keep="WORK/run"),
  ]


def list_flag_cases():
  found = []
  for flag in ("--split=1,,1,1,1", "--split=1,1,1,1,", "--split=,",
               "--lr_decay_fractions=0.5,,0.75"):
    found.append(Case(f"train {flag}", "train.train",
                      ["--preset=synthetic_mlp", flag] + RUN,
                      absent="WORK/run"))
  for module, flag in (
      ("research.benchmark", "--strategies=e2e,,local"),
      ("research.benchmark", "--microbatches=1,,2"),
      ("research.compare", "--strategies=e2e,,local"),
      ("research.tracing_time", "--strategies=e2e,"),
      ("research.model_validation", "--networks=,mlp")):
    found.append(Case(f"{module} {flag}", module,
                      [flag, "--out_dir=WORK/c"] if module ==
                      "research.compare" else [flag]))
  return found


def data_cases():
  fashion = ["--preset=fashion_mnist_resnet", "--train_steps=2",
             "--warmup_steps=0", "--num_modules=2", "--source_dir=WORK/idx"]
  return [
      Case("train IDX train split of 0 images", "train.train",
           fashion + ["--data_dir=WORK/data"] + RUN, setup=_idx(0),
           absent="WORK/run"),
      Case("train --data_dir on a full tmpfs (1m)", "train.train",
           fashion + ["--data_dir=WORK/full/data"] + RUN,
           setup=_then(_idx(3000), _tmpfs("full", "1m")), limit_s=300,
           absent="WORK/run"),
  ]


def environment_cases():
  found = []
  for name, value in (("TF_NUM_INTRAOP_THREADS", "-5"),
                      ("TF_NUM_INTEROP_THREADS", "abc"),
                      ("OMP_NUM_THREADS", "-1"),
                      ("TF_CPP_MIN_LOG_LEVEL", "loud"),
                      ("TF_ENABLE_ONEDNN_OPTS", "maybe"),
                      ("TF_INTERLOCK_STOP_GRACE_S", "soon")):
    for module, args in (("train.train", TT + RUN),
                         ("train.evaluate", RUN),
                         ("research.benchmark", ["--json_out=WORK/b.json"])):
      case = Case(f"{module} {name}={value}", module, args,
                  env={name: value}, absent="WORK/run")
      case.alone = True  # TF's start-up reads it: a process of its own
      found.append(case)
  return found


def watchdog_cases():
  return [
      Case("train watchdog killed while training, then SIGTERM",
           "train.train", LONG + RUN, hold=HOLDS["training"],
           act=(("call", kill_watchdog), ("go",), ("sig", signal.SIGTERM)),
           expect="stop"),
  ]


def cases():
  """Issue 40's cases, in order."""
  return (cluster_cases() + run_file_cases() + scheme_cases() +
          export_cases() + list_flag_cases() + data_cases() +
          environment_cases() + watchdog_cases())
