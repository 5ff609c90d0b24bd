"""A threading plan's devices get the threads it claims.

TF's local CPU devices share one intra-op pool unless
TF_OVERRIDE_GLOBAL_THREADPOOL=1 is set before the runtime starts
(`step_model.use_own_pools`). Pools are fixed per process, so each case runs
in a child process: it sets up the plan, then runs a chain of matmuls on each
device in turn and lists the threads whose CPU time grew meanwhile
(/proc/self/task/TID/stat), other than the calling one. Those threads are
the device's intra-op pool.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs in the child: argv[1] = "train" (train.runtime_setup's set-up of a
# 4-module plan of 2 devices x 2 threads) or "shared" (the same devices and
# threads through placement.split_host_cpu alone: TF's one shared pool).
_CHILD = r"""
import dataclasses, json, os, sys
from train import runtime_env  # noqa: F401  (before TensorFlow)
import tensorflow as tf
from tf_interlock import placement
from train import config as config_lib
from train import runtime_setup

if sys.argv[1] == "train":
  config = dataclasses.replace(
      config_lib.load_preset("synthetic_mlp"), placement="simulated",
      threads_per_device=2, modules_per_device=2)
  runtime_setup.setup_runtime(config)
  plan = runtime_setup.simulated_plan(config)
else:
  placement.split_host_cpu(2, intra_op_threads=2)
  plan = None

def cpu_ticks():
  ticks = {}
  for tid in os.listdir("/proc/self/task"):
    if int(tid) == os.getpid():  # The caller, which runs and waits.
      continue
    try:
      with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # The thread ended.
      continue
    ticks[tid] = int(fields[11]) + int(fields[12])  # utime + stime
  return ticks

@tf.function
def chain(x):
  for _ in range(24):
    x = tf.matmul(x, x) * 1e-3
  return x

used = []
for device in tf.config.list_logical_devices("CPU"):
  with tf.device(device.name):
    x = tf.random.normal([768, 768])
    chain(x).numpy()  # Traced and warm: the next call is the ops alone.
    before = cpu_ticks()
    chain(x).numpy()
    after = cpu_ticks()
  used.append(sorted(t for t in after if after[t] > before.get(t, after[t])))
print(json.dumps({"used": used, "env": os.environ.get(
    "TF_OVERRIDE_GLOBAL_THREADPOOL"), "plan": plan and plan.describe()}))
"""


def _threads_per_device(mode):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  env.pop("TF_OVERRIDE_GLOBAL_THREADPOOL", None)
  proc = subprocess.run([sys.executable, "-c", _CHILD, mode], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_each_device_of_a_train_plan_runs_on_its_own_threads():
  # 2 devices x 2 threads: each device's ops ran on exactly 2 threads, and
  # not the other device's (4 threads in all, as the plan claims).
  report = _threads_per_device("train")
  assert report["env"] == "1"
  assert report["plan"].startswith("2 devices x 2 threads, 2 modules each")
  first, second = map(set, report["used"])
  assert len(first) == len(second) == 2, report
  assert not first & second, report


def test_without_own_pools_the_devices_share_one_pool():
  # TF's default, which the plans above avoid: both devices run on the same
  # 2 threads (2 cores for "2 devices x 2 threads").
  report = _threads_per_device("shared")
  assert report["env"] is None
  first, second = map(set, report["used"])
  assert first == second and len(first) == 2, report
