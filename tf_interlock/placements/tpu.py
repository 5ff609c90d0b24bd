"""placement "tpu": module k on logical core k of each TPU replica.

A `TPUStrategy` whose `DeviceAssignment` gives every replica K cores runs
data parallel x depthwise: R = cores / K replicas, each holding all K
modules, module k on the replica's core k.
"""

import contextlib
import functools
import itertools

import numpy as np
import tensorflow as tf

from tf_interlock.placements import base


def compiles_every_step(distribute):
  """Whether `distribute` compiles every replica step itself, under any
  placement: a TPUStrategy, whose `run` makes each step one XLA program
  (jit_compile=False cannot hold there, and no step of ours is compiled
  again inside it)."""
  return isinstance(distribute, tf.distribute.TPUStrategy)


class TpuPlacement(base.Placement):
  """Module k on logical core k of every replica of a TPUStrategy.

  `TPUStrategy.run` compiles the replica step itself (`compiles_step`), so
  nothing is traced per module, and a TPU runs only XLA programs.
  """

  kind = "tpu"

  def __init__(self, kind=None, devices=None, distribute=None):
    super().__init__(kind, devices, distribute)
    # The logical core each variable was created under, keyed by the
    # variable's ref(); filled by `scope` (TPU variables carry no core index).
    self._logical_core = {}

  @classmethod
  def build(cls, num_modules, distribute=None, module_devices=None):
    del module_devices
    cores = getattr(getattr(distribute, "extended", None),
                    "num_logical_cores_per_replica", None)
    if cores is None or cores < num_modules:
      raise ValueError(
          f"placement=tpu needs a TPUStrategy with >= {num_modules} logical "
          f"cores per replica (see tpu_device_assignment). "
          f"Received: cores_per_replica={cores}")
    return cls(devices=None, distribute=distribute)

  def compiles_step(self, distribute):
    """Always: the placement runs only under a TPU's strategy."""
    del distribute
    return True

  def on_accelerator(self):
    return True

  def scope(self, k):
    """`experimental_logical_device(k)` makes TPUStrategy create the
    variables made inside on logical core k of every replica (and, inside
    the replica function, places the ops there); without it every module's
    weights and slots would live on core 0."""
    stack = contextlib.ExitStack()
    stack.enter_context(
        self.distribute.extended.experimental_logical_device(k))
    stack.enter_context(tf.variable_creator_scope(
        functools.partial(self._record_core, k)))
    return stack

  def _record_core(self, k, next_creator, **kwargs):
    variable = next_creator(**kwargs)
    self._logical_core[variable.ref()] = k
    return variable

  def annotate(self, tensor, k):
    """Pins `tensor` to module k's logical core (TPU model parallelism)."""
    return self.distribute.experimental_assign_to_logical_device(tensor, k)

  def check_variables(self, k, variables, hint=""):
    for description, variable in variables:
      value = getattr(variable, "value", variable)
      core = self._logical_core.get(value.ref())
      if core != k:
        where = ("outside every module's scope" if core is None
                 else f"on logical core {core}")
        raise ValueError(
            f"{description} of module {k + 1} was created {where}; it "
            f"belongs on logical core {k}.{hint} "
            f"Received: placement=tpu")


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
