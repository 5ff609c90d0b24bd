"""train/placement_runtime.py: what the binaries set up for each placement.

Every registered placement has a runtime: its own, its nearest built-in
base's, or the defaults (nothing to set up, the default strategy), so a
placement added with one subclass and `register` runs from the binaries.
"""

import pytest
import tensorflow as tf

from tf_interlock import placement as placement_lib
from train import placement_runtime


class _LibraryOnly(placement_lib.Placement):
  """A placement of the library's user, with nothing for the binaries."""

  kind = "library_only"


class _Mirror(placement_lib.SimulatedPlacement):
  """A subclass of a built-in placement: module k on logical CPU k too."""

  kind = "mirror"


@pytest.fixture
def user_placements():
  for cls in (_LibraryOnly, _Mirror):
    placement_lib.register(cls)
  yield
  for cls in (_LibraryOnly, _Mirror):
    placement_lib.unregister(cls.kind)


def _flags(runtime):
  return (runtime.splits_host_cpu, runtime.needs_cluster, runtime.needs_tpu,
          runtime.data_parallel)


def test_every_registered_placement_has_a_runtime(user_placements):
  runtimes = {name: placement_runtime.of(name)
              for name in placement_lib.names()}
  assert runtimes == {
      "single": placement_runtime.SingleRuntime,
      "simulated": placement_runtime.SimulatedRuntime,
      "gpu": placement_runtime.GpuRuntime,
      "tpu": placement_runtime.TpuRuntime,
      "cluster": placement_runtime.ClusterRuntime,
      "library_only": placement_runtime.Runtime,
      "mirror": placement_runtime.SimulatedRuntime}
  assert {name: _flags(placement_runtime.of(name))
          for name in placement_lib.KINDS} == {
              "single": (False, False, False, True),
              "simulated": (True, False, False, False),
              "gpu": (False, False, False, False),
              "tpu": (False, False, True, False),
              "cluster": (False, True, False, False)}


def test_a_placement_without_a_runtime_gets_the_defaults(user_placements):
  runtime = placement_runtime.of(_LibraryOnly)
  assert _flags(runtime) == (False, False, False, False)
  runtime.configure_devices(64)  # nothing to set up, nothing raised
  assert runtime.missing_devices(64) is None
  assert runtime.strategy(4) is tf.distribute.get_strategy()
  with pytest.raises(ValueError, match="Received: placement='unknown'"):
    placement_runtime.of("unknown")


def test_gpu_runtime_names_the_missing_gpus(monkeypatch):
  monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: [])
  assert placement_runtime.GpuRuntime.missing_devices(2) == (
      "one GPU per module: 2 modules but 0 GPUs")
  assert placement_runtime.GpuRuntime.missing_devices(0) is None
