"""What train.benchmark measures, as functions of values (no flags).

One process times the strategies under one threading plan (TF's thread
pools are fixed per process); the plain Keras baseline runs in a process of
its own with TF's default threading, as a user would run it.
"""

import dataclasses
import time

import keras
import numpy as np
import tensorflow as tf

from layers import resnet
from layers.interlock_module import InterlockModule
from tf_interlock import placement as placement_lib
from tf_interlock import profiling
from tf_interlock import schedule
from tf_interlock.trainer import InterlockTrainer

NUM_CLASSES = 10


@dataclasses.dataclass(frozen=True)
class Spec:
  """The benchmark network, its batch and how long to time it."""
  model: str = "mlp"
  preset: str = "resnet20"
  num_modules: int = 4
  width: int = 1024
  layers_per_module: int = 1
  image_size: int = 32
  batch_size: int = 512
  steps: int = 5
  steps_per_loop: int = 16


def build_modules(spec, aux_heads=True):
  """The benchmark network as K InterlockModules (unbuilt)."""
  if spec.model == "resnet":
    return resnet.resnet_modules(
        spec.preset, NUM_CLASSES, spec.num_modules,
        input_shape=(spec.image_size, spec.image_size, 3),
        aux_head="authors" if aux_heads else None, synchronized_bn=False)
  modules = []
  for k in range(spec.num_modules):
    body = [keras.layers.Dense(spec.width, activation="relu")
            for _ in range(spec.layers_per_module)]
    last = k == spec.num_modules - 1
    if last:
      body.append(keras.layers.Dense(NUM_CLASSES))
    head = keras.layers.Dense(NUM_CLASSES) if aux_heads and not last else None
    modules.append(InterlockModule(body, aux_head=head))
  return modules


def make_batch(spec):
  """One fixed batch (features, labels) of the benchmark's shape."""
  rng = np.random.default_rng(0)
  shape = ((spec.image_size, spec.image_size, 3) if spec.model == "resnet"
           else (spec.width,))
  x = rng.normal(size=(spec.batch_size,) + shape).astype("float32")
  y = rng.integers(0, NUM_CLASSES, size=(spec.batch_size,)).astype("int32")
  return x, y


def time_calls(fn, calls):
  """Median seconds of `fn()` over `calls` calls, after two warm-ups."""
  fn()
  fn()
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def simulated_placement(plan):
  """Module k on logical CPU device plan.module_devices[k]."""
  return placement_lib.make_placement(
      "simulated", len(plan.module_devices),
      module_devices=plan.module_devices)


def run_strategy(spec, strategy, placement, aux_heads=True):
  """Builds and times one strategy: (trainer, median step seconds)."""
  modules = build_modules(spec, aux_heads)
  trainer = InterlockTrainer(
      modules, lambda i: keras.optimizers.SGD(0.01, momentum=0.9), strategy,
      placement=placement, steps_per_loop=spec.steps_per_loop)
  x, y = make_batch(spec)
  trainer.build(x)
  dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
  iterator = iter(trainer.distribute_dataset(dataset))
  seconds = time_calls(lambda: trainer.train_loop(iterator), spec.steps)
  return trainer, seconds / spec.steps_per_loop


def run_plain_keras(spec):
  """The same layers as one keras.Sequential, one optimizer, `fit`: what a
  user writes without tf_interlock. Median seconds per step."""
  modules = build_modules(spec, aux_heads=False)
  model = keras.Sequential([m.body for m in modules])
  model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                steps_per_execution=spec.steps_per_loop)
  x, y = make_batch(spec)
  dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
  # One fit call runs `steps` loops of steps_per_loop steps: the per-call
  # set-up of fit is paid once, as in a real run, not once per timed loop.
  per_call = spec.steps * spec.steps_per_loop
  model.fit(dataset, steps_per_epoch=spec.steps_per_loop, epochs=1,
            verbose=0)  # Trace and warm up.
  times = []
  for _ in range(3):
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=per_call, epochs=1, verbose=0)
    times.append(time.perf_counter() - start)
  return float(np.median(times)) / per_call


def run_fit(spec, strategy, placement):
  """`InterlockModel.fit` on the same modules and batch as `run_strategy`:
  median seconds per step over 3 calls of `steps` x `steps_per_loop` steps
  (one warm-up call traces it)."""
  from tf_interlock import keras_model  # pylint: disable=g-import-not-at-top
  model = keras_model.InterlockModel(build_modules(spec), strategy,
                                     placement=placement)
  model.compile(optimizer=lambda k: keras.optimizers.SGD(0.01, momentum=0.9),
                steps_per_execution=spec.steps_per_loop)
  x, y = make_batch(spec)
  dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
  model.fit(dataset, steps_per_epoch=spec.steps_per_loop, verbose=0)
  per_call = spec.steps * spec.steps_per_loop
  times = []
  for _ in range(3):
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=per_call, verbose=0)
    times.append(time.perf_counter() - start)
  return float(np.median(times)) / per_call


def measure_strategies(spec, strategies, placement, num_cores, threads=1,
                       module_devices=None, fit=False):
  """Times each strategy and asks the schedule model for its step time.

  With `fit`, each strategy is also timed through `InterlockModel.fit`
  (fit_step_s, fit_over_train_loop).

  The op costs are measured once (on the first strategy's trainer) under
  this process's threads: an op then holds `threads` cores in the model,
  with no further speedup (efficiency 0), as its cost already has it.

  Returns:
    (rows, costs): rows maps a strategy to measured_step_s,
    predicted_step_s and examples_per_s; costs are the measured
    `schedule.ModuleCost`s.
  """
  x, y = make_batch(spec)
  rows, costs = {}, None
  for name in strategies:
    trainer, step = run_strategy(spec, name, placement)
    if costs is None:
      costs = profiling.measure_module_costs(trainer, x, y)
    predicted = schedule.simulate(
        costs, name, num_cores=num_cores, threads_per_device=threads,
        module_devices=module_devices, thread_efficiency=0.0).step_time
    rows[name] = {"measured_step_s": step, "predicted_step_s": predicted,
                  "examples_per_s": spec.batch_size / step}
    if fit:
      fit_step = run_fit(spec, name, placement)
      rows[name].update(fit_step_s=fit_step,
                        fit_over_train_loop=fit_step / step)
  return rows, costs


def costs_ms(costs):
  """Per module [forward, input_vjp, weight_vjp, aux, update] in ms."""
  return [[round(1e3 * c, 3) for c in (
      m.forward, m.input_vjp, m.weight_vjp, m.aux, m.update)] for m in costs]


def costs_from_ms(rows):
  """The inverse of `costs_ms`."""
  return [schedule.ModuleCost(*(v / 1e3 for v in row)) for row in rows]


def add_speedups(rows, e2e_row, plain_step_s):
  """Speedups against e2e on the same plan and against plain Keras."""
  for row in rows.values():
    if e2e_row is not None:
      row["measured_speedup"] = (e2e_row["measured_step_s"] /
                                 row["measured_step_s"])
      row["predicted_speedup"] = (e2e_row["predicted_step_s"] /
                                  row["predicted_step_s"])
    if plain_step_s is not None:
      row["speedup_vs_plain_keras"] = plain_step_s / row["measured_step_s"]
    row["model_over_measured"] = (row["predicted_step_s"] /
                                  row["measured_step_s"])


def threading_state():
  """This process's TF thread pools: {intra_op, inter_op} (0: TF's default,
  every core)."""
  return {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
          "inter_op": tf.config.threading.get_inter_op_parallelism_threads()}


def _row_line(name, plan, row):
  def ratio(key):
    value = row.get(key)
    return "-" if value is None else f"{value:.2f}x"

  fit = row.get("fit_step_s")
  return (f"{name:9s} {plan:36s} {1e3 * row['measured_step_s']:8.1f} "
          f"{'-' if fit is None else f'{1e3 * fit:.1f}':>7s} "
          f"{1e3 * row['predicted_step_s']:8.1f} "
          f"{row['model_over_measured']:10.2f} "
          f"{ratio('speedup_vs_plain_keras'):>8s} "
          f"{ratio('measured_speedup'):>7s} {ratio('predicted_speedup'):>7s}")


def format_table(report):
  """The human-readable report of `train.benchmark`."""
  plain = report.get("plain_keras_step_s")
  lines = []
  if plain is not None:
    lines.append(
        f"plain Keras fit, all {report['baseline_threads']} cores (own "
        f"process): {1e3 * plain:.1f} ms/step; tf_interlock e2e without aux "
        f"heads there: {1e3 * report['e2e_single_step_s']:.1f} ms/step "
        f"({report['e2e_overhead_vs_keras']:.2f}x)")
  header = (f"{'strategy':9s} {'plan':36s} {'step ms':>8s} {'fit ms':>7s} "
            f"{'model ms':>8s} {'model/meas':>10s} {'vs Keras':>8s} "
            f"{'vs e2e':>7s} {'model':>7s}")
  lines += ["", "Each strategy on its chosen plan (vs e2e: e2e on that plan):",
            header]
  for name, row in report["strategies"].items():
    lines.append(_row_line(name, row.get("plan", report["placement"]), row))
  for run in report.get("runs", []):
    lines += ["", f"Every strategy run on {run['plan']}:", header]
    for name, row in run["strategies"].items():
      lines.append(_row_line(name, run["plan"], row))
  return "\n".join(lines)
