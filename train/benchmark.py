r"""Step-time benchmark: each strategy measured and predicted, vs plain Keras.

  python -m train.benchmark --model=mlp --num_modules=4 \
      --strategies=e2e,local,2wise,3wise --placement=simulated --json

For each strategy it builds the same network split into K modules, times
`steps_per_loop` steps per `tf.function` call (median over --steps calls),
measures each module's op costs, and asks the schedule model
(`tf_interlock.schedule`) for the predicted step time. It also trains the
same layers as one plain Keras model with one optimizer on one device (what
a user would write without tf_interlock) and reports e2e's overhead against
it (e2e without aux heads, on one device).
"""

import json
import os
import time

from absl import app
from absl import flags
import keras
import numpy as np
import tensorflow as tf

from layers import resnet
from layers.interlock_module import InterlockModule
from tf_interlock import placement as placement_lib
from tf_interlock import profiling
from tf_interlock import schedule
from tf_interlock.trainer import InterlockTrainer

_MODEL = flags.DEFINE_enum("model", "mlp", ["mlp", "resnet"], "Network.")
_PRESET = flags.DEFINE_string("preset", "resnet20", "ResNet preset.")
_NUM_MODULES = flags.DEFINE_integer("num_modules", 4, "K.")
_STRATEGIES = flags.DEFINE_list("strategies", ["e2e", "local", "2wise",
                                               "3wise"], "Strategies.")
_PLACEMENT = flags.DEFINE_enum("placement", "simulated",
                               ["single", "simulated", "gpu"], "Placement.")
_BATCH = flags.DEFINE_integer("batch_size", 512, "Global batch size.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed loop calls per strategy.")
_STEPS_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 16,
                                       "Steps per tf.function call.")
_WIDTH = flags.DEFINE_integer("width", 1024, "MLP width.")
_LAYERS = flags.DEFINE_integer("layers_per_module", 1, "MLP layers/module.")
_IMAGE = flags.DEFINE_integer("image_size", 32, "ResNet input size.")
_CORES = flags.DEFINE_integer("num_cores", None,
                              "Cores for the model (default: K).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object.")

NUM_CLASSES = 10


def build_modules(num_modules, aux_heads=True):
  """The benchmark network as K InterlockModules."""
  if _MODEL.value == "resnet":
    return resnet.resnet_modules(
        _PRESET.value, NUM_CLASSES, num_modules,
        input_shape=(_IMAGE.value, _IMAGE.value, 3),
        aux_head="authors" if aux_heads else None, synchronized_bn=False)
  modules = []
  for k in range(num_modules):
    body = [keras.layers.Dense(_WIDTH.value, activation="relu")
            for _ in range(_LAYERS.value)]
    last = k == num_modules - 1
    if last:
      body.append(keras.layers.Dense(NUM_CLASSES))
    head = keras.layers.Dense(NUM_CLASSES) if aux_heads and not last else None
    modules.append(InterlockModule(body, aux_head=head))
  return modules


def make_batch():
  rng = np.random.default_rng(0)
  shape = ((_IMAGE.value, _IMAGE.value, 3) if _MODEL.value == "resnet"
           else (_WIDTH.value,))
  x = rng.normal(size=(_BATCH.value,) + shape).astype("float32")
  y = rng.integers(0, NUM_CLASSES, size=(_BATCH.value,)).astype("int32")
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


def run_strategy(strategy, placement_kind, aux_heads=True):
  """Builds and times one strategy: (trainer, median step seconds)."""
  k = _NUM_MODULES.value
  placement = placement_lib.make_placement(placement_kind, k)
  modules = build_modules(k, aux_heads)
  trainer = InterlockTrainer(
      modules, lambda i: keras.optimizers.SGD(0.01, momentum=0.9), strategy,
      placement=placement, steps_per_loop=_STEPS_PER_LOOP.value)
  x, y = make_batch()
  trainer.build(x)
  dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
  iterator = iter(trainer.distribute_dataset(dataset))
  seconds = time_calls(lambda: trainer.train_loop(iterator), _STEPS.value)
  return trainer, seconds / _STEPS_PER_LOOP.value


def run_plain_keras():
  """The same layers as one keras.Sequential, one optimizer, `fit`."""
  modules = build_modules(_NUM_MODULES.value, aux_heads=False)
  model = keras.Sequential([m.body for m in modules])
  model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                steps_per_execution=_STEPS_PER_LOOP.value)
  x, y = make_batch()
  dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
  spl = _STEPS_PER_LOOP.value
  seconds = time_calls(
      lambda: model.fit(dataset, steps_per_epoch=spl, epochs=1, verbose=0),
      _STEPS.value)
  return seconds / spl


def main(argv):
  del argv
  k = _NUM_MODULES.value
  if _PLACEMENT.value == "simulated":
    # Before the first op: logical devices and thread pools are fixed then.
    placement_lib.configure_simulated_devices(k)
  x, y = make_batch()
  cores = _CORES.value or (min(k, os.cpu_count())
                           if _PLACEMENT.value == "simulated" else k)
  results = {}
  costs = None
  for name in _STRATEGIES.value:
    trainer, step = run_strategy(name, _PLACEMENT.value)
    if costs is None:
      costs = profiling.measure_module_costs(trainer, x, y)
    predicted = schedule.simulate(costs, name, num_cores=cores).step_time
    results[name] = {"measured_step_s": step, "predicted_step_s": predicted,
                     "examples_per_s": _BATCH.value / step}
  if "e2e" in results:
    base, base_pred = (results["e2e"]["measured_step_s"],
                       results["e2e"]["predicted_step_s"])
    for row in results.values():
      row["measured_speedup"] = base / row["measured_step_s"]
      row["predicted_speedup"] = base_pred / row["predicted_step_s"]
  _, e2e_single = run_strategy("e2e", "single", aux_heads=False)
  plain = run_plain_keras()
  report = {
      "model": _MODEL.value, "num_modules": k, "placement": _PLACEMENT.value,
      "batch_size": _BATCH.value, "num_cores": cores,
      "steps_per_loop": _STEPS_PER_LOOP.value, "strategies": results,
      "plain_keras_step_s": plain, "e2e_single_step_s": e2e_single,
      "e2e_overhead_vs_keras": e2e_single / plain,
      "module_costs_ms": [[round(1e3 * c, 3) for c in (
          m.forward, m.input_vjp, m.weight_vjp, m.aux, m.update)]
                          for m in costs],
  }
  if _JSON.value:
    print(json.dumps(report))
    return
  print(f"{'strategy':10s} {'step ms':>9s} {'model ms':>9s} {'speedup':>8s} "
        f"{'model':>7s} {'ex/s':>9s}")
  for name, row in results.items():
    print(f"{name:10s} {1e3 * row['measured_step_s']:9.1f} "
          f"{1e3 * row['predicted_step_s']:9.1f} "
          f"{row.get('measured_speedup', float('nan')):7.2f}x "
          f"{row.get('predicted_speedup', float('nan')):6.2f}x "
          f"{row['examples_per_s']:9.0f}")
  print(f"plain Keras {1e3 * plain:.1f} ms/step; e2e (no aux, one device) "
        f"{1e3 * e2e_single:.1f} ms/step: overhead "
        f"{report['e2e_overhead_vs_keras']:.2f}x")


if __name__ == "__main__":
  app.run(main)
