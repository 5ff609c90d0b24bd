"""Depthwise placement: each module's variables and ops on its own device.

Each placement is one class (`tf_interlock/placements/`), registered under
its `--placement` name:

* "single" (`SinglePlacement`): every module on one device (the
  data-parallel baseline).
* "simulated" (`SimulatedPlacement`): module k on logical CPU device k; with
  one inter-op thread per device and one intra-op thread, each module gets
  one core at a time: the model-parallel simulation researchers use on one
  host.
* "gpu" (`GpuPlacement`): module k on GPU k.
* "tpu" (`TpuPlacement`): module k on logical core k of each replica of a
  `TPUStrategy` whose `DeviceAssignment` gives every replica K cores (data
  parallel x depthwise).
* "cluster" (`ClusterPlacement`): module k on the CPU of worker t(k) of a
  cluster this process is connected to (`tf_interlock.cluster.connect`),
  across processes or hosts.

A new placement subclasses `Placement` (or one of these), sets its class
attributes and calls `register(cls)`; `make_placement(name, K)` and the
binaries' `--placement=name` then build it. A device that does not exist is
an error, and `Placement.check_variables` verifies, after the trainer's
build, that each module's variables really are where they belong.
"""

from tf_interlock.placements import base
from tf_interlock.placements import devices
from tf_interlock.placements import tpu

Placement = base.Placement
register = base.register
unregister = base.unregister
names = base.names
get = base.get
same_device = base.same_device

SinglePlacement = devices.SinglePlacement
DevicePlacement = devices.DevicePlacement
SimulatedPlacement = devices.SimulatedPlacement
GpuPlacement = devices.GpuPlacement
ClusterPlacement = devices.ClusterPlacement
TpuPlacement = tpu.TpuPlacement

split_host_cpu = devices.split_host_cpu
configure_simulated_devices = devices.configure_simulated_devices
computation_shape = tpu.computation_shape
tpu_device_assignment = tpu.tpu_device_assignment

for _cls in (SinglePlacement, SimulatedPlacement, GpuPlacement, TpuPlacement,
             ClusterPlacement):
  register(_cls)

# The built-in placements; `names()` also lists those registered later.
KINDS = names()


def make_placement(kind, num_modules, distribute=None, module_devices=None):
  """Builds and checks the placement of `num_modules` modules.

  Args:
    kind: a registered name ("single", "simulated", "gpu", "tpu",
      "cluster", or one a user registered) or a `Placement` subclass.
    num_modules: K.
    distribute: the strategy the trainer runs under.
    module_devices: the kinds that name devices ("simulated", "gpu",
      "cluster"): per module, the index of its device ("cluster": its
      worker task; several modules may share one); None = module k on
      device k.

  Returns:
    A `Placement` of the registered class.

  Raises:
    ValueError: unknown kind, or fewer devices than modules.
  """
  return get(kind).build(num_modules, distribute, module_devices)


def resolve(placement, num_modules, distribute=None, default="single"):
  """The `Placement` a door was given: the same forms for every door.

  Args:
    placement: None, a registered name, or a `Placement`.
    num_modules: K.
    distribute: the strategy the trainer runs under.
    default: what None means: a registered name, or None (kept as None: no
      device scopes, as `InterlockModel` takes it).

  Returns:
    A `Placement`, or None for None with `default=None`.

  Raises:
    ValueError: one line, for any other value or an unknown name.
  """
  if placement is None:
    if default is None:
      return None
    placement = default
  if isinstance(placement, str):
    return make_placement(placement, num_modules, distribute)
  if not isinstance(placement, Placement):
    raise ValueError(
        f"placement must be None, one of {names()} or a Placement. "
        f"Received: placement={placement!r}")
  return placement
