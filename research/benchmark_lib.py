"""What research.benchmark measures, as functions of values (no flags).

One process times the strategies under one threading plan (TF's thread
pools are fixed per process); the plain Keras baseline runs in a process of
its own with TF's default threading, as a user would run it.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from layers.interlock_module import InterlockModule
from tf_interlock import placement as placement_lib
from tf_interlock import routing
from tf_interlock import step_loop
from tf_interlock import strategy as strategy_lib
from tf_interlock.execution_options import ExecutionOptions
from tf_interlock.trainer import InterlockTrainer
from step_model import memory
from step_model import profiling
from step_model import schedule
from research import benchmark_memory
from train import config as config_lib
from train import datasets
from train import networks
from train import optimization
from train import user_files

NUM_CLASSES = 10
# "e2e-m4": a strategy trained with 4 microbatches per step (GPipe-style).
_MICROBATCHED = re.compile(r"^(.+)-m([0-9]+)$")


@dataclasses.dataclass(frozen=True)
class Spec:
  """A benchmark workload: a production `Config` and what only a benchmark has.

  Attributes:
    config: the network (model, its shape fields, num_modules, split), the
      batch_size, steps_per_loop and every module's optimizer, built by the
      production builders (`networks.make_modules`,
      `optimization.make_optimizer`).
    input_shape: per-example shape of the random features (the data are
      one random batch, not a dataset); the LM's is (seq_len,) token ids.
    steps: timed calls of steps_per_loop steps each.
  """
  config: config_lib.Config
  input_shape: tuple
  steps: int = 5

  @property
  def task(self):
    """The `datasets.Task` of the random batch (no datasets in it)."""
    if self.config.network.model == "transformer":
      return datasets.Task("lm", self.config.data.vocab_size, self.input_shape,
                           tf.int32, None, None)
    return datasets.Task("classification", NUM_CLASSES, self.input_shape,
                         tf.float32, None, None)


def make_spec(model="mlp", num_modules=4, *, preset="resnet20", width=1024,
              layers_per_module=1, image_size=32, channels=3,
              resnet_aux_head="authors", batch_size=512, steps=5,
              steps_per_loop=16):
  """The `Spec` of research.benchmark's flags (same names, same defaults).

  Args:
    model: "mlp" (K modules of layers_per_module Dense(width) layers on
      width random features), "resnet" (`preset` on image_size x image_size
      x channels random images, "flops"-balanced split) or "lm" (the
      fortunes Transformer LM preset's shape, layers_per_module blocks per
      module, on random token ids).
    num_modules: K.
    preset, image_size, channels, resnet_aux_head: the ResNet's.
    width: the MLP's width (and its number of input features).
    layers_per_module: MLP layers or LM blocks per module.
    batch_size, steps_per_loop: the trained batch and steps per loop call.
    steps: timed loop calls.
  """
  # Every module: plain SGD, constant learning rate 0.01, momentum 0.9.
  common = dict(num_modules=num_modules, batch_size=batch_size,
                steps_per_loop=steps_per_loop, optimizer="sgd",
                learning_rate=0.01, momentum=0.9, weight_decay=0.0,
                lr_schedule="constant", warmup_steps=0)
  per_module = (layers_per_module,) * num_modules
  if model == "lm":
    config = dataclasses.replace(
        config_lib.load_preset("fortunes_lm"), split=per_module,
        num_layers=num_modules * layers_per_module, **common)
    return Spec(config, (config.network.seq_len,), steps)
  if model == "resnet":
    config = config_lib.Config(model="resnet", resnet_preset=preset,
                               aux_head=resnet_aux_head, **common)
    return Spec(config, (image_size, image_size, channels), steps)
  config = config_lib.Config(model="mlp", mlp_width=width, split=per_module,
                             **common)
  return Spec(config, (width,), steps)


# Options a cell name may end with (after -mM): "-rc" recomputes every
# module's forward in its backward, "-lean" runs the memory-lean order
# (`InterlockTrainer(recompute=..., memory_lean=...)`).
CELL_OPTIONS = {"rc": "recompute", "lean": "memory_lean"}
# A cell name may end with how its calls run their steps
# (`ExecutionOptions.loop`): "local-unrolled"; none: "auto".
CELL_LOOPS = ("unrolled", "while", "pipelined")


def cell_options(name):
  """The trainer options a cell name ends with: {"recompute": bool,
  "memory_lean": bool} ("2wise-m4-rc": recompute)."""
  parts = name.split("-")
  return {option: suffix in parts[1:]
          for suffix, option in CELL_OPTIONS.items()}


def cell_loop(name):
  """The `ExecutionOptions.loop` a cell name ends with ("local-unrolled":
  "unrolled"), or "auto"."""
  found = [part for part in name.split("-")[1:] if part in CELL_LOOPS]
  return found[-1] if found else "auto"


def cell_run_loop(name, num_modules, loop=None):
  """How a trainer of cell `name` on K = `num_modules` simulated devices
  (one process, one replica, CPUs) runs its calls' steps: `loop`, or the
  loop the name ends with (`cell_loop`), as `step_loop.resolve_loop`
  settles it ("local": "pipelined", "e2e": "while", "2wise" at K > 2:
  "unrolled"; a loop the trainer would refuse raises its one line). Made
  before any trainer, it leaves out "auto"'s bound on n-wise blocks
  (`ExecutionOptions.max_block_weights`), which needs the modules'
  weights: a measured cell is predicted in its trainer's
  `InterlockTrainer.loop_plan()`."""
  plan = routing.make_plan(parse_cell(name)[0], num_modules)
  return step_loop.resolve_loop(
      loop or cell_loop(name), plan,
      memory_lean=cell_options(name)["memory_lean"])


def parse_cell(name):
  """A benchmark strategy name: (strategy, microbatches).

  "2wise" -> ("2wise", 1); "e2e-m4" -> ("e2e", 4): e2e pipelined over 4
  microbatches per step; options (`cell_options`, `cell_loop`) are left
  out: "local-lean" -> ("local", 1).
  """
  while "-" in name and (name.rsplit("-", 1)[-1] in CELL_OPTIONS
                         or name.rsplit("-", 1)[-1] in CELL_LOOPS):
    name = name.rsplit("-", 1)[0]
  match = _MICROBATCHED.match(name)
  if match is None:
    return name, 1
  return match.group(1), int(match.group(2))


def check_cells(names, batch_size, flag="strategies", num_modules=(),
                loop=None):
  """Refuses, in one line naming --`flag`, the first cell name of `names`
  (`parse_cell`) whose strategy does not parse, whose M microbatches do
  not divide `batch_size`, or whose loop (`loop`, or the one the name ends
  with) a trainer of K modules would refuse, for each K in `num_modules`.

  Raises:
    ValueError: "--strategies='e2e,3way' is invalid: '3way' is not a
      strategy: ...".
  """
  for name in names:
    strategy, microbatches = parse_cell(name)
    try:
      strategy_lib.parse_strategy(strategy)
      if microbatches < 1 or batch_size % microbatches:
        raise ValueError(f"{microbatches} microbatches must divide "
                         f"--batch_size={batch_size}")
    except ValueError as e:
      reason = str(e).split(" Received:")[0].rstrip(".")
      config_lib.fail(flag, ",".join(names),
                      f"{name!r} is not a strategy: {reason}")
    for k in num_modules:
      try:
        cell_run_loop(name, k, loop)
      except ValueError as e:
        reason = str(e).split(" Received:")[0].rstrip(".")
        config_lib.fail(flag, ",".join(names),
                        f"{name!r} cannot run at K = {k}: {reason}")


def is_pipeline(name):
  """Whether `name` is the microbatched e2e pipeline (e2e-mM, M >= 2)."""
  strategy, m = parse_cell(name)
  return strategy == "e2e" and m >= 2


def build_modules(spec, aux_heads=True):
  """The benchmark network as K InterlockModules (unbuilt), from the
  production builder; without `aux_heads`, the same bodies alone (the
  ResNet's split is then balanced without heads, as for aux_head=none).

  BatchNormalization is not synchronized: one replica, as in plain Keras.
  """
  config = spec.config
  if not aux_heads:
    config = dataclasses.replace(config, aux_head="none")
  modules = networks.make_modules(config, spec.task, synchronized_bn=False)
  return modules if aux_heads else [
      InterlockModule(m.body, name=m.name) for m in modules]


def make_batch(spec):
  """One fixed batch (features, labels) of the benchmark's shape."""
  rng = np.random.default_rng(0)
  task, batch_size = spec.task, spec.config.run.batch_size
  if task.kind == "lm":
    ids = rng.integers(0, task.num_classes,
                       size=(batch_size, task.input_shape[0] + 1))
    return ids[:, :-1].astype("int32"), ids[:, 1:].astype("int32")
  x = rng.normal(size=(batch_size,) + task.input_shape).astype("float32")
  y = rng.integers(0, task.num_classes, size=(batch_size,)).astype("int32")
  return x, y


WARMUP_CALLS = 2


def time_call_stats(fn, calls):
  """Seconds of `fn()` over `calls` calls after WARMUP_CALLS warm-ups:
  {"median", "min", "max"}. Every timed row of the benchmark (the plain
  Keras baseline included) goes through here: same warm-ups, same median."""
  for _ in range(WARMUP_CALLS):
    fn()
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return {"median": float(np.median(times)), "min": float(min(times)),
          "max": float(max(times))}


def time_calls(fn, calls):
  """Median seconds of `fn()` over `calls` calls (`time_call_stats`)."""
  return time_call_stats(fn, calls)["median"]


def simulated_placement(plan):
  """Module k on logical CPU device plan.module_devices[k]."""
  return placement_lib.make_placement(
      "simulated", len(plan.module_devices),
      module_devices=plan.module_devices)


def build_trainer(spec, name, placement, aux_heads=True, jit_compile=False,
                  options=None):
  """The built `InterlockTrainer` of strategy cell `name` (`parse_cell`),
  compiled with XLA or not (`jit_compile`, a bool), run as `options` (a
  `tf_interlock.ExecutionOptions`; None: the defaults, with the loop the
  name ends with, `cell_loop`) say."""
  strategy, microbatches = parse_cell(name)
  if options is None:
    options = ExecutionOptions(loop=cell_loop(name))
  trainer = InterlockTrainer(
      build_modules(spec, aux_heads),
      lambda k: optimization.make_optimizer(spec.config, None), strategy,
      placement=placement, steps_per_loop=spec.config.run.steps_per_loop,
      num_microbatches=microbatches, jit_compile=jit_compile,
      options=options, **cell_options(name))
  trainer.build(make_batch(spec)[0])
  return trainer


def run_strategy(spec, name, placement, aux_heads=True, stats=None,
                 jit_compile=False):
  """Builds and times one strategy cell: (trainer, median step seconds).

  `stats`, a dict, receives the per-step median, min and max."""
  trainer = build_trainer(spec, name, placement, aux_heads, jit_compile)
  dataset = tf.data.Dataset.from_tensors(make_batch(spec)).repeat()
  iterator = iter(trainer.distribute_dataset(dataset))
  timed = time_call_stats(lambda: trainer.train_loop(iterator), spec.steps)
  per_step = {k: v / spec.config.run.steps_per_loop for k, v in timed.items()}
  if stats is not None:
    stats.update(per_step)
  return trainer, per_step["median"]


def run_plain_keras(spec, jit_compile="auto"):
  """The same layers as one keras.Sequential, one optimizer: what a user
  writes without tf_interlock. Median seconds per step. `jit_compile` is
  Keras's own: "auto" (its default: the baseline a user has), True or
  False.

  Timed exactly as the strategies (`run_strategy`): Keras's own compiled
  train function (what `fit` calls, steps_per_execution = steps_per_loop
  steps a call) on an iterator, WARMUP_CALLS warm-ups, median of `steps`
  calls."""
  modules = build_modules(spec, aux_heads=False)
  model = keras.Sequential([m.body for m in modules])
  model.compile(optimizer=optimization.make_optimizer(spec.config, None),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                steps_per_execution=spec.config.run.steps_per_loop,
                jit_compile=jit_compile)
  dataset = tf.data.Dataset.from_tensors(make_batch(spec)).repeat()
  # One short fit builds the model, optimizer and metrics (as
  # trainer.build does for the strategies) and makes the train function.
  model.fit(dataset, steps_per_epoch=spec.config.run.steps_per_loop, verbose=0)
  iterator = iter(dataset)
  seconds = time_calls(lambda: model.train_function(iterator), spec.steps)
  return seconds / spec.config.run.steps_per_loop


class _EpochTimes(keras.callbacks.Callback):
  """Seconds from each epoch's begin to its end (Keras's callbacks)."""

  def __init__(self):
    super().__init__()
    self.seconds = []
    self._start = None

  def on_epoch_begin(self, epoch, logs=None):
    self._start = time.perf_counter()

  def on_epoch_end(self, epoch, logs=None):
    self.seconds.append(time.perf_counter() - self._start)


def run_fit(spec, name, placement):
  """`InterlockModel.fit` on the same modules and batch as `run_strategy`.

  Two medians, seconds per step, each over `spec.steps` samples after one
  warm-up fit call that traces the train function:
    call:  whole `fit(steps_per_epoch=steps_per_loop)` calls, i.e. one
           train_loop call each plus everything `fit` adds per call (the
           epoch iterator and its tf.data iterator made and destroyed,
           callbacks, metric trackers, logs);
    epoch: the epochs 2.. of one `fit(epochs=steps + 1)` call of
           steps_per_loop steps each, begin to end of epoch (one train_loop
           call, the trackers' reset and update, the logs): fit's steady
           state.

  Returns:
    {"call": seconds per step, "epoch": seconds per step}.
  """
  from tf_interlock.keras import model as keras_model  # pylint: disable=g-import-not-at-top
  strategy, microbatches = parse_cell(name)
  model = keras_model.InterlockModel(build_modules(spec), strategy,
                                     placement=placement,
                                     num_microbatches=microbatches)
  per_call = spec.config.run.steps_per_loop
  model.compile(
      optimizer=lambda k: optimization.make_optimizer(spec.config, None),
      steps_per_execution=per_call)
  x, y = make_batch(spec)
  dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
  fit_call = lambda: model.fit(dataset, steps_per_epoch=per_call, verbose=0)  # noqa
  calls = time_call_stats(fit_call, spec.steps)["median"]
  epochs = _EpochTimes()
  model.fit(dataset, steps_per_epoch=per_call, epochs=spec.steps + 1,
            verbose=0, callbacks=[epochs])
  return {"call": calls / per_call,
          "epoch": float(np.median(epochs.seconds[1:])) / per_call}


def predict(costs, name, num_cores, threads=1, module_devices=None,
            microbatch_costs=None, ops_per_device=1, contention=1.0,
            loop=None, loop_block=1):
  """The schedule model's step seconds for strategy cell `name`, from op
  costs measured under `threads` intra-op threads: an op holds `threads`
  cores, with no further speedup (efficiency 0), as its cost already has
  it. microbatch_costs: {M: costs measured on batch / M} (see
  `schedule.simulate`); a cell whose M is missing scales `costs` by 1/M.
  ops_per_device: see `schedule.simulate`; a simulated plan's process runs
  any device's ops on its inter-op pool of D threads, so pass D there.
  contention: see `schedule.simulate` (`research.concurrency_probe`).
  loop: how the cell's calls run their steps
  (`InterlockTrainer.resolved_loop`); None: as a one-process CPU trainer
  of the cell runs them (`cell_run_loop`). loop_block: the steps of one
  block of that loop (`InterlockTrainer.loop_plan`)."""
  strategy, microbatches = parse_cell(name)
  micro = (microbatch_costs or {}).get(microbatches)
  if cell_options(name)["recompute"]:
    costs = memory.recompute_costs(costs)
    micro = micro and memory.recompute_costs(micro)
  return schedule.simulate(
      costs, strategy, num_microbatches=microbatches, num_cores=num_cores,
      threads_per_device=threads, module_devices=module_devices,
      thread_efficiency=0.0,
      microbatch_costs=micro,
      ops_per_device=ops_per_device, contention=contention,
      loop=loop or cell_run_loop(name, len(costs)),
      loop_block=loop_block).step_time


def read_contention(path):
  """{batch: contention} of a research.concurrency_probe report at `path`,
  in its order: the network's whole batch first, then its microbatches.

  Raises:
    ValueError: one line, for a report without it (an older probe's).
  """
  report = user_files.read_json(path, "--contention_from")
  try:
    found = {int(batch): float(row["contention"])
             for batch, row in report["batches"].items()}
  except (KeyError, TypeError, ValueError, AttributeError):
    found = {}
  if not found or not all(1.0 <= c < float("inf") for c in found.values()):
    raise ValueError(f"{path} holds no research.concurrency_probe "
                     f"`contention` >= 1 per batch (an older probe's report,"
                     f" or not a probe's); run research.concurrency_probe "
                     f"again")
  return found


def measure_strategies(spec, strategies, placement, num_cores, threads=1,
                       module_devices=None, fit=False, costs=True):
  """Times each strategy and asks the schedule model for its step time.

  With `fit`, each strategy is also timed through `InterlockModel.fit`
  (fit_step_s, fit_over_train_loop).

  With `costs`, the op costs are measured once in this process, after the
  first strategy was timed (on its trainer, under this process's threads),
  and for a cell of M microbatches also at batch / M, and feed `predict`;
  without, no prediction is made here. Where the plan's devices run on
  more cores than one op holds, each cell's costs are first scaled to its
  step's work, timed on one op's cores (`work_scale`).

  Returns:
    (rows, costs): rows maps a strategy to measured_step_s (and its min and
    max over the timed calls), predicted_step_s (None without `costs`) and
    examples_per_s; costs are the measured `schedule.ModuleCost`s or None.
  """
  x, y = make_batch(spec)
  rows, measured_costs, micro = {}, None, {}
  for name in strategies:
    stats = {}
    trainer, step = run_strategy(spec, name, placement, stats=stats)
    if costs and measured_costs is None:
      measured_costs = profiling.measure_module_costs(trainer, x, y,
                                                      cores=threads)
    m = parse_cell(name)[1]
    if measured_costs is not None and m > 1 and m not in micro:
      # One microbatch's ops, timed M at a time inside one graph.
      micro[m] = profiling.measure_module_costs(trainer, x, y,
                                                microbatches=m, cores=threads)
    predicted, scaling = None, {}
    loop, block = trainer.loop_plan()
    if measured_costs is not None:
      devices = 1 + max(module_devices or [0])
      scale = 1.0
      if num_cores and devices > 1 and num_cores > threads:
        scaling = work_scale(trainer, spec, name, measured_costs,
                             micro.get(m), threads)
        scale = scaling["cost_scale"]
      predicted = predict(
          [c.scaled(scale) for c in measured_costs], name, num_cores,
          threads, module_devices,
          microbatch_costs={n: [c.scaled(scale) for c in v]
                            for n, v in micro.items()},
          ops_per_device=devices, loop=loop, loop_block=block)
    rows[name] = {"measured_step_s": step, "measured_min_s": stats["min"],
                  "measured_max_s": stats["max"],
                  "predicted_step_s": predicted, **scaling,
                  "examples_per_s": spec.config.run.batch_size / step,
                  "loop": loop, "loop_block": block}
    if m > 1 and m in micro:  # The costs the cell's prediction used.
      rows[name]["microbatch_costs_ms"] = costs_ms(micro[m])
    options = cell_options(name)
    rows[name].update(benchmark_memory.memory_row(
        trainer, (x, y), m, recompute=options["recompute"],
        lean=options["memory_lean"]))
    if fit:
      fit_step = run_fit(spec, name, placement)
      rows[name].update(fit_step_s=fit_step["call"],
                        fit_over_train_loop=fit_step["call"] / step,
                        fit_epoch_step_s=fit_step["epoch"],
                        fit_epoch_over_train_loop=fit_step["epoch"] / step)
  return rows, measured_costs


def work_scale(trainer, spec, name, costs, microbatch_costs, cores,
               calls=5):
  """How much of cell `name`'s op costs its step's work really is.

  The op costs are timed one tf.function call at a time, and each call's
  fixed cost (dispatch, setting up the call's graph, handing back its
  outputs) lands on its ops: 0.07 ms for an empty function on the 2-core
  VM, about 0.3 ms for an SGD update, 0.7 ms for the width-512 MLP's aux
  head on 8 microbatches. The step's graph pays it once for all of its
  ops, but pays the glue between modules (cutting, routing, metric sums),
  which no op cost holds. Summed, the costs were up to 1.36x a step's work
  (the width-512 MLP, local-m8; docs/results/speed_held/README.md). The step itself is
  timed here with every thread of the process on the `cores` cores one op
  holds in the model (`profiling.holding_cores`): the devices' ops take
  turns there, so its time is the step's work. The model keeps the costs'
  shares; their sum becomes the step's work.

  Args:
    trainer: the cell's built `InterlockTrainer`.
    spec: the benchmark spec it was built from.
    name: the cell (`parse_cell`).
    costs, microbatch_costs: the `schedule.ModuleCost`s `predict` is given
      (the microbatch costs of the cell's M, None for M = 1).
    cores: the cores one op holds (the plan's threads per device).
    calls: timed calls of steps_per_loop steps (after `WARMUP_CALLS`).

  Returns:
    {"serial_step_s": the step's work, "charged_work_s": the op costs'
    sum (`schedule.step_work`), "cost_scale": their ratio}.
  """
  strategy, microbatches = parse_cell(name)
  if cell_options(name)["recompute"]:
    costs = memory.recompute_costs(costs)
    microbatch_costs = microbatch_costs and memory.recompute_costs(
        microbatch_costs)
  charged = schedule.step_work(costs, strategy, microbatches,
                               microbatch_costs=microbatch_costs)
  dataset = tf.data.Dataset.from_tensors(make_batch(spec)).repeat()
  iterator = iter(trainer.distribute_dataset(dataset))
  with profiling.holding_cores(cores):
    serial = time_calls(lambda: trainer.train_loop(iterator), calls)
  serial /= spec.config.run.steps_per_loop
  return {"serial_step_s": serial, "charged_work_s": charged,
          "cost_scale": serial / charged if charged else 1.0}


def costs_ms(costs):
  """Per module [forward, input_vjp, weight_vjp, aux, update, fused_vjp,
  accumulate] in ms (fused_vjp None when not measured)."""
  return [[None if c is None else round(1e3 * c, 3)
           for c in dataclasses.astuple(m)] for m in costs]


def costs_from_ms(rows):
  """The inverse of `costs_ms`; rows of 5 (written before the fused VJP and
  the accumulation were measured) leave those unmeasured."""
  return [schedule.ModuleCost(*(None if v is None else v / 1e3
                                for v in row)) for row in rows]


def pipeline_peer(rows):
  """The best microbatched e2e pipeline among `rows` (the e2e-mM cells):
  (name, measured step s, predicted step s), each the smallest over M, or
  None when no such cell ran."""
  cells = {n: r for n, r in rows.items() if is_pipeline(n)}
  if not cells:
    return None
  best = min(cells, key=lambda n: cells[n]["measured_step_s"])
  predicted = [r["predicted_step_s"] for r in cells.values()]
  return (best, cells[best]["measured_step_s"],
          None if None in predicted else min(predicted))


def _ratio(a, b):
  """a / b, or None when either is unknown (no op costs were measured:
  `--costs=false` leaves every prediction None)."""
  return None if a is None or b is None else a / b


def add_peer(rows):
  """Each row's speedup over the best microbatched e2e pipeline among
  `rows` (`pipeline_peer`), measured and modelled; nothing without one."""
  peer = pipeline_peer(rows)
  if peer is None:
    return
  for row in rows.values():
    row["pipeline_peer"] = peer[0]
    row["measured_speedup_vs_pipeline"] = peer[1] / row["measured_step_s"]
    row["predicted_speedup_vs_pipeline"] = _ratio(peer[2],
                                                  row["predicted_step_s"])


# Baselines timed before and after the workers further apart than this
# are named in the report: its ratios against plain Keras are that unsure.
BASELINE_DRIFT = 0.10


def merge_baselines(reports):
  """One baseline report from several timed around the workers: each step
  time the mean of theirs, each run's kept (`*_runs_s`), and
  `baseline_drift`, max / min - 1 of plain Keras's step times."""
  plain = [r["plain_keras_step_s"] for r in reports]
  e2e = [r["e2e_single_step_s"] for r in reports]
  merged = dict(reports[0], plain_keras_step_s=float(np.mean(plain)),
                e2e_single_step_s=float(np.mean(e2e)),
                plain_keras_runs_s=plain, e2e_single_runs_s=e2e,
                baseline_drift=max(plain) / min(plain) - 1)
  merged["e2e_overhead_vs_keras"] = (merged["e2e_single_step_s"] /
                                     merged["plain_keras_step_s"])
  return merged


def add_speedups(rows, e2e_row, plain_step_s):
  """Speedups against e2e on the same plan, against the best microbatched
  e2e pipeline there (`add_peer`) and against plain Keras."""
  add_peer(rows)
  for row in rows.values():
    if e2e_row is not None:
      row["measured_speedup"] = (e2e_row["measured_step_s"] /
                                 row["measured_step_s"])
      row["predicted_speedup"] = _ratio(e2e_row["predicted_step_s"],
                                        row["predicted_step_s"])
    if plain_step_s is not None:
      row["speedup_vs_plain_keras"] = plain_step_s / row["measured_step_s"]
    row["model_over_measured"] = _ratio(row["predicted_step_s"],
                                        row["measured_step_s"])


def run_child(args, module="research.benchmark", report=True):
  """Runs `python -m <module> *args` in a child process (its own thread
  pools) from the repository root; its JSON report (the last line of its
  output), or None without `report` (a child that writes its own file).

  Raises:
    RuntimeError: with the child's last line of stderr when it failed.
  """
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  args = [sys.executable, "-m", module, *args]
  env = dict(os.environ, PYTHONPATH=root + os.pathsep +
             os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run(args, cwd=root, env=env, capture_output=True,
                        text=True, check=False)
  if proc.returncode:
    lines = proc.stderr.strip().splitlines() or ["(no output)"]
    raise RuntimeError(f"{module} {' '.join(args[3:])} failed "
                       f"(rc {proc.returncode}): {lines[-1]}")
  return json.loads(proc.stdout.strip().splitlines()[-1]) if report else None


def threading_state():
  """This process's TF thread pools: {intra_op, inter_op} (0: TF's default,
  every core)."""
  return {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
          "inter_op": tf.config.threading.get_inter_op_parallelism_threads()}


def _row_line(name, plan, row):
  def ratio(key):
    value = row.get(key)
    return "-" if value is None else f"{value:.2f}x"

  def ms(key):
    value = row.get(key)
    return "-" if value is None else f"{1e3 * value:.1f}"

  model_over = ("-" if row.get("model_over_measured") is None
                else f"{row['model_over_measured']:.2f}")
  return (f"{name:9s} {plan:36s} {1e3 * row['measured_step_s']:8.1f} "
          f"{ms('fit_step_s'):>8s} {ms('fit_epoch_step_s'):>8s} "
          f"{ms('predicted_step_s'):>8s} "
          f"{model_over:>10s} "
          f"{ratio('speedup_vs_plain_keras'):>8s} "
          f"{ratio('measured_speedup'):>7s} {ratio('predicted_speedup'):>7s} "
          f"{ratio('measured_speedup_vs_pipeline'):>7s} "
          f"{ratio('predicted_speedup_vs_pipeline'):>7s}")


def format_table(report):
  """The human-readable report of `research.benchmark`."""
  plain = report.get("plain_keras_step_s")
  lines = []
  if plain is not None:
    lines.append(
        f"plain Keras fit, all {report['baseline_threads']} cores (own "
        f"process): {1e3 * plain:.1f} ms/step; tf_interlock e2e without aux "
        f"heads there: {1e3 * report['e2e_single_step_s']:.1f} ms/step "
        f"({report['e2e_overhead_vs_keras']:.2f}x)")
    runs = report.get("plain_keras_runs_s")
    if runs:
      lines.append(
          "plain Keras timed before and after the strategies: " +
          ", ".join(f"{1e3 * t:.1f}" for t in runs) + " ms/step (the mean "
          "above)")
    if report.get("baseline_drift", 0) > BASELINE_DRIFT:
      lines.append(
          f"warning: plain Keras ran {100 * report['baseline_drift']:.0f}% "
          f"apart before and after: the host's speed drifted, and every "
          f"ratio against plain Keras is unsure by as much (run on a "
          f"quiet host)")
  header = (f"{'strategy':9s} {'plan':36s} {'step ms':>8s} "
            f"{'fit call':>8s} {'fit ep':>8s} "
            f"{'model ms':>8s} {'model/meas':>10s} {'vs Keras':>8s} "
            f"{'vs e2e':>7s} {'model':>7s} {'vs pipe':>7s} {'model':>7s}")
  lines += ["", "Each strategy on its chosen plan (vs e2e: e2e on that plan; "
            "vs pipe: the best microbatched e2e, e2e-mM, on its own plan):",
            header]
  for name, row in report["strategies"].items():
    lines.append(_row_line(name, row.get("plan", report["placement"]), row))
  cores = {n: r["cores_in_use"] for n, r in report["strategies"].items()
           if r.get("cores_in_use")}
  if cores:  # Plain Keras had them all: the plans' share of the host.
    lines.append(f"cores in use of {report['num_cores']}: " + ", ".join(
        f"{n} {c}" for n, c in cores.items()))
  scales = {n: r["cost_scale"] for n, r in report["strategies"].items()
            if r.get("cost_scale")}
  if scales:  # The model's op costs, scaled to each step's work.
    lines.append("op costs scaled to the step's work timed on one op's "
                 "cores: " + ", ".join(f"{n} {c:.2f}"
                                        for n, c in scales.items()))
  for run in report.get("runs", []):
    lines += ["", f"Every strategy run on {run['plan']}:", header]
    for name, row in run["strategies"].items():
      lines.append(_row_line(name, run["plan"], row))
  lines += ["", "step ms: InterlockTrainer.train_loop, median per step of "
            "calls of steps_per_loop steps. fit call: InterlockModel.fit "
            "calls of steps_per_loop steps (everything fit adds per call), "
            "median per step. fit ep: fit's epochs 2.. of steps_per_loop "
            "steps within one call (steady state), median per step."]
  memory_lines = benchmark_memory.format_memory(report["strategies"])
  return "\n".join(lines + ([memory_lines] if memory_lines else []))


def check_json_out(path, flag="json_out"):
  """A report path (--json_out, --out) must be writable at the end: refused
  now (`user_files.check_output`: a folder, a link, a FIFO, a missing
  folder), not after the whole run; an existing file is named, since the
  run replaces it."""
  user_files.check_output(path, f"--{flag}")
  if tf.io.gfile.exists(path):
    print(f"warning: --{flag}={path} exists; this run replaces it at the "
          f"end", file=sys.stderr, flush=True)
