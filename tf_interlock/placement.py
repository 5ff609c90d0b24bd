"""Depthwise placement: each module's variables and ops on its own device.

Kinds:
* "single": every module on one device (the data-parallel baseline).
* "simulated": module k on logical CPU device k; with one inter-op thread per
  device and one intra-op thread, each module gets one core at a time: the
  model-parallel simulation researchers use on one host.
* "gpu": module k on GPU k.
* "tpu": module k on logical core k of each replica of a `TPUStrategy` whose
  `DeviceAssignment` gives every replica K cores (data parallel x depthwise).
* "cluster": module k on the CPU of worker t(k) of a cluster this process is
  connected to (`tf_interlock.cluster.connect`), across processes or hosts.

A device that does not exist is an error: TF's soft placement would
otherwise silently run everything on CPU:0 and the "model-parallel" run
would be a serial one. For the same reason `Placement.check_variables`
verifies, after the trainer's build, that each module's variables really are
where they belong: a layer that was built before the placement existed keeps
the device it was built on, whatever scope it is called under later.
"""

import contextlib
import functools
import itertools

import numpy as np
import tensorflow as tf

from tf_interlock import cluster as cluster_lib

KINDS = ("single", "simulated", "gpu", "tpu", "cluster")


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
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
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


class Placement:
  """Where module k runs.

  Args:
    kind: one of `KINDS`.
    devices: one device name per module (None for "single" and "tpu").
    distribute: the `tf.distribute.Strategy` ("tpu" needs a TPUStrategy).
  """

  def __init__(self, kind, devices=None, distribute=None):
    if kind not in KINDS:
      raise ValueError(f"placement must be one of {KINDS}. "
                       f"Received: placement={kind!r}")
    self.kind = kind
    self.devices = list(devices) if devices is not None else None
    self.distribute = distribute
    # "tpu": the logical core each variable was created under, keyed by the
    # variable's ref(); filled by `scope` (TPU variables carry no core index).
    self._logical_core = {}

  def check_modules(self, num_modules):
    """Raises unless every one of `num_modules` modules has its device."""
    if self.devices is not None and len(self.devices) != num_modules:
      raise ValueError(
          f"placement={self.kind} has {len(self.devices)} devices for "
          f"{num_modules} modules; need one per module. "
          f"Received: num_modules={num_modules}")

  def scope(self, k):
    """Device scope for module k's variables and ops.

    On TPU, `experimental_logical_device(k)` makes TPUStrategy create the
    variables made inside on logical core k of every replica (and, inside
    the replica function, places the ops there); without it every module's
    weights and slots would live on core 0.
    """
    if self.kind == "tpu":
      stack = contextlib.ExitStack()
      stack.enter_context(
          self.distribute.extended.experimental_logical_device(k))
      stack.enter_context(tf.variable_creator_scope(
          functools.partial(self._record_core, k)))
      return stack
    if self.devices is None:
      return contextlib.nullcontext()
    return tf.device(self.devices[k])

  def _record_core(self, k, next_creator, **kwargs):
    variable = next_creator(**kwargs)
    self._logical_core[variable.ref()] = k
    return variable

  def annotate(self, tensor, k):
    """Pins `tensor` to module k's logical core (TPU model parallelism)."""
    if self.kind != "tpu":
      return tensor
    return self.distribute.experimental_assign_to_logical_device(tensor, k)

  def check_variables(self, k, variables, hint=""):
    """Raises unless every variable of module k is on module k's device.

    Args:
      k: the 0-based module index (messages count modules from 1).
      variables: `(description, variable)` pairs: Keras or TF variables.
      hint: how to fix a misplaced one, added to the message.

    Raises:
      ValueError: naming the first misplaced variable, where it is and where
        it should be.
    """
    if self.kind == "single":
      return
    for description, variable in variables:
      value = getattr(variable, "value", variable)
      if self.kind == "tpu":
        core = self._logical_core.get(value.ref())
        if core != k:
          where = ("outside every module's scope" if core is None
                   else f"on logical core {core}")
          raise ValueError(
              f"{description} of module {k + 1} was created {where}; it "
              f"belongs on logical core {k}.{hint} "
              f"Received: placement=tpu")
        continue
      device = getattr(value, "device", "")
      if not same_device(device, self.devices[k]):
        raise ValueError(
            f"{description} of module {k + 1} is on {device or 'no device'}"
            f"; it belongs on {self.devices[k]}.{hint} "
            f"Received: placement={self.kind}")

  def __repr__(self):
    return f"Placement(kind={self.kind!r}, devices={self.devices!r})"


def same_device(a, b):
  """Whether two device names denote the same device.

  '/job:localhost/replica:0/task:0/device:CPU:1', '/device:CPU:1' and
  '/cpu:1' all name CPU 1; fields missing from either name are not compared,
  except the job: a name without one is this process's ("localhost"), so
  '/device:CPU:0' is not worker 1's '/job:worker/task:1/device:CPU:0'.

  Args:
    a: a device name.
    b: a device name.

  Returns:
    bool.
  """
  if not a or not b:
    return False
  x, y = tf.DeviceSpec.from_string(a), tf.DeviceSpec.from_string(b)
  for field in ("job", "replica", "task", "device_type", "device_index"):
    u, v = getattr(x, field), getattr(y, field)
    if field == "job":
      u, v = u or "localhost", v or "localhost"
    if field == "device_type" and u and v:
      u, v = u.upper(), v.upper()
    if u is not None and v is not None and u != v:
      return False
  return True


def make_placement(kind, num_modules, distribute=None, module_devices=None):
  """Builds and checks the placement of `num_modules` modules.

  Args:
    kind: "single", "simulated", "gpu", "tpu" or "cluster".
    num_modules: K.
    distribute: the strategy the trainer runs under.
    module_devices: "simulated", "gpu" and "cluster" only: per module, the
      index of its device ("cluster": its worker task; several modules may
      share one); None = module k on device k.

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
  if module_devices is None:
    module_devices = list(range(num_modules))
  elif len(module_devices) != num_modules or min(module_devices) < 0:
    raise ValueError(
        f"module_devices must give a device index >= 0 to each of the "
        f"{num_modules} modules. Received: module_devices={module_devices}")
  device_type = "CPU" if kind == "simulated" else "GPU"
  # This process's own devices: once connected to a cluster, the workers'
  # devices are listed too.
  found = [d.name for d in tf.config.list_logical_devices(device_type)
           if tf.DeviceSpec.from_string(d.name).job in (None, "localhost")]
  if kind == "cluster":
    device_type = "worker"
    found = cluster_lib.worker_devices()
  needed = max(module_devices) + 1
  if len(found) < needed:
    hint = {"simulated": " Call placement.configure_simulated_devices(K) "
                         "before TF starts.",
            "cluster": " Connect first: tf_interlock.cluster.connect(spec)."
            }.get(kind, "")
    raise ValueError(
        f"placement={kind} needs {needed} {device_type} devices for "
        f"{num_modules} modules but has {len(found)} {found}.{hint} "
        f"Received: num_modules={num_modules}")
  return Placement(kind, [found[d] for d in module_devices], distribute)


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
