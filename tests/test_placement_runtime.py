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


# The built-in placements' runtimes and what each sets up; a placement
# registered later is checked by the rule below, not listed here.
BUILT_IN_RUNTIMES = {
    "single": (placement_runtime.SingleRuntime, (False, False, False, True)),
    "simulated": (placement_runtime.SimulatedRuntime,
                  (True, False, False, False)),
    "gpu": (placement_runtime.GpuRuntime, (False, False, False, False)),
    "tpu": (placement_runtime.TpuRuntime, (False, False, True, False)),
    "cluster": (placement_runtime.ClusterRuntime,
                (False, True, False, False))}


def expected_runtime(cls):
  """The rule: its own runtime class, else its nearest registered-runtime
  base's, else the defaults (`Runtime`)."""
  for base in cls.__mro__:
    if base in placement_runtime.RUNTIMES:
      return placement_runtime.RUNTIMES[base]
  return placement_runtime.Runtime


def test_every_registered_placement_has_a_runtime(user_placements):
  for name in placement_lib.names():
    runtime = placement_runtime.of(name)
    assert runtime is expected_runtime(placement_lib.get(name)), name
    assert all(isinstance(flag, bool) for flag in _flags(runtime)), name
  assert placement_runtime.of("library_only") is placement_runtime.Runtime
  assert (placement_runtime.of("mirror")
          is placement_runtime.SimulatedRuntime)
  for name, (runtime, flags) in BUILT_IN_RUNTIMES.items():
    assert placement_runtime.of(name) is runtime, name
    assert _flags(runtime) == flags, name


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
