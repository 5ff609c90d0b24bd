"""What the binaries set up for a placement around the TF runtime.

The library's placement class (`tf_interlock.placement`) maps modules to
devices and checks their variables. What only a binary does for it lives
here, one small class per placement: the logical devices and thread pools
to set before the TF runtime starts, the devices a machine must have, the
cluster or TPU to connect to, and the `tf.distribute` strategy the run
trains under.

`of(placement)` finds a placement's runtime through its class's bases, so a
subclass of a built-in placement (`tests/test_custom_placement.py`'s
"reversed", a `SimulatedPlacement`) gets its parent's, and a placement with
none in its bases gets `Runtime`: nothing to set up, the default strategy.
"""

import tensorflow as tf

from tf_interlock import placement as placement_lib


class Runtime:
  """A placement's set-up by the binaries; by default none.

  Class attributes:
    splits_host_cpu: logical CPU devices and thread pools must be set
      before the TF runtime starts (`configure_devices`), and the CPU
      threading plan applies.
    needs_cluster: the process connects to a cluster of workers first.
    needs_tpu: the run connects to a TPU (a name or grpc:// address); the
      TPU runs the step loop on the device (the host does not call the
      input iterator once per step), its replicas are known once connected
      and it runs only XLA programs.
    data_parallel: every module shares one device, so the strategy may
      mirror the whole model over this host's GPUs or a job's workers.
  """

  splits_host_cpu = False
  needs_cluster = False
  needs_tpu = False
  data_parallel = False

  @classmethod
  def configure_devices(cls, num_devices, intra_op_threads=1):
    """Sets up this process's devices for `num_devices` modules' devices;
    before the first TF op."""
    del num_devices, intra_op_threads

  @classmethod
  def missing_devices(cls, num_modules):
    """Why this machine cannot run `num_modules` modules, or None."""
    del num_modules

  @classmethod
  def strategy(cls, num_modules, resolver=None):
    """The `tf.distribute.Strategy` a run of this placement trains under.

    Args:
      num_modules: K.
      resolver: a cluster resolver, for the placements that connect to one.

    Raises:
      ConnectionError: the device could not be reached (its cause is TF's
        error).
    """
    del num_modules, resolver
    return tf.distribute.get_strategy()


class SingleRuntime(Runtime):
  """Every module on one device: mirrored over this host's GPUs."""

  data_parallel = True

  @classmethod
  def strategy(cls, num_modules, resolver=None):
    """Mirrored over this host's GPUs when it has several, else default."""
    del num_modules, resolver
    if len(tf.config.list_logical_devices("GPU")) > 1:
      return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


class SimulatedRuntime(Runtime):
  """Module k on logical CPU k: the host CPU split before the runtime."""

  splits_host_cpu = True

  @classmethod
  def configure_devices(cls, num_devices, intra_op_threads=1):
    placement_lib.configure_simulated_devices(
        num_devices, intra_op_threads=intra_op_threads)


class GpuRuntime(Runtime):
  """Module k on GPU k: one GPU per module, checked before the run."""

  @classmethod
  def missing_devices(cls, num_modules):
    gpus = len(tf.config.list_physical_devices("GPU"))
    if gpus < num_modules:
      return f"one GPU per module: {num_modules} modules but {gpus} GPUs"
    return None


class ClusterRuntime(Runtime):
  """Module k on worker t(k): the workers are connected to first."""

  needs_cluster = True


class TpuRuntime(Runtime):
  """Module k on logical core k of every replica of a TPUStrategy."""

  needs_tpu = True

  @classmethod
  def strategy(cls, num_modules, resolver=None):
    """A TPUStrategy of K cores per replica on the TPU `resolver` names.

    Raises:
      ConnectionError: the TPU could not be reached or initialised.
    """
    try:
      tf.config.experimental_connect_to_cluster(resolver)
      topology = tf.tpu.experimental.initialize_tpu_system(resolver)
    except (OSError, RuntimeError, ValueError, tf.errors.OpError) as e:
      raise ConnectionError(str(e)) from e
    assignment = placement_lib.tpu_device_assignment(topology, num_modules)
    return tf.distribute.TPUStrategy(
        resolver, experimental_device_assignment=assignment)


# Each built-in placement class's runtime; its subclasses share it.
RUNTIMES = {
    placement_lib.SinglePlacement: SingleRuntime,
    placement_lib.SimulatedPlacement: SimulatedRuntime,
    placement_lib.GpuPlacement: GpuRuntime,
    placement_lib.ClusterPlacement: ClusterRuntime,
    placement_lib.TpuPlacement: TpuRuntime,
}


def of(placement):
  """The `Runtime` class of a placement: of its class or nearest base in
  `RUNTIMES`, else `Runtime` (no set-up, the default strategy).

  Args:
    placement: a registered name or a `Placement` subclass.

  Raises:
    ValueError: no placement has that name.
  """
  for cls in placement_lib.get(placement).__mro__:
    if cls in RUNTIMES:
      return RUNTIMES[cls]
  return Runtime
