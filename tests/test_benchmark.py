"""research.benchmark through the binary: flag checks and the separate-process
plain Keras baseline (tiny sizes: these test behaviour, not speed)."""

import json
import os
import platform
import subprocess
import sys

import pytest

from train import runtime_env

# make test-slow (research.benchmark's processes end to end).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--width=32", "--batch_size=16", "--steps=1", "--steps_per_loop=2"]

# (flags, the flag the one-line error names, the value it quotes).
BAD_FLAGS = [
    (["--batch_size=0"], "batch_size", "Received: batch_size=0"),
    (["--strategies=foo"], "strategies", "Received: strategies='foo'"),
    (["--strategies=e2e,4wise-max"], "strategies",
     "Received: strategies='e2e,4wise-max'"),
    (["--strategies=local,2wise-pipelined"], "strategies",
     "Received: strategies='local,2wise-pipelined'"),
    (["--width=-3"], "width", "Received: width=-3"),
    (["--steps=0"], "steps", "Received: steps=0"),
    (["--steps_per_loop=0"], "steps_per_loop", "Received: steps_per_loop=0"),
    (["--num_modules=0"], "num_modules", "Received: num_modules=0"),
    (["--num_cores=0"], "num_cores", "Received: num_cores=0"),
    (["--threads_per_device=0"], "threads_per_device",
     "Received: threads_per_device=0"),
    (["--modules_per_device=3"], "modules_per_device",
     "Received: modules_per_device=3"),
    (["--thread_efficiency=1.5"], "thread_efficiency",
     "Received: thread_efficiency=1.5"),
    (["--placement=tpu"], "placement", "Received: placement='tpu'"),
    (["--model=cnn"], "model", "Received: model='cnn'"),
    (["--model=resnet", "--preset=resnet7"], "preset",
     "Received: preset='resnet7'"),
]


def _start(*flags):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  env.pop("TF_ENABLE_ONEDNN_OPTS", None)  # The binary sets its default.
  return subprocess.Popen([sys.executable, "-m", "research.benchmark", *flags],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_bad_flags_fail_in_one_line():
  runs = [(case, _start(*TINY, *case[0])) for case in BAD_FLAGS]
  for (flags, name, received), proc in runs:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, (flags, err)
    assert not out, flags  # No table with NaN speedups, no JSON.
    lines = err.strip().splitlines()
    assert len(lines) == 1, (flags, err)
    assert lines[0].startswith(f"error: --{name}="), (flags, lines[0])
    assert lines[0].endswith(received), (flags, lines[0])


def test_plain_keras_baseline_runs_in_its_own_process():
  proc = _start(*TINY, "--json", "--strategies=e2e,local",
                "--threads_per_device=1", "--modules_per_device=1",
                "--num_cores=2")
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  report = json.loads(out.strip().splitlines()[-1])
  # The baseline process kept TF's default thread pools (0: every core);
  # the strategies ran where intra-op parallelism is 1 per device.
  assert report["baseline_thread_pools"] == {"intra_op": 0, "inter_op": 0}
  assert report["baseline_threads"] == len(os.sched_getaffinity(0))
  (run,) = report["runs"]
  assert run["thread_pools"] == {"intra_op": 1, "inter_op": 4}
  # 4 threads on 2 cores: the plan says they share them.
  assert run["plan"] == "4 devices x 1 thread (4 threads on 2 cores)"
  assert run["cores_in_use"] == 2
  plain = report["plain_keras_step_s"]
  assert plain > 0 and report["e2e_single_step_s"] > 0
  # Timed in two processes, before and after the strategies: the mean.
  assert len(report["plain_keras_runs_s"]) == 2
  assert plain == pytest.approx(sum(report["plain_keras_runs_s"]) / 2)
  assert report["e2e_overhead_vs_keras"] == pytest.approx(
      report["e2e_single_step_s"] / plain)
  e2e = report["strategies"]["e2e"]["measured_step_s"]
  for name in ("e2e", "local"):
    row = report["strategies"][name]
    assert row["plan"] == "4 devices x 1 thread (4 threads on 2 cores)"
    assert row["cores_in_use"] == 2
    assert row["speedup_vs_plain_keras"] == pytest.approx(
        plain / row["measured_step_s"])
    assert row["measured_speedup"] == pytest.approx(
        e2e / row["measured_step_s"])
    assert row["predicted_step_s"] > 0
  x86 = platform.machine().lower() in ("x86_64", "amd64")
  assert report["onednn"] == ("1" if x86 else "unset")


def test_onednn_default():
  assert runtime_env.onednn_supported("x86_64")
  assert not runtime_env.onednn_supported("aarch64")
  assert runtime_env.environment_defaults(True).get(
      "TF_ENABLE_ONEDNN_OPTS") == ("1" if runtime_env.onednn_supported()
                                   else None)
