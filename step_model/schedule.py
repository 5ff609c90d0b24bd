"""Predicted step time of each strategy: list scheduling of the step's op DAG.

Module k runs on device k (or on the device `module_devices[k]` names: one
device may hold several modules), one op at a time per device. Each device
has `threads_per_device` = t intra-op threads: an op holds t cores while it
runs and its one-thread cost shrinks by `thread_speedup(t, efficiency)`; at
most `num_cores` cores are held at once overall. Ops that run at once
share the memory bandwidth: with `contention` c, each of r ops at once runs
1 + (c - 1)(r - 1) times slower (processor sharing; c per network is
measured by `research.concurrency_probe`, 1 = no contention). One training
step t, split into M microbatches, is the DAG the training engine executes
(keys lo come from `routing.make_plan`):

* F_k(t,m): forward of module k (the final loss is inside F_{K-1}); needs
  F_{k-1}(t,m) and U_k(t-1), the update that wrote the weights it reads.
* A_k(t,m), k < K - 1 with an aux head: aux forward + backward; needs F_k.
  It yields the cotangent of L_k at h_k.
* BX_k^lo(t,m), one per lo in vjp_keys[k]: input VJP carrying stream lo into
  module k - 1. It needs the stream's cotangent at h_k: BX_{k+1}^lo when lo
  crosses from module k + 1, and/or the own loss (A_k, or F_{K-1} for the
  final module) when loss_low[k] == lo.
* BW_k(t,m), when weight_keys[k] is non-empty: the weight VJP; needs the
  cotangents of every key in weight_keys[k] (same rule as BX).
* U_k(t): the optimizer update; needs every BX_k and BW_k of the step, since
  they read theta_k before it is overwritten.

* T_k(t,m) / TB_k(t,m): the transfer of h_k from module k's process to
  module k + 1's (after F_k, before F_{k+1}), and of a cotangent back from
  module k + 1 to module k (after each BX_{k+1}^lo, before its users). Only
  where the two modules sit on different processes (`transfers` given and
  different devices); a transfer holds no device and no core: it is a pure
  delay on the edge, latency + bytes / bandwidth, measured by
  `transfer.probe_crossing`.

Costs are per full batch: a microbatch op costs value / M, an update costs
its value once per step; a transfer costs latency + full-batch bytes time / M
(the latency is paid once per crossing, whatever the size). Whenever a device and a core are free, the ready op
with the highest priority starts. On a device that runs one op at a time:
earliest step, earliest microbatch (U after all microbatches), backward-type
ops before forwards, higher module first. Where a device may run several
ops at once (`ops_per_device` > 1: logical CPU devices sharing one process's
inter-op pool), earliest step, then the op made ready last: TF's executor
runs an op it makes ready on the thread that finished its input, and the
pool's threads take their own newest task first. Replayed on the 250
cells of docs/results/speed_held/ (`research.replay_predictions`), this
rule predicts 221 within 15% of measured where the device order gave 210.

Steady state: the step time is the mean gap between completions of
consecutive steps (the end of the last op of each step) over the second half
of the measured steps, taken over whole periods of the cycle the schedule
settles into, which can span several steps. Extra steps run after the
measured ones, so the window never sees the pipeline drain.
"""

import dataclasses
import heapq
import math
from typing import Optional, Sequence, Tuple

from tf_interlock import routing
from tf_interlock import step_loop
from tf_interlock import strategy as strategy_lib

# Tie-break order of op kinds within one (step, microbatch, module): input
# VJPs first (they unblock the module below), then the aux head, the weight
# VJP, and forwards last. U is ordered by its microbatch slot M instead.
_RANK = {"BX": 0, "TB": 0, "A": 1, "BW": 2, "U": 2, "F": 3, "T": 3}
# Transfer kinds: a delay on an edge between processes (no device, no core).
_TRANSFER = ("T", "TB")


def thread_speedup(threads, efficiency):
  """How much faster one op runs on `threads` intra-op threads than on one.

  Each thread beyond the first adds `efficiency` of a core: 1 + (t - 1) e.
  A 512x1024x1024 float32 matmul on the 2-core test machine took 11.8 ms on
  one thread and 7.2 ms on two: 1.64x, e = 0.64.

  Args:
    threads: t >= 1.
    efficiency: e in [0, 1].

  Returns:
    The speedup factor (1 for t = 1).
  """
  _check_count("threads", threads, 1)
  if not 0.0 <= efficiency <= 1.0:
    raise ValueError(f"efficiency must be in [0, 1]. "
                     f"Received: efficiency={efficiency!r}")
  return 1.0 + (threads - 1) * efficiency


@dataclasses.dataclass(frozen=True)
class ModuleCost:
  """Time of each op of one module, for a full batch (update: per step).

  Attributes:
    forward, input_vjp, weight_vjp, aux, update: the ops of the DAG above;
      weight_vjp is the weight VJP alone (a backward pass through the body
      for theta's gradient).
    fused_vjp: one backward pass giving both the input and the weight VJP
      (the engine's fused pass, used whenever the stream that trains
      theta_k also goes on to module k - 1: always so end to end). Its
      weight part costs fused_vjp - input_vjp, less than weight_vjp, as the
      cotangents through the body are computed once. None: not measured,
      the weight part costs weight_vjp.
    accumulate: adding one microbatch's gradients of the module's weights
      to the running sum (M - 1 times per step with M microbatches).
  """
  forward: float
  input_vjp: float
  weight_vjp: float
  aux: float = 0.0
  update: float = 0.0
  fused_vjp: Optional[float] = None
  accumulate: float = 0.0

  def scaled(self, factor):
    """Every cost times `factor` (fused_vjp stays None when unmeasured)."""
    return ModuleCost(*(None if v is None else v * factor
                        for v in dataclasses.astuple(self)))


@dataclasses.dataclass(frozen=True)
class TransferCost:
  """Time to move one full-batch activation (or its cotangent) across the
  boundary between two processes: latency + bytes / bandwidth, in seconds.

  Attributes:
    latency: the fixed cost of one crossing, paid by every microbatch.
    transfer: bytes / bandwidth for the full batch; a microbatch moves 1/M.
  """
  latency: float
  transfer: float

  def crossing(self, num_microbatches):
    """Seconds for one crossing of one of `num_microbatches` microbatches."""
    return self.latency + self.transfer / num_microbatches


@dataclasses.dataclass(frozen=True)
class ScheduleResult:
  """Steady state of a simulated schedule.

  Attributes:
    step_time: mean time between consecutive step completions over whole
      periods of the steady-state cycle (see `_steady_window`).
    utilization: per device, busy time / elapsed time over the same window.
    device_load: per device, the busy time one step needs (a lower bound on
      step_time, as is sum(device_load) * threads_per_device / num_cores).
    critical_ops: the chain of ops that set the last step's completion, in
      time order; "(t-1)" marks ops of the step before.
    num_cores: the number of cores used.
    threads_per_device: intra-op threads (cores) each op holds.
  """
  step_time: float
  utilization: Tuple[float, ...]
  device_load: Tuple[float, ...]
  critical_ops: Tuple[str, ...]
  num_cores: int
  threads_per_device: int = 1


@dataclasses.dataclass(frozen=True)
class _Op:
  """One op of the step template; deps index ops of the same step."""
  name: str
  kind: str
  module: int
  microbatch: int
  key: int
  cost: float
  deps: Tuple[int, ...]


def _check_count(name, value, minimum):
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(
        f"{name} must be an int >= {minimum}. Received: {name}={value!r}")


def _check_costs(costs):
  if not costs:
    raise ValueError(
        f"costs needs one ModuleCost per module. Received: costs={costs!r}")
  for k, cost in enumerate(costs):
    for field in dataclasses.fields(ModuleCost):
      value = getattr(cost, field.name)
      if value is None and field.name == "fused_vjp":
        continue
      if value is None or not math.isfinite(value) or value < 0:
        raise ValueError(
            f"Op costs must be finite and >= 0. "
            f"Received: costs[{k}].{field.name}={value!r}")


def _step_template(plan, costs, microbatch_costs, has_aux, num_microbatches,
                   crossings=None):
  """Builds the ops of one step, each after all of its deps.

  costs: per module, full-batch costs (the update is taken from them);
  microbatch_costs: per module, the costs of one microbatch's ops.

  crossings[k]: the seconds one microbatch's h_k (or its cotangent) takes
  to cross from module k to k + 1 (or back); 0 = same process, no op.
  """
  num_modules, m_count = plan.num_modules, num_microbatches
  ops, index = [], {}

  def add(kind, k, m, cost, deps, key=-1):
    index[kind, k, m, key] = len(ops)
    suffix = (f"^{key}" if key >= 0 else "") + (
        f"@m{m}" if m_count > 1 and kind != "U" else "")
    ops.append(_Op(f"{kind}{k}{suffix}", kind, k, m, key, cost, tuple(deps)))

  crossings = crossings or [0.0] * num_modules
  micro = microbatch_costs

  def cotangent(k, m, lo):
    # The ops producing stream lo's cotangent at h_k (after its transfer).
    deps = []
    if k + 1 < num_modules and lo in plan.vjp_keys[k + 1]:
      deps.append(index.get(("TB", k, m, lo), index["BX", k + 1, m, lo]))
    if plan.loss_low[k] == lo:
      deps.append(index["A" if k < num_modules - 1 else "F", k, m, -1])
    return deps

  for m in range(m_count):
    for k in range(num_modules):
      before = []
      if k and crossings[k - 1]:  # h_{k-1} crosses into module k's process.
        add("T", k - 1, m, crossings[k - 1], [index["F", k - 1, m, -1]])
        before = [index["T", k - 1, m, -1]]
      elif k:
        before = [index["F", k - 1, m, -1]]
      add("F", k, m, micro[k].forward, before)
      if k < num_modules - 1 and has_aux[k]:
        add("A", k, m, micro[k].aux, [index["F", k, m, -1]])
    for k in reversed(range(num_modules)):
      for lo in plan.vjp_keys[k]:
        add("BX", k, m, micro[k].input_vjp, cotangent(k, m, lo), lo)
        if crossings[k - 1]:  # The cotangent crosses back to module k - 1.
          add("TB", k - 1, m, crossings[k - 1], [index["BX", k, m, lo]], lo)
      if plan.weight_keys[k]:
        deps = {d for lo in plan.weight_keys[k] for d in cotangent(k, m, lo)}
        # Microbatches after the first add their gradients to the sum.
        add("BW", k, m, _weight_part(plan, k, micro[k]) +
            (micro[k].accumulate if m else 0.0), sorted(deps))
  for k in range(num_modules):
    add("U", k, m_count, costs[k].update,
        [i for i, op in enumerate(ops)
         if op.module == k and op.kind in ("BX", "BW")])
  return ops


def _weight_part(plan, k, cost):
  """The weight VJP's own cost: what the engine's fused backward pass adds
  to the input VJP when one stream both trains theta_k and goes on to
  module k - 1 (engine._backward's `fused`), else the weight VJP alone."""
  keys = plan.weight_keys[k]
  if (cost.fused_vjp is not None and len(keys) == 1 and
      keys[0] in plan.vjp_keys[k]):
    return max(0.0, cost.fused_vjp - cost.input_vjp)
  return cost.weight_vjp


def _steady_window(done):
  """The last whole periods of the completion times `done`: (steps, time).

  List schedules settle into a cycle that may span several steps (gaps
  alternating a, b, ...). The shortest period p seen at least twice at the
  end of the gaps, over at least half of them, is found, and the window
  covers as many whole periods as have settled: its mean gap is then exact,
  and so is each device's busy fraction. Without such a period (a schedule
  still settling, or a cycle too long to see), the whole window is used.
  """
  gaps = [b - a for a, b in zip(done, done[1:])]
  tolerance = 1e-9 * max(gaps + [1.0])
  for period in range(1, len(gaps) // 2 + 1):
    settled = len(gaps)  # Gaps from index `settled` on repeat with `period`.
    while settled > period and abs(
        gaps[settled - 1] - gaps[settled - 1 - period]) <= tolerance:
      settled -= 1
    settled -= period
    if len(gaps) - settled >= max(2 * period, len(gaps) / 2):
      steps = (len(gaps) - settled) // period * period
      return steps, done[-1] - done[-1 - steps]
  return len(gaps), done[-1] - done[0]


def slowdown(running, contention):
  """How much slower each of `running` ops at once runs than alone.

  Ops on different cores share the memory bandwidth: element-wise and
  reduction work (bias, ReLU, BatchNorm, LayerNorm, softmax) and the
  gradients' traffic slow down when another op runs beside them.
  `research.concurrency_probe` measures c, the factor of two ops at once;
  each further op adds c - 1 again: 1 + (c - 1)(r - 1) for r ops (1 alone).
  """
  return 1.0 + (contention - 1.0) * max(running - 1, 0)


def contention_factor(slower_s, faster_s, together_s):
  """The c of `slowdown` that explains two ops' measured times.

  Processor sharing: both run c times slower until the faster one ends at
  c * faster_s, then the slower one's remaining slower_s - faster_s runs
  alone, so together_s = slower_s + (c - 1) * faster_s.

  Args:
    slower_s, faster_s: each op alone (seconds).
    together_s: both at once on two devices.

  Returns:
    c >= 1 (1 when together was no slower than the slower op alone).
  """
  return max(1.0, 1.0 + (together_s - slower_s) / faster_s)


def _run(template, num_modules, device_of, num_cores, threads, num_steps,
         ops_per_device=1, contention=1.0, loop="unrolled", loop_block=1):
  """List-schedules `num_steps` copies of the step template.

  Op id = step * len(template) + template index. Module k's ops run on
  device device_of[k], at most `ops_per_device` at once; each op holds
  `threads` of the `num_cores` cores. Processor sharing: while r compute
  ops run, each does its work `slowdown(r, contention)` times slower, so
  an op's remaining work, not its finish time, is tracked.

  Returns:
    (start, finish, blocker): per op id, its start and finish time and the op
    that held it back last (a dep, the previous op on its device, or the op
    that freed a core; None at time 0).

  loop, loop_block: how the training call runs its steps
  (`tf_interlock.step_loop`). "unrolled": written out, no barrier. "while":
  a graph loop over blocks of U steps, where every op of step t with
  t mod U = 0 also waits for every op of step t - 1 (the loop's barrier).
  "pipelined" (`tf_interlock.pipelined_loop`): iteration i runs module k's
  ops of step i - k (a transfer of h_k into module k + 1 counts with module
  k + 1), and every op of iteration i with i mod U = 0 waits for every op
  of iteration i - 1.
  """
  size = len(template)
  successors = [[] for _ in template]
  for i, op in enumerate(template):
    for d in op.deps:
      successors[d].append(i)
  forwards = [[i for i, op in enumerate(template)
               if op.kind == "F" and op.module == k]
              for k in range(num_modules)]
  # The loop's iterations: a step each, or (pipelined) module k's ops of
  # step i - k in iteration i.
  shift = [op.module + (op.kind == "T") if loop == "pipelined" else 0
           for op in template]
  members = [[] for _ in range(num_steps + max(shift))]
  for op_id in range(num_steps * size):
    t, i = divmod(op_id, size)
    members[t + shift[i]].append(op_id)
  left = [len(ops) for ops in members]  # Per iteration, ops not finished.

  def barrier(g):  # Iteration g waits for every op of iteration g - 1.
    return loop != "unrolled" and 0 < g < len(members) and g % loop_block == 0

  waits = [len(op.deps) + (op.kind == "F" and t > 0)  # F_k waits U_k(t-1).
           + barrier(t + shift[i])
           for t in range(num_steps) for i, op in enumerate(template)]
  num_devices = max(device_of) + 1
  queues = [[] for _ in range(num_devices)]  # Per device: (priority, op id).
  ready_at, ready_by = {}, {}
  released = [0]
  # Work left below this counts as done: ops ending within it end together.
  tolerance = 1e-12 * max([op.cost for op in template] + [1.0])

  def release(op_id, now, by):
    t, i = divmod(op_id, size)
    op = template[i]
    ready_at[op_id], ready_by[op_id] = now, by
    if op.kind in _TRANSFER:  # A delay on the edge: starts at once.
      start[op_id], blocker[op_id] = now, by
      heapq.heappush(delays, (now + op.cost, op_id))
      return
    released[0] += 1
    if ops_per_device > 1:  # A shared inter-op pool: newest first (above).
      priority = (t, -released[0])
    else:
      priority = (t, op.microbatch, _RANK[op.kind], -op.module, op.key)
    heapq.heappush(queues[device_of[op.module]], (priority, op_id))

  delays, free_cores = [], num_cores  # delays: (end, transfer op id).
  running = {}  # Compute op id -> its work left (seconds alone).
  free_slots = [ops_per_device] * num_devices
  start, finish, blocker = {}, {}, {}
  for i, op in enumerate(template):
    if not op.deps:
      release(i, 0.0, None)
  last_on_device, last_done, now = [None] * num_devices, None, 0.0
  while True:
    while free_cores >= threads:  # Start the best ready op on a free device.
      heads = [queues[k][0] for k in range(num_devices)
               if free_slots[k] and queues[k]]
      if not heads:
        break
      _, op_id = min(heads)
      k = device_of[template[op_id % size].module]
      heapq.heappop(queues[k])
      free_slots[k] -= 1
      free_cores -= threads
      start[op_id] = now
      previous = last_on_device[k]
      if ready_at[op_id] == now:
        blocker[op_id] = ready_by[op_id]
      elif previous is not None and finish[previous] == now:
        blocker[op_id] = previous
      else:
        blocker[op_id] = last_done
      running[op_id] = template[op_id % size].cost
    if not running and not delays:
      return start, finish, blocker
    rate = 1.0 / slowdown(len(running), contention)
    # Advance by work done, not by a difference of times: the op with the
    # least work left lands on 0 exactly, so every pass retires an op.
    work = min(running.values()) if running else math.inf
    if delays and delays[0][0] < now + work / rate:
      now_next, work = delays[0][0], (delays[0][0] - now) * rate
    else:
      now_next = now + work / rate
    for op_id in running:
      running[op_id] -= work
    now = now_next
    ended = [op_id for op_id, left in running.items() if left <= tolerance]
    while delays and delays[0][0] <= now + tolerance:
      ended.append(heapq.heappop(delays)[1])
    for op_id in sorted(ended):  # Retire every op ending now.
      t, i = divmod(op_id, size)
      finish[op_id] = now
      if template[i].kind not in _TRANSFER:
        del running[op_id]
        k = device_of[template[i].module]
        last_on_device[k], last_done = op_id, op_id
        free_slots[k] += 1
        free_cores += threads
      nexts = [t * size + j for j in successors[i]]
      if template[i].kind == "U" and t + 1 < num_steps:
        nexts += [(t + 1) * size + j for j in forwards[template[i].module]]
      g = t + shift[i]
      left[g] -= 1
      if not left[g] and barrier(g + 1):
        nexts += members[g + 1]
      for n in nexts:
        waits[n] -= 1
        if not waits[n]:
          release(n, now, op_id)


def _check_devices(module_devices, num_modules):
  """Device of each module; the devices must be numbered 0, 1, ... D - 1."""
  if module_devices is None:
    return tuple(range(num_modules))
  devices = tuple(module_devices)
  if (len(devices) != num_modules or
      any(isinstance(d, bool) or not isinstance(d, int) for d in devices) or
      set(devices) != set(range(max(devices, default=-1) + 1))):
    raise ValueError(
        f"module_devices needs one device index per module ({num_modules}), "
        f"using every index 0..D-1. Received: module_devices={module_devices!r}")
  return devices


def simulate(costs: Sequence[ModuleCost], strategy, *, num_microbatches=1,
             num_cores=None, num_steps=48, has_aux=None, threads_per_device=1,
             module_devices=None, thread_efficiency=1.0,
             transfers=None, microbatch_costs=None,
             ops_per_device=1, contention=1.0,
             loop="unrolled", loop_block=1) -> ScheduleResult:
  """Simulates `num_steps` training steps and measures the steady state.

  Another num_steps // 2 steps run after them, so that the measured second
  half keeps the contention of later steps.

  Args:
    costs: one `ModuleCost` per module (K = len(costs)), on one thread.
    strategy: an `InterlockStrategy` or anything `parse_strategy` accepts.
    num_microbatches: M >= 1 microbatches per step.
    num_cores: cores shared by the devices; None = D * threads_per_device.
    num_steps: steps to simulate (>= 2); the second half is measured.
    has_aux: per module, whether it has an aux head (default: all).
    threads_per_device: intra-op threads t of every op (1..num_cores); an op
      holds t cores and runs `thread_speedup(t, thread_efficiency)` faster.
    module_devices: per module, the index of its device (default: module k
      on device k); one device runs one op at a time.
    thread_efficiency: e of `thread_speedup`.
    transfers: K - 1 `TransferCost`s, transfers[k] for the boundary between
      modules k and k + 1, charged where the two modules are on different
      devices (processes); None: no transfer cost anywhere (one process).
    microbatch_costs: one `ModuleCost` per module measured on one
      microbatch (batch / M): the forward, VJP and aux ops of a microbatch
      cost these values. None: a microbatch op costs 1/M of `costs`'s,
      which ignores that small ops run less efficiently.
    ops_per_device: how many of a device's ops may run at once. 1 for a
      real device, or a process of its own (a cluster worker with one
      inter-op thread); a simulated device is a logical CPU of a process
      whose inter-op pool is shared by every device, so any of its
      inter-op threads may run any device's op
      (`research.concurrency_probe` measures this): pass that pool's size.
      Above 1, ready ops start newest first within a step (above).
    contention: c >= 1, how much slower each of two ops runs when they run
      at once than alone (`slowdown`; `research.concurrency_probe` measures
      it per network). 1: ops on different cores do not slow each other.
    loop: how a training call runs its steps, as the trainer resolves
      `ExecutionOptions.loop` (`step_loop.resolve_loop`): "unrolled" (every
      step written out, no barrier), "while" (a graph loop over blocks of U
      steps: the first op of each block waits for every op of the block
      before) or "pipelined" (local learning only: module k on step t - k,
      a barrier every U iterations; `pipelined_loop`).
    loop_block: U >= 1 (`ExecutionOptions.loop_block`); above 1 only with
      "while" or "pipelined".

  Returns:
    A `ScheduleResult` (utilization and device_load per device).

  Raises:
    ValueError: for an empty cost list, a negative cost or a bad count.
  """
  _check_costs(costs)
  num_modules = len(costs)
  _check_count("num_microbatches", num_microbatches, 1)
  _check_count("num_steps", num_steps, 2)
  _check_count("threads_per_device", threads_per_device, 1)
  _check_count("ops_per_device", ops_per_device, 1)
  if isinstance(contention, bool) or not (
      isinstance(contention, (int, float)) and 1.0 <= contention < math.inf):
    raise ValueError(f"contention must be a number >= 1. "
                     f"Received: contention={contention!r}")
  _check_count("loop_block", loop_block, 1)
  speedup = thread_speedup(threads_per_device, thread_efficiency)
  device_of = _check_devices(module_devices, num_modules)
  num_devices = max(device_of) + 1
  if num_cores is None:
    num_cores = num_devices * threads_per_device
  _check_count("num_cores", num_cores, threads_per_device)
  has_aux = [True] * num_modules if has_aux is None else list(has_aux)
  plan = routing.make_plan(strategy, num_modules, has_aux)
  _check_loop(loop, loop_block, plan)
  microbatch_costs = _microbatch_costs(costs, microbatch_costs,
                                       num_microbatches)
  if speedup != 1.0:
    costs = [c.scaled(1.0 / speedup) for c in costs]
    microbatch_costs = [c.scaled(1.0 / speedup) for c in microbatch_costs]
  template = _step_template(
      plan, costs, microbatch_costs, has_aux, num_microbatches,
      _crossings(transfers, device_of, num_microbatches))
  start, finish, blocker = _run(
      template, num_modules, device_of, num_cores, threads_per_device,
      num_steps + num_steps // 2, ops_per_device, contention, loop,
      loop_block)
  return _measure(template, start, finish, blocker, num_steps, device_of,
                  num_devices, num_cores, threads_per_device)


def _check_loop(loop, loop_block, plan):
  """One line for a loop the trainer would not run (`step_loop`)."""
  if loop not in step_loop.LOOPS:
    raise ValueError(f"loop must be one of {step_loop.LOOPS}. "
                     f"Received: loop={loop!r}")
  if loop == "unrolled" and loop_block > 1:
    raise ValueError(f"loop_block > 1 needs loop='while' or 'pipelined'. "
                     f"Received: loop_block={loop_block}, loop={loop!r}")
  refusal = loop == "pipelined" and step_loop.pipeline_refusal(plan)
  if refusal:
    raise ValueError(f"loop='pipelined' runs local learning only: "
                     f"{refusal}. Received: loop={loop!r}")


def _microbatch_costs(costs, microbatch_costs, num_microbatches):
  """One `ModuleCost` per module for one microbatch's ops: the measured
  ones, checked, or 1/M of the full batch's."""
  if microbatch_costs is not None:
    _check_costs(microbatch_costs)
    if len(microbatch_costs) != len(costs):
      raise ValueError(
          f"microbatch_costs needs one ModuleCost per module ({len(costs)})."
          f" Received: microbatch_costs={microbatch_costs!r}")
    return microbatch_costs
  # A microbatch op costs 1/M of the full batch's; the sum of the
  # gradients has the weights' size whatever M.
  return [dataclasses.replace(c.scaled(1.0 / num_microbatches),
                              accumulate=c.accumulate) for c in costs]


def _crossings(transfers, device_of, num_microbatches):
  """Each boundary's transfer time (0 where both modules share a device),
  or None without transfer costs."""
  if transfers is None:
    return None
  if len(transfers) != len(device_of) - 1:
    raise ValueError(
        f"transfers needs one TransferCost per module boundary "
        f"({len(device_of) - 1}). Received: transfers={transfers!r}")
  return [t.crossing(num_microbatches)
          if device_of[k] != device_of[k + 1] else 0.0
          for k, t in enumerate(transfers)]


def _measure(template, start, finish, blocker, num_steps, device_of,
             num_devices, num_cores, threads_per_device):
  """The `ScheduleResult` of a run: its steady step time, each device's
  utilization over the measured window and load, and the critical ops."""
  size = len(template)
  done = [max(finish[t * size + i] for i in range(size))
          for t in range(num_steps)]
  steps, span = _steady_window(done[num_steps // 2 - 1:])
  low, high = done[-1] - span, done[-1]
  busy = [0.0] * num_devices
  for op_id, began in start.items():
    if template[op_id % size].kind in _TRANSFER:
      continue
    overlap = min(finish[op_id], high) - max(began, low)
    if overlap > 0:
      busy[device_of[template[op_id % size].module]] += overlap
  # Walk back from the last measured step's final op through its blockers.
  last = num_steps - 1
  chain, op_id = [], max(range(last * size, num_steps * size),
                         key=lambda i: (finish[i], -i))
  while op_id is not None and finish[op_id] > done[-2]:
    t = op_id // size
    chain.append(template[op_id % size].name +
                 ("" if t == last else f"(t{t - last:+d})"))
    op_id = blocker[op_id]
  return ScheduleResult(
      step_time=span / steps,
      utilization=tuple(b / span if span else 0.0 for b in busy),
      device_load=tuple(sum(op.cost for op in template
                            if device_of[op.module] == d and
                            op.kind not in _TRANSFER)
                        for d in range(num_devices)),
      critical_ops=tuple(reversed(chain)), num_cores=num_cores,
      threads_per_device=threads_per_device)


def step_work(costs, strategy, num_microbatches=1, has_aux=None,
              microbatch_costs=None):
  """The op cost one step charges, summed over its ops: its time on one
  core with nothing overlapping (`research.serial_work` measures that).

  Args:
    costs, strategy, num_microbatches, has_aux, microbatch_costs: as for
      `simulate`.

  Returns:
    Seconds.
  """
  _check_costs(costs)
  _check_count("num_microbatches", num_microbatches, 1)
  num_modules = len(costs)
  has_aux = [True] * num_modules if has_aux is None else list(has_aux)
  microbatch_costs = _microbatch_costs(costs, microbatch_costs,
                                       num_microbatches)
  plan = routing.make_plan(strategy, num_modules, has_aux)
  template = _step_template(plan, costs, microbatch_costs, has_aux,
                            num_microbatches)
  return sum(op.cost for op in template)


def predict_speedups(costs, strategies, **kwargs):
  """Step time of each strategy and its speedup over end-to-end.

  Args:
    costs: one `ModuleCost` per module.
    strategies: strategies (or strings) to compare.
    **kwargs: passed on to `simulate`.

  Returns:
    A dict: strategy name -> (step_time, e2e step_time / step_time).
  """
  baseline = simulate(costs, "e2e", **kwargs).step_time
  result = {}
  for spec in strategies:
    step_time = simulate(costs, spec, **kwargs).step_time
    result[strategy_lib.parse_strategy(spec).name] = (
        step_time, baseline / step_time if step_time else 1.0)
  return result


# The model-parallel user's alternative to interlocking: the GPipe-style e2e
# pipeline over K devices, with the number of microbatches that suits it.
PIPELINE_MICROBATCHES = (2, 4, 8, 16)


def best_pipeline(costs, microbatches=PIPELINE_MICROBATCHES, **kwargs):
  """The fastest microbatched e2e pipeline: the peer of every strategy.

  With M microbatches, e2e's forward and backward waves overlap across
  devices, so its bubble shrinks to (K - 1)/(M + K - 1) of the step
  (GPipe); each op then costs 1/M of its full-batch cost here, which
  ignores that small batches run less efficiently (measured per cell by
  `research.model_validation`).

  Args:
    costs: one `ModuleCost` per module.
    microbatches: the M to try (each >= 2).
    **kwargs: passed on to `simulate` (not num_microbatches).

  Returns:
    (M, step_time) of the fastest; ties go to the smaller M.
  """
  if not microbatches:
    raise ValueError(f"best_pipeline needs at least one M. "
                     f"Received: microbatches={microbatches!r}")
  times = {m: simulate(costs, "e2e", num_microbatches=m, **kwargs).step_time
           for m in microbatches}
  best = min(times, key=lambda m: (times[m], m))
  return best, times[best]
