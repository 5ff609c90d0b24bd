"""Depthwise placement: each module's variables and ops on its own device.

Kinds:
* "single": every module on one device (the data-parallel baseline).
* "simulated": module k on logical CPU device k; with one inter-op thread per
  device and one intra-op thread, each module gets one core at a time: the
  model-parallel simulation researchers use on one host.
* "gpu": module k on GPU k.
* "tpu": module k on logical core k of each replica of a `TPUStrategy` whose
  `DeviceAssignment` gives every replica K cores (data parallel x depthwise).

A device that does not exist is an error: TF's soft placement would
otherwise silently run everything on CPU:0 and the "model-parallel" run
would be a serial one.
"""

import contextlib
import itertools

import numpy as np
import tensorflow as tf

KINDS = ("single", "simulated", "gpu", "tpu")


def configure_simulated_devices(num_devices):
  """Splits the host CPU into `num_devices` logical devices, one core each.

  Must run before the TF runtime starts (before any tensor is created).
  Inter-op threads >= num_devices let the devices' ops run at the same time;
  intra_op = 1 stops one op from taking every core.

  Args:
    num_devices: the number of logical CPU devices (usually K).

  Returns:
    The logical device names.
  """
  if num_devices < 1:
    raise ValueError(f"num_devices must be >= 1. "
                     f"Received: num_devices={num_devices}")
  cpu = tf.config.list_physical_devices("CPU")[0]
  existing = tf.config.get_logical_device_configuration(cpu)
  if not existing or len(existing) < num_devices:
    try:
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
      tf.config.threading.set_inter_op_parallelism_threads(num_devices)
      tf.config.threading.set_intra_op_parallelism_threads(1)
    except RuntimeError as e:
      raise RuntimeError(
          f"Cannot create {num_devices} logical CPU devices after the TF "
          f"runtime has started; call configure_simulated_devices first. "
          f"Received: num_devices={num_devices}") from e
  return [d.name for d in tf.config.list_logical_devices("CPU")][:num_devices]


class Placement:
  """Where module k runs.

  Args:
    kind: one of `KINDS`.
    devices: one device name per module (None for "single" and "tpu").
    distribute: the `tf.distribute.Strategy` ("tpu" needs a TPUStrategy).
  """

  def __init__(self, kind, devices=None, distribute=None):
    self.kind = kind
    self.devices = list(devices) if devices is not None else None
    self.distribute = distribute

  def check_modules(self, num_modules):
    """Raises unless every one of `num_modules` modules has its device."""
    if self.devices is not None and len(self.devices) != num_modules:
      raise ValueError(
          f"placement={self.kind} has {len(self.devices)} devices for "
          f"{num_modules} modules; need one per module. "
          f"Received: num_modules={num_modules}")

  def scope(self, k):
    """Device scope for module k's variables and ops."""
    if self.devices is None:
      return contextlib.nullcontext()
    return tf.device(self.devices[k])

  def annotate(self, tensor, k):
    """Pins `tensor` to module k's logical core (TPU model parallelism)."""
    if self.kind != "tpu":
      return tensor
    return self.distribute.experimental_assign_to_logical_device(tensor, k)

  def __repr__(self):
    return f"Placement(kind={self.kind!r}, devices={self.devices!r})"


def make_placement(kind, num_modules, distribute=None):
  """Builds and checks the placement of `num_modules` modules.

  Args:
    kind: "single", "simulated", "gpu" or "tpu".
    num_modules: K.
    distribute: the strategy the trainer runs under.

  Returns:
    A `Placement`.

  Raises:
    ValueError: unknown kind, or fewer devices than modules.
  """
  if kind not in KINDS:
    raise ValueError(f"placement must be one of {KINDS}. "
                     f"Received: placement={kind!r}")
  if kind == "single":
    return Placement(kind, None, distribute)
  if kind == "tpu":
    cores = getattr(getattr(distribute, "extended", None),
                    "num_logical_cores_per_replica", None)
    if cores is None or cores < num_modules:
      raise ValueError(
          f"placement=tpu needs a TPUStrategy with >= {num_modules} logical "
          f"cores per replica (see tpu_device_assignment). "
          f"Received: cores_per_replica={cores}")
    return Placement(kind, None, distribute)
  device_type = "CPU" if kind == "simulated" else "GPU"
  found = [d.name for d in tf.config.list_logical_devices(device_type)]
  if len(found) < num_modules:
    hint = (" Call placement.configure_simulated_devices(K) before TF "
            "starts." if kind == "simulated" else "")
    raise ValueError(
        f"placement={kind} needs one {device_type} device per module: "
        f"{num_modules} modules but {len(found)} devices {found}.{hint} "
        f"Received: num_modules={num_modules}")
  return Placement(kind, found[:num_modules], distribute)


def computation_shape(mesh_shape, cores_per_replica):
  """A compact [x, y, z, core] block of `cores_per_replica` TPU cores.

  Neighbouring modules exchange activations every step, so the block is
  filled first with the cores of one chip, then along the fewest mesh axes.

  Args:
    mesh_shape: the topology's [x, y, z, cores_per_chip].
    cores_per_replica: K, the cores one replica's modules need.

  Returns:
    A list of 4 ints whose product is `cores_per_replica`.
  """
  fits = []
  for shape in itertools.product(*[range(1, m + 1) for m in mesh_shape]):
    if (int(np.prod(shape)) == cores_per_replica and
        all(m % s == 0 for m, s in zip(mesh_shape, shape))):
      fits.append(shape)
  if not fits:
    raise ValueError(
        f"Cannot tile the TPU mesh {list(mesh_shape)} with blocks of "
        f"{cores_per_replica} cores. Received: num_modules={cores_per_replica}")
  return list(min(fits, key=lambda s: (-s[3], sum(d > 1 for d in s[:3]),
                                       s[:3])))


def tpu_device_assignment(topology, num_modules):
  """DeviceAssignment: K cores per replica, R = cores / K replicas.

  Args:
    topology: a `tf.tpu.experimental.Topology` (from
      `tf.tpu.experimental.initialize_tpu_system`).
    num_modules: K, cores per replica.

  Returns:
    A `tf.tpu.experimental.DeviceAssignment`.
  """
  total = int(np.prod(topology.mesh_shape))
  if num_modules < 1 or total % num_modules:
    raise ValueError(
        f"num_modules must divide the {total} TPU cores. "
        f"Received: num_modules={num_modules}")
  shape = computation_shape(topology.mesh_shape, num_modules)
  return tf.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=shape, num_replicas=total // num_modules)
