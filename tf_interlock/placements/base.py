"""The base of every placement, and the registry of flag values.

A placement is one class. Its methods give module k's device scope and check
that module k's variables really are where they belong; its three class
attributes answer what the trainer decides by placement (whether every
module runs in this process, what one XLA program holds, and the local
device type module k is pinned to). `register(cls)` maps the class's `kind`
(the `--placement` flag value) to the class, so a new placement is one class
and one `register` call: no caller compares a kind. What only the binaries
set up before the TF runtime starts (logical devices, the strategy, a
cluster or a TPU to connect to) is theirs: `train/placement_runtime.py`.
"""

import contextlib

import tensorflow as tf

_REGISTRY = {}


def register(cls, kind=None):
  """Makes `cls` the placement named `kind` (default: `cls.kind`).

  Args:
    cls: a subclass of `Placement`.
    kind: the name (the `--placement` value); None = `cls.kind`.

  Returns:
    `cls`, so that `register` can decorate a class.

  Raises:
    ValueError: `cls` is no `Placement`, or the name is empty.
  """
  kind = kind or getattr(cls, "kind", None)
  if not (isinstance(cls, type) and issubclass(cls, Placement)):
    raise ValueError(f"A placement must subclass Placement. "
                     f"Received: cls={cls!r}")
  if not isinstance(kind, str) or not kind:
    raise ValueError(f"A placement needs a non-empty kind. "
                     f"Received: kind={kind!r}")
  if cls.kind != kind:
    cls = type(cls.__name__, (cls,), {"kind": kind})
  _REGISTRY[kind] = cls
  return cls


def unregister(kind):
  """Forgets the placement named `kind` (a test's own, say); returns its
  class, or None when none was registered under that name."""
  return _REGISTRY.pop(kind, None)


def names():
  """The registered placement names, in registration order."""
  return tuple(_REGISTRY)


def get(kind):
  """The placement class registered as `kind`.

  Raises:
    ValueError: no placement has that name.
  """
  if isinstance(kind, type) and issubclass(kind, Placement):
    return kind
  if kind not in _REGISTRY:
    raise ValueError(f"placement must be one of {names()}. "
                     f"Received: placement={kind!r}")
  return _REGISTRY[kind]


class Placement:
  """Where module k runs; the base of every placement.

  `Placement(kind, devices, distribute)` builds the registered class of
  `kind` (so `Placement("simulated", devices)` is a `SimulatedPlacement`);
  a subclass is also built directly, `SimulatedPlacement(devices=...)`.

  Args:
    kind: a registered name; None on a subclass (its own).
    devices: one device name per module (None where the kind names none).
    distribute: the `tf.distribute.Strategy` the trainer runs under.

  Class attributes (what the trainer asks; see each subclass):
    kind: the name, the `--placement` flag value.
    one_process: every module runs in this process on CPU or GPU (not a
      TPU, not a cluster's workers): each module's body and update may be a
      `tf.function` of its own (`module_functions`), `step_loop`'s "auto"
      may loop a traced step and the training call may take TF's lighter
      graph optimisation (`tf_private`). False keeps every op inline.
    xla_unit: what one XLA program holds under `jit_compile`: "module"
      (each module's functions, on the module's own device), "replica_step"
      (the whole replica step: every module on one device), or None (not
      compiled by us; see `compiles_step` for a strategy that compiles
      every step itself).
    replica_device_type: "CPU" or "GPU" when module k is pinned to this
      process's local device k of that type: a strategy with several
      replicas (which creates each variable on its own devices) is refused,
      and a process of a replicas x modules job (`replicas.connect`) may
      use the placement; None otherwise.
  """

  kind = None
  one_process = False
  xla_unit = None
  replica_device_type = None

  def __new__(cls, kind=None, devices=None, distribute=None):
    del devices, distribute  # __init__'s
    if cls is Placement:
      if kind is None:
        raise ValueError(f"Placement needs a kind, one of {names()}. "
                         f"Received: kind=None")
      cls = get(kind)
    return super().__new__(cls)

  def __init__(self, kind=None, devices=None, distribute=None):
    if kind is not None and kind != self.kind:
      raise ValueError(f"{type(self).__name__} is placement {self.kind!r}. "
                       f"Received: kind={kind!r}")
    self.devices = list(devices) if devices is not None else None
    self.distribute = distribute

  @classmethod
  def build(cls, num_modules, distribute=None, module_devices=None):
    """Builds and checks the placement of `num_modules` modules.

    Args:
      num_modules: K.
      distribute: the strategy the trainer runs under.
      module_devices: per module, the index of its device, for the kinds
        that name devices; None = module k on device k.

    Returns:
      An instance.
    """
    del num_modules, module_devices
    return cls(devices=None, distribute=distribute)

  # What a trainer asks.

  def check_modules(self, num_modules):
    """Raises unless every one of `num_modules` modules has its device."""
    if self.devices is not None and len(self.devices) != num_modules:
      raise ValueError(
          f"placement={self.kind} has {len(self.devices)} devices for "
          f"{num_modules} modules; need one per module. "
          f"Received: num_modules={num_modules}")

  def check_trainer(self, distribute, float16):
    """Raises when the trainer's strategy or policy cannot run here.

    Args:
      distribute: the trainer's `tf.distribute.Strategy`.
      float16: whether any module computes under mixed_float16.
    """
    replicas = distribute.num_replicas_in_sync
    if self.replica_device_type and replicas > 1:
      raise ValueError(
          f"placement={self.kind} puts module k on device k, but "
          f"a strategy with {replicas} replicas creates every variable on "
          f"its own devices. Use placement=single for data parallelism, or "
          f"placement=tpu with a TPUStrategy for both. "
          f"Received: placement={self.kind}")
    if float16 and self.compiles_step(distribute):
      raise ValueError(
          "mixed_float16 is not supported on TPU: TPUs compute in "
          "bfloat16, which needs no loss scaling; use mixed_bfloat16. "
          "Received: policy=mixed_float16, placement=tpu")

  def compiles_step(self, distribute):
    """Whether `distribute` compiles every replica step itself into one XLA
    program on a device that runs only XLA programs (a TPU's strategy):
    the trainer then compiles no step of its own, jit_compile=False cannot
    hold and mixed_float16 is refused. False here; see `TpuPlacement` and
    `SinglePlacement` (which a TPUStrategy may mirror).

    Args:
      distribute: the trainer's `tf.distribute.Strategy`.
    """
    del distribute
    return False

  def on_accelerator(self):
    """Whether the modules run on a non-CPU device (GPU or TPU)."""
    if self.devices is not None:
      return any("CPU" not in tf.DeviceSpec.from_string(d).device_type.upper()
                 for d in self.devices)
    return any(d.device_type != "CPU"
               for d in tf.config.list_physical_devices())

  def scope(self, k):
    """Device scope for module k's variables and ops."""
    if self.devices is None:
      return contextlib.nullcontext()
    return tf.device(self.devices[k])

  def annotate(self, tensor, k):
    """`tensor` pinned to module k's device where the strategy needs it
    (TPU model parallelism); as it is elsewhere."""
    del k
    return tensor

  def check_variables(self, k, variables, hint=""):
    """Raises unless every variable of module k is on module k's device.

    A layer built before the placement existed keeps the device it was
    built on, whatever scope it is called under later; TF's soft placement
    would otherwise silently run a "model-parallel" run serially.

    Args:
      k: the 0-based module index (messages count modules from 1).
      variables: `(description, variable)` pairs: Keras or TF variables.
      hint: how to fix a misplaced one, added to the message.

    Raises:
      ValueError: naming the first misplaced variable, where it is and where
        it should be.
    """
    if self.devices is None:
      return
    for description, variable in variables:
      value = getattr(variable, "value", variable)
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
