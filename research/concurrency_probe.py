r"""How ops on simulated devices really share the cores: a measurement.

  python -m research.concurrency_probe \
      --out=docs/results/model_validation/concurrency_probe.json

The schedule model (`step_model.schedule`) assumes that a device runs one
op at a time and that ops on different devices run at full speed side by
side, each on its own core. Simulated devices are logical CPUs of one
process whose thread pools are process-wide
(`placement.configure_simulated_devices`): any inter-op thread may run any
device's op. This probe times, in a process set up as --devices logical CPUs
of --intra_op_threads threads with --devices inter-op threads (the
benchmark's plans), one chain of --layers Dense(width) forward ops on a
batch:

* alone: the chain on device 0;
* two_devices: the chain on device 0 and an independent copy on device 1 in
  one tf.function (the model: as fast as alone, if cores are free);
* one_device: both chains on device 0 (the model: twice alone).

The ratios to `alone` say how far each assumption holds on this host: 1.0
is "at once, at full speed", 2.0 is "one after the other". `contention` is
the factor c of `schedule.slowdown` that explains `two_devices` under
processor sharing (`schedule.contention_factor`); `research.model_validation`
passes it to the schedule model. Each time is the
median of --repeats calls after 2 warm-ups, for each batch of --batches
(the full batch and its microbatches); the cases take turns, one call each
per round, so the host's drift reaches them alike.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import json
import platform
import sys
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from tf_interlock import placement
from step_model import schedule
from step_model import threading_plan
from train import config as config_lib
from train import error_boundary
from train import user_files

_DEVICES = flags.DEFINE_integer(
    "devices", 2, "Logical CPU devices of the process (>= 2).")
_INTRA = flags.DEFINE_integer("intra_op_threads", 1,
                              "Intra-op threads of the process (>= 1).")
_WIDTH = flags.DEFINE_integer(
    "width", 1024, "Width of every Dense layer of a chain (>= 1).")
_LAYERS = flags.DEFINE_integer(
    "layers", 2, "Dense layers per chain, or with a --network its layers or"
    " blocks per module (the grid's: 2; the benchmark's MLP: 1) (>= 1).")
_BATCHES = flags.DEFINE_list("batches", ["512", "256", "128", "64"],
                             "Batch sizes to time (each >= 1).")
_REPEATS = flags.DEFINE_integer("repeats", 15, "Timed calls per case (>= 1).")
_NETWORK = flags.DEFINE_enum(
    "network", "chain", ["chain", "mlp", "resnet", "lm"],
    "chain: the --op chains below; mlp, resnet, lm: the model validation's "
    "networks at K = 2 (research.model_validation), where `alone` is module"
    " 1's forward and weight VJP, and `two_devices` runs module 2's (on its "
    "input h_1) at the same time on device 1 (one_device: both on device "
    "0). The ratio to the slower module alone is their contention.")
_MICROBATCHES = flags.DEFINE_list(
    "microbatches", [], "With a --network: also probe its modules on one "
    "microbatch, batch / M, for each M listed (each >= 2).")
_OP = flags.DEFINE_enum(
    "op", "matmul", ["matmul", "softmax"],
    "The chain's op: matmul (Dense + relu, as the MLP) or softmax (softmax "
    "and a mean over the last axis, the elementwise and reduction work of "
    "attention and LayerNorm, no matmul).")
_OUT = flags.DEFINE_string("out", None,
                           "Also write the JSON report to this file.")


def _medians_s(cases, repeats):
  """{name: median seconds} of each (name, fn) in `cases`, timed in turns.

  Each round calls every case once, so a change of the host's speed while
  the probe runs (20-30% within minutes on a shared VM,
  research.host_reference) reaches every case alike instead of biasing the
  ratio of whichever case ran in the slow minutes.
  """
  for _, fn in cases:
    fn()
    fn()
  times = {name: [] for name, _ in cases}
  for _ in range(repeats):
    for name, fn in cases:
      start = time.perf_counter()
      # expand_composites: an embedding's gradient is an IndexedSlices.
      tf.nest.map_structure(lambda t: t.numpy(), fn(),
                            expand_composites=True)
      times[name].append(time.perf_counter() - start)
  return {name: float(np.median(t)) for name, t in times.items()}


def _chain(x, weights, op):
  for w in weights:
    if op == "matmul":
      x = tf.nn.relu(tf.matmul(x, w))
    else:  # Same number of steps, no weights used: 8 softmax-and-mean.
      for _ in range(8):
        x = tf.nn.softmax(x) - tf.reduce_mean(x, axis=-1, keepdims=True)
  return x


def probe(devices, batch, width, layers, repeats, op="matmul"):
  """{case: seconds} for one batch size (see the module docstring)."""
  rng = np.random.default_rng(0)
  made = {}
  for d in (0, 1):
    with tf.device(devices[d]):
      made[d] = ([tf.Variable(rng.normal(size=(width, width)).astype(
          "float32") / width ** 0.5) for _ in range(layers)],
                 tf.constant(rng.normal(size=(batch, width)).astype("float32")))
  (w0, x0), (w1, x1) = made[0], made[1]

  @tf.function(autograph=False)
  def alone():
    with tf.device(devices[0]):
      return _chain(x0, w0, op)

  @tf.function(autograph=False)
  def two_devices():
    with tf.device(devices[0]):
      a = _chain(x0, w0, op)
    with tf.device(devices[1]):
      b = _chain(x1, w1, op)
    return a, b

  @tf.function(autograph=False)
  def one_device():
    with tf.device(devices[0]):
      return _chain(x0, w0, op), _chain(x1, w0, op)

  return _medians_s((("alone", alone), ("two_devices", two_devices),
                     ("one_device", one_device)), repeats)


# The model validation's networks (research.model_validation.NETWORKS), K = 2
# modules of --layers layers or blocks each (2 in the grid).
_SPECS = {
    "mlp": dict(model="mlp", width=1024, batch_size=512),
    "resnet": dict(model="resnet", preset="resnet20", image_size=28,
                   channels=1, resnet_aux_head="pool", batch_size=128),
    "lm": dict(model="lm", batch_size=32),
}


def module_probe(devices, network, repeats, batch=None, layers=2):
  """{case: seconds}: modules 1 and 2 of `network` (`layers` layers or
  blocks each), forward and weight VJP, alone, side by side on two devices
  and together on one, on the first `batch` examples (default: the
  network's whole batch)."""
  from research import benchmark_lib  # pylint: disable=import-outside-toplevel
  spec = benchmark_lib.make_spec(num_modules=2, layers_per_module=layers,
                                 **_SPECS[network])
  # Module k's weights on device k, as in the plan "2x1".
  trainer = benchmark_lib.build_trainer(
      spec, "e2e", benchmark_lib.simulated_placement(
          threading_plan.make_plan(2, 2, _INTRA.value)))
  x, _ = benchmark_lib.make_batch(spec)
  first, second = trainer.modules
  x = tf.convert_to_tensor(x[:batch])
  h = first.body(x, training=False)

  def work(module, inputs, device):
    with tf.device(device):
      with tf.GradientTape() as tape:
        out = module.body(inputs, training=True)
      return tape.gradient(out, module.body.trainable_variables,
                           output_gradients=tf.ones_like(out))

  @tf.function(autograph=False)
  def alone():
    return work(first, x, devices[0])

  @tf.function(autograph=False)
  def alone_second():
    return work(second, h, devices[0])

  @tf.function(autograph=False)
  def two_devices():
    return work(first, x, devices[0]), work(second, h, devices[1])

  @tf.function(autograph=False)
  def one_device():
    return work(first, x, devices[0]), work(second, h, devices[0])

  times = _medians_s((("alone", alone), ("alone_second", alone_second),
                      ("two_devices", two_devices),
                      ("one_device", one_device)), repeats)
  # `alone` is the slower module alone: both at once at full speed take it.
  first, second = times["alone"], times.pop("alone_second")
  times["alone"], times["faster_alone"] = max(first, second), min(first,
                                                                  second)
  return times


def validate():
  check = config_lib.check_number
  check("devices", _DEVICES.value, minimum=2, integer=True)
  for flag in (_INTRA, _WIDTH, _LAYERS, _REPEATS):
    check(flag.name, flag.value, minimum=1, integer=True)
  if not _BATCHES.value or not all(b.isdigit() and int(b) >= 1
                                   for b in _BATCHES.value):
    config_lib.fail("batches", ",".join(_BATCHES.value),
                    "must list ints >= 1")
  if not all(m.isdigit() and int(m) >= 2 for m in _MICROBATCHES.value):
    config_lib.fail("microbatches", ",".join(_MICROBATCHES.value),
                    "must list ints >= 2")


@error_boundary.guard()
def main(argv):
  validate()
  if _OUT.value:  # before minutes of timing
    user_files.check_output(_OUT.value, "--out")
  devices = placement.configure_simulated_devices(
      _DEVICES.value, intra_op_threads=_INTRA.value)
  rows = {}
  if _NETWORK.value == "chain":
    batches = list(map(int, _BATCHES.value))
  else:  # The whole batch first: read_contention's default.
    whole = _SPECS[_NETWORK.value]["batch_size"]
    batches = list(dict.fromkeys(
        [whole] + [whole // int(m) for m in _MICROBATCHES.value]))
  for batch in batches:
    times = (probe(devices, batch, _WIDTH.value, _LAYERS.value,
                   _REPEATS.value, _OP.value) if _NETWORK.value == "chain"
             else module_probe(devices, _NETWORK.value, _REPEATS.value,
                               batch, _LAYERS.value))
    rows[batch] = dict(
        {f"{k}_ms": round(1e3 * v, 3) for k, v in times.items()},
        two_devices_ratio=round(times["two_devices"] / times["alone"], 3),
        one_device_ratio=round(times["one_device"] / times["alone"], 3),
        # The schedule model's `contention` for this network and batch.
        contention=round(schedule.contention_factor(
            times["alone"], times.get("faster_alone", times["alone"]),
            times["two_devices"]), 3))
  report = {"command": " ".join(["python -m research.concurrency_probe"] +
                                sys.argv[1:]),
            "host": platform.node(), "onednn": runtime_env.onednn_state(),
            "devices": _DEVICES.value, "intra_op_threads": _INTRA.value,
            "inter_op_threads": tf.config.threading
            .get_inter_op_parallelism_threads(),
            "network": _NETWORK.value, "op": _OP.value, "width": _WIDTH.value, "layers": _LAYERS.value,
            "repeats": _REPEATS.value, "batches": rows}
  if _OUT.value:
    user_files.write_output(_OUT.value, json.dumps(report, indent=1) + "\n",
                            "--out")
  print("batch | alone ms | two devices ms (ratio) | one device ms (ratio) "
        "| contention")
  for batch, row in rows.items():
    print(f"{batch} | {row['alone_ms']:.2f} | {row['two_devices_ms']:.2f} "
          f"({row['two_devices_ratio']:.2f}) | {row['one_device_ms']:.2f} "
          f"({row['one_device_ratio']:.2f}) | {row['contention']:.2f}")


if __name__ == "__main__":
  app.run(main)
