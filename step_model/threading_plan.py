"""How many intra-op threads and how many modules each simulated device gets.

On a host with C cores, K modules can run as K logical devices with one
thread each (the model-parallel simulation: at most C ops at once), as fewer
devices holding several modules each, or with t intra-op threads per op (one
op then uses t cores). Which is fastest depends on the strategy: end-to-end
training has almost no parallelism between modules (Gomez et al. 2022,
arXiv:2010.04116, Sec. 3: every module waits for the global loss), so on few
cores it gains more from threads inside each op; local and pairwise training
keep every device busy and gain more from one thread per device.

`choose_plan` asks the schedule model (`schedule.simulate`) for every
candidate plan and keeps the fastest. TF's thread pools are fixed when the
runtime starts, so a plan applies to a whole process.

Pools: by default all local CPU devices of a process share ONE intra-op pool
(`LocalDevice::use_global_threadpool_` in TF's local_device.cc), so "D
devices x t threads" would run on t cores, not D x t. `use_own_pools` sets
TF_OVERRIDE_GLOBAL_THREADPOOL=1 before the runtime starts, and every device
then gets a pool of t threads of its own (tests/test_device_pools.py counts
them). With t = 1 the pools do not matter: an op runs inline on the inter-op
thread that runs it. A plan says what it shares: `shared_pool` (one pool of
t for all devices) and `num_cores` (more threads than cores: they share the
cores), in `describe` and `cores_in_use`; the schedule model is given only
the cores a plan really has.
"""

import dataclasses
import os
from typing import Optional, Sequence, Tuple

from step_model import schedule

# Speedup of one op on t threads: 1 + (t - 1) * e. e = 0.64 was measured on
# the 2-core test machine (a 512x1024x1024 matmul: 11.8 ms on one thread,
# 7.2 ms on two).
DEFAULT_THREAD_EFFICIENCY = 0.64

# Costs for a choice made before anything can be measured: modules of equal
# size whose backward ops cost about a forward each, as dense and conv layers
# do, with a small aux head and update.
NOMINAL_COST = schedule.ModuleCost(forward=1.0, input_vjp=1.0, weight_vjp=1.0,
                                   aux=0.05, update=0.05)

# A plan whose threads take turns on the cores (D x t > C) is chosen over
# one that gives each thread a core only when it is predicted at least this
# much faster. The model charges a time-shared core as a core given to the
# ready op it ranks first; the OS time-slices it instead, whatever waits on
# it. On the 2-core VM (MLP K = 4, 4 devices x 1 thread on 2 cores against
# 2 devices x 1 thread, 2 modules each; docs/results/speed_held) 2-wise was
# predicted 3% faster time-shared and measured 1.34x slower; over two runs
# measured / model was 1.03-1.27 for the time-shared cells.
TIME_SHARING_MARGIN = 0.25


@dataclasses.dataclass(frozen=True)
class ThreadingPlan:
  """One way to run K modules on the host's cores.

  Attributes:
    num_devices: logical devices D (the process's inter-op threads).
    threads_per_device: intra-op threads t of every op.
    module_devices: per module, its device index (contiguous blocks).
    shared_pool: whether the devices share one intra-op pool of t threads
      (TF's default) instead of a pool each (`use_own_pools`).
    num_cores: the host's cores the plan was made for (None: unknown); not
      part of the plan's identity.
  """
  num_devices: int
  threads_per_device: int
  module_devices: Tuple[int, ...]
  shared_pool: bool = False
  num_cores: Optional[int] = dataclasses.field(default=None, compare=False)

  @property
  def modules_per_device(self):
    """The most modules any one device holds."""
    return max(self.module_devices.count(d) for d in range(self.num_devices))

  @property
  def threads(self):
    """Threads that run ops at once: t of the one shared pool, else D x t."""
    return self.threads_per_device * (1 if self.shared_pool
                                      else self.num_devices)

  def cores_in_use(self, num_cores=None):
    """The cores the plan's ops can run on: its threads, at most the host's
    (`num_cores`, default the plan's own; None when neither is known)."""
    cores = self.num_cores if num_cores is None else num_cores
    return None if cores is None else min(cores, self.threads)

  def time_shared(self, num_cores=None):
    """Whether the plan has more threads than the host's cores
    (`num_cores`, default the plan's own; False when neither is known)."""
    cores = self.num_cores if num_cores is None else num_cores
    return cores is not None and self.threads > cores

  def describe(self):
    """E.g. "4 devices x 1 thread", "2 devices x 1 thread, 2 modules each",
    "4 devices x 4 threads, one shared pool (4 cores)" or "4 devices x 2
    threads (8 threads on 2 cores)"."""
    text = (f"{self.num_devices} device{'s' * (self.num_devices > 1)} x "
            f"{self.threads_per_device} thread"
            f"{'s' * (self.threads_per_device > 1)}")
    if self.modules_per_device > 1:
      text += f", {self.modules_per_device} modules each"
    if self.shared_pool and self.num_devices > 1 and (
        self.threads_per_device > 1):
      text += f", one shared pool ({self.cores_in_use() or self.threads} cores)"
    elif self.time_shared():
      text += f" ({self.threads} threads on {self.num_cores} cores)"
    return text


# Read by TF when the runtime creates its CPU devices
# (OverrideGlobalThreadPoolFromEnvironment in local_device.cc): "1" gives
# every device an intra-op pool of its own instead of the process's one.
OWN_POOLS_ENV = "TF_OVERRIDE_GLOBAL_THREADPOOL"


def use_own_pools(plan):
  """Makes `plan` what it says: each device its own pool of t threads.

  Must run before the TF runtime starts (before the first op: importing TF
  and listing physical devices are fine); later, TF has read the variable.
  A plan of one thread per device, or a `shared_pool` plan, changes
  nothing: with t = 1 ops run inline on the inter-op threads.

  Args:
    plan: the `ThreadingPlan` this process runs.

  Returns:
    Whether the variable was set.
  """
  if plan.shared_pool or plan.threads_per_device == 1:
    return False
  os.environ[OWN_POOLS_ENV] = "1"
  return True


def host_cores():
  """The cores this process may run on (its CPU affinity)."""
  return len(os.sched_getaffinity(0))


def _check_int(name, value, minimum):
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(
        f"{name} must be an int >= {minimum}. Received: {name}={value!r}")


def make_plan(num_modules, num_devices, threads_per_device, *,
              num_cores=None, shared_pool=False):
  """K modules in contiguous, balanced blocks on D devices of t threads.

  Module k goes to device floor(k D / K): K = 4, D = 2 gives (0, 0, 1, 1).

  Args:
    num_modules: K >= 1.
    num_devices: D, 1 <= D <= K.
    threads_per_device: t >= 1.
    num_cores: the host's cores, or None (see `ThreadingPlan`).
    shared_pool: whether the devices share one pool (see `ThreadingPlan`).

  Returns:
    A `ThreadingPlan`.
  """
  _check_int("num_modules", num_modules, 1)
  _check_int("threads_per_device", threads_per_device, 1)
  _check_int("num_devices", num_devices, 1)
  if num_devices > num_modules:
    raise ValueError(f"num_devices must be <= num_modules={num_modules}. "
                     f"Received: num_devices={num_devices}")
  if num_cores is not None:
    _check_int("num_cores", num_cores, 1)
  return ThreadingPlan(
      num_devices, threads_per_device,
      tuple(k * num_devices // num_modules for k in range(num_modules)),
      # With one thread per device ops run inline on the inter-op threads:
      # there is no pool to share.
      bool(shared_pool) and threads_per_device > 1, num_cores)


def candidate_plans(num_modules, num_cores):
  """Every plan the host can honour: D devices (D divides K: equal modules
  per device), each with a pool of its own of t threads, D x t <= num_cores;
  and, when K > num_cores, D devices of one thread each, which take turns
  on the cores (the plan says so: "4 devices x 1 thread (4 threads on 2
  cores)")."""
  _check_int("num_cores", num_cores, 1)
  return [make_plan(num_modules, d, t, num_cores=num_cores)
          for d in range(num_modules, 0, -1) if num_modules % d == 0
          for t in range(1, max(1, num_cores // d) + 1)]


def predict(costs, strategy, plan, num_cores, *,
            thread_efficiency=DEFAULT_THREAD_EFFICIENCY, **kwargs):
  """The schedule model's step time of `strategy` under `plan`.

  Args:
    costs: one-thread `schedule.ModuleCost` per module.
    strategy: a strategy name or object.
    plan: a `ThreadingPlan`.
    num_cores: the host's cores.
    thread_efficiency: e of `schedule.thread_speedup`.
    **kwargs: passed on to `schedule.simulate` (has_aux, num_microbatches).

  Returns:
    A `schedule.ScheduleResult`. A `shared_pool` plan has t cores at most:
    its ops hold them in turn, whatever D.
  """
  return schedule.simulate(
      costs, strategy, num_cores=plan.cores_in_use(num_cores),
      threads_per_device=plan.threads_per_device,
      module_devices=plan.module_devices,
      thread_efficiency=thread_efficiency, **kwargs)


def _check_overrides(num_modules, threads_per_device, modules_per_device):
  if threads_per_device is not None:
    _check_int("threads_per_device", threads_per_device, 1)
  if modules_per_device is not None:
    _check_int("modules_per_device", modules_per_device, 1)
    if num_modules % modules_per_device:
      raise ValueError(
          f"modules_per_device must divide num_modules={num_modules}. "
          f"Received: modules_per_device={modules_per_device}")


def choose_plan(costs: Sequence[schedule.ModuleCost], strategy, num_cores, *,
                threads_per_device=None, modules_per_device=None,
                thread_efficiency=DEFAULT_THREAD_EFFICIENCY, **kwargs):
  """The candidate plan (`candidate_plans`) with the smallest predicted
  step time; with `threads_per_device` or `modules_per_device` fixed, the
  best plan that keeps them, even one whose threads share the cores.

  Ties (within 1e-9, relative) go to more devices, then fewer threads: the
  plan closest to one device per module. A chosen plan whose threads take
  turns on the cores must be predicted `TIME_SHARING_MARGIN` faster than
  the best plan that gives each thread a core (when not fixed by the user).

  Args:
    costs: one-thread op costs per module (`NOMINAL_COST` * K when nothing
      was measured).
    strategy: the strategy to train.
    num_cores: the host's cores.
    threads_per_device: t fixed by the user, or None to choose it.
    modules_per_device: modules per device fixed by the user (must divide
      K), or None to choose it.
    thread_efficiency: e of `schedule.thread_speedup`.
    **kwargs: passed on to `schedule.simulate`.

  Returns:
    (plan, predicted step time). A fixed t above num_cores is not simulated
    (the model needs t <= num_cores): it is returned as asked, with None.
  """
  num_modules = len(costs)
  _check_overrides(num_modules, threads_per_device, modules_per_device)
  if threads_per_device is not None and threads_per_device > num_cores:
    return make_plan(num_modules, num_modules // (modules_per_device or 1),
                     threads_per_device, num_cores=num_cores), None
  best, honoured = None, None
  # A plan fixed by the user may share the cores (it says so); the chooser
  # offers only the plans the host can honour.
  fixed = threads_per_device is not None or modules_per_device is not None
  plans = [make_plan(num_modules, d, t, num_cores=num_cores)
           for d in range(num_modules, 0, -1) if num_modules % d == 0
           for t in range(1, num_cores + 1)] if fixed else candidate_plans(
               num_modules, num_cores)
  for plan in plans:
    if threads_per_device not in (None, plan.threads_per_device):
      continue
    if modules_per_device is not None and (
        plan.num_devices * modules_per_device != num_modules):
      continue
    step = predict(costs, strategy, plan, num_cores,
                   thread_efficiency=thread_efficiency, **kwargs).step_time
    if best is None or step < best[1] * (1 - 1e-9):
      best = (plan, step)
    if not plan.time_shared() and (honoured is None or
                                   step < honoured[1] * (1 - 1e-9)):
      honoured = (plan, step)
  if fixed or honoured is None or not best[0].time_shared():
    return best
  return best if best[1] < honoured[1] * (1 - TIME_SHARING_MARGIN) else (
      honoured)


def plan_for(num_modules, strategy, num_cores, threads_per_device=None,
             modules_per_device=None,
             thread_efficiency=DEFAULT_THREAD_EFFICIENCY):
  """The plan a binary uses before it can measure: from nominal costs.

  Args:
    num_modules: K.
    strategy: the strategy to train.
    num_cores: the host's cores.
    threads_per_device: t, or None to choose it.
    modules_per_device: modules per device, or None to choose it.
    thread_efficiency: e of `schedule.thread_speedup`.

  Returns:
    A `ThreadingPlan`.
  """
  _check_int("num_modules", num_modules, 1)
  return choose_plan([NOMINAL_COST] * num_modules, strategy, num_cores,
                     threads_per_device=threads_per_device,
                     modules_per_device=modules_per_device,
                     thread_efficiency=thread_efficiency)[0]
