"""A threading plan's devices get the threads it claims.

TF's local CPU devices share one intra-op pool unless
TF_OVERRIDE_GLOBAL_THREADPOOL=1 is set before the runtime starts
(`step_model.use_own_pools`). Pools are fixed per process, so each case runs
in a child process: it sets up the plan, then `research.pool_check` runs a
chain of matmuls on each device in turn and lists the threads whose CPU time
grew meanwhile (/proc/self/task/TID/stat), other than the calling one: the
device's intra-op pool.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs in the child: train.runtime_setup's set-up of a 4-module plan of 2
# devices x 2 threads, then the threads each device's ops ran on.
_CHILD = r"""
import dataclasses, json, os, sys
from train import runtime_env  # noqa: F401  (before TensorFlow)
import tensorflow as tf
from research import pool_check
from train import config as config_lib
from train import runtime_setup

config = dataclasses.replace(
    config_lib.load_preset("synthetic_mlp"), placement="simulated",
    threads_per_device=2, modules_per_device=2)
runtime_setup.setup_runtime(config)
plan = runtime_setup.simulated_plan(config)

names = [d.name for d in tf.config.list_logical_devices("CPU")]
used = pool_check.device_threads(names)
print(json.dumps({"used": used, "env": os.environ.get(
    "TF_OVERRIDE_GLOBAL_THREADPOOL"), "plan": plan.describe()}))
"""


def _report(*args):
  """The last line of `python *args`' stdout, as JSON (a child process)."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  env.pop("TF_OVERRIDE_GLOBAL_THREADPOOL", None)
  proc = subprocess.run([sys.executable, *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_each_device_of_a_train_plan_runs_on_its_own_threads():
  # 2 devices x 2 threads: each device's ops ran on its pool's 2 threads
  # (plus, at times, the inter-op thread that called the op, which may run
  # a shard inline), never on the other device's.
  report = _report("-c", _CHILD)
  assert report["env"] == "1"
  assert report["plan"].startswith("2 devices x 2 threads, 2 modules each")
  first, second = map(set, report["used"])
  assert 2 <= len(first) <= 3 and 2 <= len(second) <= 3, report
  assert not first & second, report


def test_without_own_pools_the_devices_share_one_pool():
  # TF's default, which the plans above avoid: both devices run on the same
  # 2 pool threads (each may also list the inter-op thread that called an op
  # and ran a shard inline), and the plan says it has 2 cores.
  report = _report("-m", "research.pool_check", "--num_devices=2",
                   "--threads_per_device=2", "--shared_pool", "--repeats=1")
  assert report["own_pools_env"] is None
  assert report["plan"] == "2 devices x 2 threads, one shared pool (2 cores)"
  first, second = map(set, report["device_threads"])
  assert len(first & second) >= 2, report
  assert len(first) <= 3 and len(second) <= 3, report
  assert not report["disjoint"] and report["cores_in_use"] == 2
