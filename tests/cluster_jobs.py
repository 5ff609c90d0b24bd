"""Starts the processes of a loopback cluster for a test, and stops them.

Every process runs `python -m MODULE ARGS...` from the repository root with
its own TF_CONFIG (127.0.0.1, free ports). `run_cluster` waits for all of
them, and kills any that is still running when it returns or raises, so a
failing test leaves no process behind.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def free_ports(count):
  """`count` distinct free TCP ports on 127.0.0.1."""
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def tf_config(ports, index, chief=False):
  """TF_CONFIG of task `index`: "worker" tasks, or a chief then workers."""
  addresses = [f"127.0.0.1:{p}" for p in ports]
  if not chief:
    return {"cluster": {"worker": addresses},
            "task": {"type": "worker", "index": index}}
  task = ({"type": "chief", "index": 0} if index == 0 else
          {"type": "worker", "index": index - 1})
  return {"cluster": {"chief": addresses[:1], "worker": addresses[1:]},
          "task": task}


def run_cluster(module, args_per_task, log_dir, timeout_s=240, chief=False,
                cwd=ROOT):
  """Runs one process per entry of `args_per_task`; all must exit 0.

  Args:
    module: the Python module to run (`python -m module`).
    args_per_task: per task, its command-line arguments.
    log_dir: a pathlib.Path; task i's stdout and stderr go to task_{i}.log.
    timeout_s: seconds to wait for all of them together.
    chief: task 0 is the "chief" (else every task is a "worker").
    cwd: the working directory of every process.

  Returns:
    The logs' text, per task.

  Raises:
    AssertionError: a process failed or timed out (with its log's tail).
  """
  ports = free_ports(len(args_per_task))
  procs, logs = [], []
  try:
    for i, args in enumerate(args_per_task):
      env = dict(os.environ, TF_CONFIG=json.dumps(tf_config(ports, i, chief)),
                 TF_CPP_MIN_LOG_LEVEL="2",
                 PYTHONPATH=os.pathsep.join(
                     [str(ROOT), os.environ.get("PYTHONPATH", "")]))
      logs.append(log_dir / f"task_{i}.log")
      with open(logs[-1], "wb") as log:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", module, *map(str, args)], cwd=cwd,
            env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout_s
    for i, proc in enumerate(procs):
      try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        pass
      text = logs[i].read_text(errors="replace")
      assert proc.returncode == 0, (
          f"task {i} exited {proc.returncode}:\n{text[-3000:]}")
    return [log.read_text(errors="replace") for log in logs]
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
