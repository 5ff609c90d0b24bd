"""research.host_reference: the host's speed on a fixed workload, and the
benchmark's --host_reference that records it around a report."""

import json
import subprocess
import sys

import pytest

from research import host_reference


def test_reference_time_is_a_positive_median():
  seconds = host_reference.reference_time(repeats=3)
  # Two 256x1024x1024 matmuls and their weight gradients: 1.6 GFLOP, well
  # above 0.1 ms and below a minute on any CPU this runs on.
  assert 1e-4 < seconds < 60.0


@pytest.mark.parametrize("repeats", [0, -1, 2.0, True])
def test_bad_repeats_fail_in_one_line(repeats):
  with pytest.raises(ValueError, match=rf"Received: repeats={repeats!r}$"):
    host_reference.reference_time(repeats=repeats)


@pytest.mark.slow
def test_the_profile_role_records_the_reference_around_its_report():
  flags = ["--role=profile", "--placement=simulated", "--num_modules=2",
           "--layers_per_module=1", "--threads_per_device=1",
           "--modules_per_device=1", "--model=mlp", "--width=32",
           "--batch_size=16", "--repetitions=1", "--host_reference"]
  out = subprocess.run([sys.executable, "-m", "research.benchmark", *flags],
                       capture_output=True, text=True, timeout=300,
                       check=True).stdout
  report = json.loads(out)
  before, after = report["host_reference_ms"]
  assert before > 0.0 and after > 0.0
  assert len(report["module_costs_ms"]) == 2
  # Without the flag, no reference is taken.
  out = subprocess.run([sys.executable, "-m", "research.benchmark",
                        *flags[:-1]], capture_output=True, text=True,
                       timeout=300, check=True).stdout
  assert "host_reference_ms" not in json.loads(out)
