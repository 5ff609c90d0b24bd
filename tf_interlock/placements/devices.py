"""The placements that name one device per module, and "single".

* "single": every module on one device (the data-parallel baseline).
* "simulated": module k on logical CPU device k; with one inter-op thread per
  device and one intra-op thread, each module gets one core at a time: the
  model-parallel simulation researchers use on one host.
* "gpu": module k on GPU k.
* "cluster": module k on the CPU of worker t(k) of a cluster this process is
  connected to (`tf_interlock.cluster.connect`), across processes or hosts.

A device that does not exist is an error: TF's soft placement would
otherwise silently run everything on CPU:0 and the "model-parallel" run
would be a serial one.
"""

import tensorflow as tf

from tf_interlock import cluster as cluster_lib
from tf_interlock import int_args
from tf_interlock.placements import base
from tf_interlock.placements import tpu


class SinglePlacement(base.Placement):
  """Every module on one device; a strategy may mirror the model (over
  GPUs, workers or a TPU's cores)."""

  kind = "single"
  one_process = True
  xla_unit = "replica_step"

  def compiles_step(self, distribute):
    """Whether `distribute` is a TPUStrategy (`tpu.compiles_every_step`)."""
    return tpu.compiles_every_step(distribute)


class DevicePlacement(base.Placement):
  """Module k on one of this process's devices of `device_type`.

  Subclasses name the `device_type` and may choose which device each module
  gets (`module_device_indices`).
  """

  device_type = None
  xla_unit = "module"
  # What to do when the devices are missing, added to the error.
  missing_hint = ""

  @classmethod
  def module_device_indices(cls, num_modules, module_devices=None):
    """Per module, the index of its device among `available_devices()`.

    Args:
      num_modules: K.
      module_devices: the caller's indices; None = module k on device k.

    Raises:
      ValueError: not one index >= 0 per module.
    """
    if module_devices is None:
      return list(range(num_modules))
    if len(module_devices) != num_modules or min(module_devices) < 0:
      raise ValueError(
          f"module_devices must give a device index >= 0 to each of the "
          f"{num_modules} modules. Received: module_devices={module_devices}")
    return list(module_devices)

  @classmethod
  def available_devices(cls):
    """This process's own devices of `device_type` (once connected to a
    cluster, the workers' devices are listed too and left out here)."""
    return [d.name for d in tf.config.list_logical_devices(cls.device_type)
            if tf.DeviceSpec.from_string(d.name).job in (None, "localhost")]

  @classmethod
  def build(cls, num_modules, distribute=None, module_devices=None):
    indices = cls.module_device_indices(num_modules, module_devices)
    found = cls.available_devices()
    needed = max(indices) + 1
    if len(found) < needed:
      raise ValueError(
          f"placement={cls.kind} needs {needed} {cls.device_type} devices "
          f"for {num_modules} modules but has {len(found)} {found}."
          f"{cls.missing_hint} Received: num_modules={num_modules}")
    return cls(devices=[found[d] for d in indices], distribute=distribute)


def split_host_cpu(num_devices, intra_op_threads=1, inter_op_threads=None):
  """K logical CPUs and the thread pools that run them; starts nothing.

  Unlike `configure_simulated_devices` it neither checks nor lists the
  devices, so the runtime stays unstarted (collective ops, for one, must be
  configured after this and before the runtime starts).

  Args:
    num_devices: the number of logical CPU devices.
    intra_op_threads: threads each op may use.
    inter_op_threads: ops run at once; None = num_devices.

  Raises:
    RuntimeError: TF's, when the runtime has started already.
  """
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
  tf.config.threading.set_inter_op_parallelism_threads(
      inter_op_threads or num_devices)
  tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)


def configure_simulated_devices(num_devices, intra_op_threads=1,
                                inter_op_threads=None):
  """Splits the host CPU into `num_devices` logical devices.

  Must run before the TF runtime starts (before any tensor is created).
  Inter-op threads >= num_devices let the devices' ops run at the same time;
  intra_op = 1 (the default) stops one op from taking every core. Both
  thread pools are process-wide (see `step_model.threading_plan`).

  Args:
    num_devices: the number of logical CPU devices (usually K).
    intra_op_threads: threads each op may use (>= 1).
    inter_op_threads: ops run at once; None = num_devices.

  Returns:
    The logical device names.
  """
  for name, value in (("num_devices", num_devices),
                      ("intra_op_threads", intra_op_threads),
                      ("inter_op_threads", inter_op_threads or 1)):
    if not int_args.is_int(value) or value < 1:
      raise ValueError(f"{name} must be an int >= 1. "
                       f"Received: {name}={value!r}")
  cpu = tf.config.list_physical_devices("CPU")[0]
  existing = tf.config.get_logical_device_configuration(cpu)
  if not existing or len(existing) < num_devices:
    try:
      split_host_cpu(num_devices, intra_op_threads, inter_op_threads)
    except RuntimeError as e:
      raise RuntimeError(
          f"Cannot create {num_devices} logical CPU devices after the TF "
          f"runtime has started; call configure_simulated_devices first. "
          f"Received: num_devices={num_devices}") from e
  elif intra_op_threads != 1 and (
      tf.config.threading.get_intra_op_parallelism_threads() !=
      intra_op_threads):
    # The devices exist already, so the runtime has started and its thread
    # pools are fixed: a plan with more threads per op cannot be applied.
    raise RuntimeError(
        f"Cannot give ops {intra_op_threads} intra-op threads: the TF "
        f"runtime started with "
        f"{tf.config.threading.get_intra_op_parallelism_threads()} (0: TF's "
        f"default); call configure_simulated_devices first. "
        f"Received: intra_op_threads={intra_op_threads}")
  return [d.name for d in tf.config.list_logical_devices("CPU")][:num_devices]


class SimulatedPlacement(DevicePlacement):
  """Module k on logical CPU device k of this host."""

  kind = "simulated"
  one_process = True
  device_type = "CPU"
  replica_device_type = "CPU"
  missing_hint = (" Call placement.configure_simulated_devices(K) before TF "
                  "starts.")


class GpuPlacement(DevicePlacement):
  """Module k on GPU k of this host."""

  kind = "gpu"
  one_process = True
  device_type = "GPU"
  replica_device_type = "GPU"


class ClusterPlacement(DevicePlacement):
  """Module k on the CPU of worker t(k) (`module_devices` gives t(k));
  several modules may share a worker. The remote devices keep every op
  inline (no per-module `tf.function`s)."""

  kind = "cluster"
  device_type = "worker"
  missing_hint = " Connect first: tf_interlock.cluster.connect(spec)."

  @classmethod
  def available_devices(cls):
    return cluster_lib.worker_devices()
