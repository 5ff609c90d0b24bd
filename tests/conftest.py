"""Test set-up: four logical CPU devices before the TF runtime starts.

Depthwise placement and MirroredStrategy tests need several devices; on a
CPU-only machine they are simulated with logical CPU devices (see
../shared/docs/interlocking.md). This must run before any tensor is created.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests import cluster_procs  # noqa: E402
from tests import floors  # noqa: E402
from tests import xdist_order  # noqa: E402

NUM_TEST_DEVICES = 4

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_TEST_DEVICES)


def pytest_collection_modifyitems(config, items):
  """Marks each test with its file's floor: library, train or research;
  in an xdist worker, puts the costliest files first (xdist_order.py)."""
  for item in items:
    item.add_marker(floors.floor_of(str(item.path)))
  if hasattr(config, "workerinput"):
    xdist_order.costliest_files_first(items)


@pytest.fixture(scope="session")
def mirrored():
  """One MirroredStrategy over two logical CPUs for the whole session.

  Each new MirroredStrategy restarts its collective instance keys, and the
  runtime caches collective parameters by key: two strategies over the same
  devices in one process can then clash (tensorflow/tensorflow#62790). Real
  jobs build one strategy.
  """
  return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture(scope="session")
def synthetic_run(tmp_path_factory):
  """A synthetic_mlp run of train.train for 10 steps (ckpt-10, its export),
  trained once per pytest process; tests copy it before they touch it.

  What the run printed is in the file `run + ".stdout"`, beside it."""
  from tests.binaries import run_binary  # pylint: disable=g-import-not-at-top
  run = str(tmp_path_factory.mktemp("synthetic") / "run")
  proc = run_binary("train.train", "--preset=synthetic_mlp",
                    "--steps_per_loop=5", "--checkpoint_every_steps=10",
                    "--eval_every_steps=10", "--train_steps=10",
                    f"--model_dir={run}")
  with open(run + ".stdout", "w", encoding="utf-8") as f:
    f.write(proc.stdout)
  return run


@pytest.fixture
def procs():
  """Worker processes a test starts; all stopped at its end, even on failure."""
  started = cluster_procs.Procs()
  try:
    yield started
  finally:
    started.stop_all()


@pytest.fixture
def mixed_bfloat16():
  """Runs a test under the mixed_bfloat16 policy, then restores the policy."""
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    yield
  finally:
    keras.mixed_precision.set_global_policy(previous)
