"""Measures the per-module op costs that the schedule model needs.

`schedule.simulate` predicts a strategy's step time from, per module k, the
time of its forward f_k (for the last module with the true loss, its
metrics and the loss's gradient at h_{K-1}), input VJP bx_k, weight VJP
bw_k, fused input and weight VJP (one backward pass, as the engine runs end
to end), aux head forward and backward a_k (with its metrics), optimizer
update u_k, and the sum of two microbatches' gradients. Each is timed here
in its own `tf.function` on the module's device; the VJPs include a forward
pass, which is subtracted. Times are medians over `repeats` rounds, in
seconds; each round times every op of every module once (round robin, so
that a burst of load elsewhere on the host spreads over all ops). A microbatch's ops are timed M at a time inside one graph, as the
pipeline runs them (`measure_module_costs`' `microbatches`).

While the ops are timed, every thread of the process is pinned to as many
cores as the schedule model lets one op hold (`measure_module_costs`'
`cores`, the plan's threads per device): an op's cost is its work on those
cores. Unpinned, a graph's independent branches run side by side on the
inter-op pool's spare cores, which the step gives to other devices. The
fused VJP's input and weight halves are such branches: on the 2-core VM,
4 devices x 1 thread, the fused pass timed unpinned at 0.67-0.79 of the
two halves timed apart, against 0.95-1.06 in a process of one inter-op
thread (research.serial_work), so the model charged end to end's
microbatched weight VJP a third of its work and predicted e2e-m8 20% fast
(docs/results/many_core/README.md).
"""

import collections
import contextlib
import dataclasses
import functools
import os
import time

import numpy as np
import keras
import tensorflow as tf

from layers import partition
from step_model import module_ops
from step_model import schedule


def _median_time(fn, repeats, calls=1, cores=1):
  """The median seconds of one of `fn`'s `calls` ops (`_median_times` of
  `fn` alone)."""
  return _median_times({"op": (contextlib.nullcontext, fn, calls)}, repeats,
                       cores)["op"]


def _median_times(timed, repeats, cores=1):
  """The median seconds of one op of each function of `timed`, timed in turn.

  Each function runs its `calls` ops one after another inside one graph,
  so a call's fixed cost (dispatch, the outputs' hand-back) is shared by
  all of them, as a step's ops share it. The functions are timed round
  robin, one call of each per round, `repeats` rounds: a burst of load
  from elsewhere on a shared host (seconds long) then lands on one call of
  every op instead of on every call of one op. Timed op after op, one such
  burst made module 2's input VJP of the width-512 MLP cost 3.6 ms and
  module 1's 1.9 ms, the same layer (docs/results/speed_held/README.md).
  The timed calls hold `cores` cores (`holding_cores`).

  Args:
    timed: {name: (scope, fn, calls)}; `scope()` is entered around every
      call of `fn` (its module's device scope).
    repeats: timed rounds (>= 1).
    cores: the cores the timed calls hold.

  Returns:
    {name: median seconds per op}.
  """
  def call(scope, fn):
    with scope():
      # expand_composites: an embedding's gradient is an IndexedSlices.
      tf.nest.map_structure(lambda t: t.numpy(), fn(), expand_composites=True)

  for scope, fn, _ in timed.values():  # trace and warm up
    call(scope, fn)
    call(scope, fn)
  times = {name: [] for name in timed}
  with holding_cores(cores):
    for scope, fn, _ in timed.values():  # warm up on the pinned cores
      call(scope, fn)
    for _ in range(repeats):
      for name, (scope, fn, calls) in timed.items():
        start = time.perf_counter()
        call(scope, fn)
        times[name].append((time.perf_counter() - start) / calls)
  return {name: float(np.median(t)) for name, t in times.items()}


@contextlib.contextmanager
def holding_cores(cores):
  """Pins every thread of this process to `cores` of its cores, for the block.

  Each thread's own affinity comes back afterwards (a thread started inside
  the block gets the process's first thread's). Where the OS has no
  affinity call (macOS), nothing is pinned.

  Args:
    cores: how many cores (>= 1); more than the process may use means all
      of them.

  Yields:
    The cores pinned to, a sorted tuple (empty where nothing is pinned).

  Raises:
    ValueError: for cores < 1.
  """
  if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
    raise ValueError(f"cores must be an int >= 1. Received: cores={cores!r}")
  if not hasattr(os, "sched_setaffinity"):
    yield ()
    return
  def threads():
    return [int(t) for t in os.listdir("/proc/self/task")]
  before = {}
  for tid in threads():
    try:
      before[tid] = os.sched_getaffinity(tid)
    except OSError:  # The thread ended meanwhile.
      pass
  process = os.sched_getaffinity(0)
  chosen = set(sorted(process)[:cores])
  try:
    for tid in before:
      with contextlib.suppress(OSError):
        os.sched_setaffinity(tid, chosen)
    yield tuple(sorted(chosen))
  finally:
    for tid in threads():
      with contextlib.suppress(OSError):
        os.sched_setaffinity(tid, before.get(tid, process))


def _in_order(op, *inputs):
  """`op` on each tuple of `inputs` in turn, each after the one before.

  The engine runs a pipeline's M microbatches of a module on one device, one
  after another, inside the step's graph. Each call's inputs wait (through
  `tf.identity` under control dependencies) for every output of the call
  before, so the calls never overlap and each pays only its own work.

  Only each output's first element is kept (and returned): the step sums a
  microbatch's gradients into the running total and drops them, so their
  buffers are reused. Keeping all M calls' outputs alive made every call
  write fresh buffers (M weight gradients of 4 MB each for the width-1024
  MLP): it charged a microbatch's weight VJP 1.6x its share of the full
  batch's, and a local-m8 step 30% more work than it does
  (docs/results/many_core/README.md, research.serial_work).

  Returns:
    The flat list of the first element of every call's outputs.
  """
  outputs, previous = [], []
  for args in zip(*inputs):
    with tf.control_dependencies(previous):
      args = [tf.identity(a) for a in args]
    previous = [tf.reshape(t, [-1])[:1] for t in tf.nest.flatten(
        op(*args), expand_composites=True)]
    outputs += previous
  return outputs


def _op_functions(k, module, xs, cots, labels, step):
  """tf.functions for module k's forward and VJPs, each run on every
  microbatch of `xs` in order (closures: arguments of a tf.function would
  be captured by value and lose their gradients). The ops are the engine's
  own, through `module_ops` (the engine's public methods)."""

  def final_loss_op(h, y):
    # The last module's L_{K-1} = loss(h, y) and its cotangent at h: inside
    # F_{K-1} in the schedule model (the metrics are returned too, or the
    # graph would prune them).
    with tf.GradientTape() as tape:
      tape.watch(h)
      loss, metrics = module_ops.module_loss(step, k, h, y)
    return [tape.gradient(loss, h)] + list(metrics.values())

  def vjp_op(weights, inputs):
    return lambda x, cot: module_ops.body_vjp(module, x, cot, weights=weights,
                                              inputs=inputs)

  def aux_op(h, y):
    phi = module.aux_head.trainable_variables
    with tf.GradientTape() as tape:
      tape.watch(h)
      loss, metrics = module_ops.module_loss(
          step, k, module.aux_head(h, training=True), y)
    return tape.gradient(loss, phi + [h]) + list(metrics.values())

  def run(op, *inputs):
    return tf.function(lambda: _in_order(op, *inputs), autograph=False)

  return {
      "forward": run(lambda x: module.body(x, training=True), xs),
      "input_vjp": run(vjp_op(weights=False, inputs=True), xs, cots),
      "weight_vjp": run(vjp_op(weights=True, inputs=False), xs, cots),
      # The engine's fused pass: theta's and x's gradients in one backward.
      "fused_vjp": run(vjp_op(weights=True, inputs=True), xs, cots),
      "aux": lambda hs: run(aux_op, hs, labels),
      "final_loss": lambda hs: run(final_loss_op, hs, labels),
  }


def _accumulate_function(variables, calls):
  """`calls` sums a + b over gradients shaped like `variables`, each on the
  one before: what adding one microbatch's gradients to the running sum
  costs (trainer._add)."""
  a = [tf.ones_like(v) for v in variables]
  b = [tf.ones_like(v) for v in variables]

  @tf.function(autograph=False)
  def accumulate():
    total = a
    for _ in range(calls):
      total = [x + y for x, y in zip(total, b)]
    return total

  return accumulate


def _update_function(optimizer, variables):
  """A scratch copy of `optimizer` applying zero gradients to copies of
  `variables`: the trainer's weights and slots are never touched."""
  copies = [keras.Variable(v.numpy()) for v in variables]
  scratch = optimizer.__class__.from_config(optimizer.get_config())
  scratch.build(copies)
  zeros = [tf.zeros_like(v) for v in copies]

  @tf.function(autograph=False)
  def update():
    scratch.apply_gradients(zip(zeros, copies))
    return tf.constant(0)

  return update


def measure_module_costs(trainer, features, labels, repeats=10,
                         microbatches=1, cores=1):
  """Times each op of each module of a built `InterlockTrainer`.

  With `microbatches` = M > 1 the costs are those of one microbatch's ops
  (batch / M examples; the update stays the whole step's). As in the
  engine's pipeline, each op then runs on all M microbatches one after
  another inside one graph and its time is that call's over M. Timing one
  microbatch per call would also charge each op a whole call's fixed cost,
  which the step's graph does not pay: 2-4 ms per op for the MLP, up to
  1.8x its step at M = 8 (docs/results/model_validation/serial_mlp_2on1).

  Args:
    trainer: a built `InterlockTrainer` (its modules, loss, placement).
    features: one per-replica batch of inputs.
    labels: the matching labels.
    repeats: timed calls per op.
    microbatches: M, which must divide the batch.
    cores: the cores one op holds in the schedule model (the plan's intra-op
      threads per device): the process is pinned to that many while the
      ops are timed (`holding_cores`).

  Returns:
    A list of K `schedule.ModuleCost`.

  Raises:
    ValueError: for M < 1 or an M that does not divide the batch, or
      cores < 1.
  """
  batch = int(labels.shape[0])
  if isinstance(microbatches, bool) or not isinstance(
      microbatches, int) or microbatches < 1 or batch % microbatches:
    raise ValueError(f"microbatches must be an int >= 1 that divides the "
                     f"batch of {batch}. Received: "
                     f"microbatches={microbatches!r}")
  if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
    raise ValueError(f"cores must be an int >= 1. Received: cores={cores!r}")
  m = microbatches
  h = tf.convert_to_tensor(features)
  labels = tf.split(tf.convert_to_tensor(labels), m)
  timed = {}
  for k, module in enumerate(trainer.modules):
    last = k == trainer.num_modules - 1
    scope = functools.partial(trainer.placement.scope, k)
    with scope():
      xs = tf.split(tf.identity(h), m)
      hs = [module.body(x, training=False) for x in xs]
      h = tf.concat(hs, 0)
      cots = [tf.ones_like(hi) / tf.cast(tf.size(h), h.dtype) for hi in hs]
      ops = _op_functions(k, module, xs, cots, labels, trainer.step)
      mine = {"forward": ops["forward"], "weight_vjp": ops["weight_vjp"],
              "accumulate": _accumulate_function(trainer.variables(k), m)}
      # F_{K-1} holds the true loss, its metrics and dL/dh_{K-1}.
      if last:
        mine["final_loss"] = ops["final_loss"](hs)
      # Module 0 never sends a cotangent, so its backward is never fused.
      if k:
        mine["input_vjp"] = ops["input_vjp"]
        mine["fused_vjp"] = ops["fused_vjp"]
      if not last and module.has_aux_head:
        mine["aux"] = ops["aux"](hs)
      timed.update({(k, name): (scope, fn, m) for name, fn in mine.items()})
      timed[k, "update"] = (scope, _update_function(
          trainer.optimizers[k], trainer.variables(k)), 1)
  t = collections.defaultdict(float, _median_times(timed, repeats, cores))
  costs = []
  for k in range(trainer.num_modules):
    f = t[k, "forward"]
    # The VJPs include a forward pass, which is subtracted.
    bw = max(0.0, t[k, "weight_vjp"] - f)
    costs.append(schedule.ModuleCost(
        forward=f + t[k, "final_loss"],
        input_vjp=max(0.0, t[k, "input_vjp"] - f) if k else 0.0,
        weight_vjp=bw, aux=t[k, "aux"], update=t[k, "update"],
        fused_vjp=max(0.0, t[k, "fused_vjp"] - f) if k else bw,
        accumulate=t[k, "accumulate"]))
  return costs


def repeated_module_costs(trainer, features, labels, repetitions=3,
                          repeats=10, microbatches=1, cores=1):
  """`measure_module_costs` `repetitions` times: the median, min and max of
  every op's cost over the repetitions.

  Each repetition times every op of every module again (after the previous
  repetition's ops ran), so the range shows how much a cost moves while the
  machine runs: the spread a prediction made from the median inherits.

  Returns:
    (median, low, high): three lists of K `schedule.ModuleCost`.

  Raises:
    ValueError: for repetitions < 1.
  """
  if isinstance(repetitions, bool) or not isinstance(
      repetitions, int) or repetitions < 1:
    raise ValueError(f"repetitions must be an int >= 1. "
                     f"Received: repetitions={repetitions!r}")
  runs = [measure_module_costs(trainer, features, labels, repeats,
                                microbatches, cores)
          for _ in range(repetitions)]
  fields = [f.name for f in dataclasses.fields(schedule.ModuleCost)]

  def combine(reduce):
    return [schedule.ModuleCost(*(float(reduce([getattr(run[k], name)
                                                for run in runs]))
                                  for name in fields))
            for k in range(len(runs[0]))]

  return combine(np.median), combine(min), combine(max)


def balance_blocks(costs, num_modules):
  """Splits a network measured one block per module into K modules by time.

  Block j adds its forward, input VJP, weight VJP and update to any module
  holding it; a module ending after block j also runs the aux head measured
  there (the cut cost). The first block's input VJP is 0 as measured: it
  always opens module 1, which sends no gradient below. The split is
  `partition.balanced_split`'s, the balance code of
  `from_keras(balance="time")`.

  Args:
    costs: one `schedule.ModuleCost` per block (seconds).
    num_modules: K.

  Returns:
    {"block_work_ms", "block_cut_ms", "balanced_split",
     "balanced_module_work_ms"}: per block its work and cut cost, the
    block count of each module, and each module's work with that split.
  """
  work = [c.forward + c.input_vjp + c.weight_vjp + c.update for c in costs]
  cuts = [c.aux for c in costs]
  split = partition.balanced_split(work, num_modules, cut_costs=cuts)
  module_work = partition.module_costs(work, split, cut_costs=cuts)
  return {"block_work_ms": [round(1e3 * w, 3) for w in work],
          "block_cut_ms": [round(1e3 * c, 3) for c in cuts],
          "balanced_split": list(split),
          "balanced_module_work_ms": [round(1e3 * w, 3) for w in module_work]}


def compose_modules(block_costs, split):
  """Op costs of modules made of several measured blocks each.

  Module k holds `split[k]` consecutive blocks. Its forward and update are
  the sums of its blocks'. Its input VJP carries the cotangent through
  every block to the module's input: the sum of the blocks' input VJPs (0
  for module 1, which sends nothing). Its weight VJP needs the cotangent at
  each block's output as well, so it adds the input VJPs of every block but
  the module's first to the blocks' weight VJPs. The aux head is the one
  measured after the module's last block (none for the last module).

  Args:
    block_costs: one `schedule.ModuleCost` per block, measured one block per
      module (`balance_blocks`' input).
    split: blocks per module, summing to len(block_costs).

  Returns:
    One `schedule.ModuleCost` per module.
  """
  partition.check_split(split, len(block_costs), len(split))
  modules, start = [], 0
  for k, count in enumerate(split):
    blocks = block_costs[start:start + count]
    start += count
    inner = sum(c.input_vjp for c in blocks[1:])
    modules.append(schedule.ModuleCost(
        forward=sum(c.forward for c in blocks),
        input_vjp=0.0 if k == 0 else inner + blocks[0].input_vjp,
        weight_vjp=sum(c.weight_vjp for c in blocks) + inner,
        aux=0.0 if k == len(split) - 1 else blocks[-1].aux,
        update=sum(c.update for c in blocks)))
  return modules


def project_one_core_per_module(costs, strategies=("2wise", "local")):
  """Step times with one core per module, and each strategy's speedup over
  e2e and over the best microbatched e2e pipeline (`schedule`'s model).

  Returns:
    {"e2e_ms", "pipeline_ms", "pipeline_microbatches",
     strategy: {"step_ms", "vs_e2e", "vs_pipeline"}}.
  """
  k = len(costs)
  e2e = schedule.simulate(costs, "e2e", num_cores=k).step_time
  m, pipe = schedule.best_pipeline(costs, num_cores=k)
  out = {"e2e_ms": 1e3 * e2e, "pipeline_ms": 1e3 * pipe,
         "pipeline_microbatches": m}
  for name in strategies:
    step = schedule.simulate(costs, name, num_cores=k).step_time
    out[name] = {"step_ms": 1e3 * step, "vs_e2e": e2e / step,
                 "vs_pipeline": pipe / step}
  return out
