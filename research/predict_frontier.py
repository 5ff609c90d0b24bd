r"""The predicted frontier with one device per module, K = 4 and K = 8.

  nice -n 10 python -m research.predict_frontier --num_modules=4,8 \
      --measured=docs/results/memory/resnet20_k4_simulated.json \
      --out_prefix=docs/results/memory/predicted_frontier_resnet20

For each K, a process of its own splits the host into K logical CPUs of one
thread each, builds ResNet-20 (`research.benchmark`'s network: "flops"
split, the authors' aux heads) and measures once the op costs of every
module (`profiling.measure_module_costs`, at the batch and at batch / M for
each M) and what each module holds (`memory.footprints`). Then every cell
(strategy x M x recompute, `frontier_lib.cell_names`) is predicted as if
each module had a device of its own: its step time by the schedule model
(K cores, no contention) and its peak memory per device by the count (the
largest device's). Writes PREFIX_kK.json (the inputs, every cell, the
frontier, each interlocking cell against the fastest pipeline at equal
memory) and PREFIX_kK.png.

The model's measured error is put beside the prediction: on the --measured
report (K = 4 on simulated CPUs) each cell is predicted on that report's
plan from the K = 4 costs and set against its measured step, and the
report's count over its measured memory is quoted. --reuse_inputs
predicts and draws again from the inputs in existing PREFIX_kK.json files,
measuring nothing.
"""

# First: checks the environment and quiets TF before TensorFlow loads.
from train import runtime_env  # pylint: disable=unused-import,g-bad-import-order

import json
import os

from absl import app
from absl import flags

from research import benchmark_lib
from research import frontier_lib
from train import config as config_lib
from train import error_boundary
from train import user_files

_NUM_MODULES = flags.DEFINE_list(
    "num_modules", ["4", "8"], "The K to predict, comma-separated ints >= 1.")
_PRESET = flags.DEFINE_string(
    "preset", "resnet20", "The ResNet preset (research.benchmark's "
    "--preset: resnet20/32/56/110, resnet18/34/50/101).")
_BATCH = flags.DEFINE_integer(
    "batch_size", 128, "Global batch per step (>= 1; the measured K = 4 "
    "run's); divisible by every M of --microbatches.")
_STEPS_PER_LOOP = flags.DEFINE_integer(
    "steps_per_loop", 4, "Steps per training call (>= 1; the count holds "
    "the batches it reads ahead).")
_MICROBATCHES = flags.DEFINE_list(
    "microbatches", ["1", "2", "4", "8"], "Microbatches per step of the "
    "cells, comma-separated ints >= 1 (1: the cells without -mM).")
_REPEATS = flags.DEFINE_integer(
    "repeats", 10, "Timed calls per op cost in one measurement (>= 1): "
    "their median is the measurement.")
_REPETITIONS = flags.DEFINE_integer(
    "repetitions", 3, "How often every op cost is measured (>= 1): the "
    "prediction takes the median, the JSON keeps the range (the host is "
    "shared).")
_MEASURED = flags.DEFINE_string(
    "measured", "docs/results/memory/resnet20_k4_simulated.json",
    "A research.benchmark report of the same network on simulated CPUs "
    "(one device per module): the model's measured error.")
_OUT_PREFIX = flags.DEFINE_string(
    "out_prefix", None, "Writes PREFIX_kK.json and PREFIX_kK.png per K "
    "(replaced if they exist; not links, folders or FIFOs).")
_REUSE = flags.DEFINE_bool(
    "reuse_inputs", False, "Take costs and footprints from the existing "
    "PREFIX_kK.json files instead of measuring them.")
_ROLE = flags.DEFINE_enum("role", "main", ["main", "measure"],
                          "Internal: measure one K in this process.")


def _ints(flag, minimum=1):
  values = [int(v) for v in flag.value if v.strip().isdigit()]
  if len(values) != len(flag.value) or not values or min(values) < minimum:
    config_lib.fail(flag.name, ",".join(flag.value),
                    f"must be comma-separated ints >= {minimum}")
  return values


def measure_inputs(num_modules, microbatches):
  """What one K's prediction needs, measured in this process on K logical
  CPUs of one thread each: the op costs and footprints (JSON-ready)."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from step_model import memory
  from step_model import profiling
  from step_model import threading_plan
  from tf_interlock import placement as placement_lib
  plan = threading_plan.make_plan(num_modules, num_modules, 1)
  placement_lib.configure_simulated_devices(num_modules, intra_op_threads=1)
  spec = benchmark_lib.make_spec(
      "resnet", num_modules, preset=_PRESET.value, batch_size=_BATCH.value,
      steps_per_loop=_STEPS_PER_LOOP.value)
  trainer = benchmark_lib.build_trainer(
      spec, "e2e", benchmark_lib.simulated_placement(plan))
  x, y = benchmark_lib.make_batch(spec)
  load = [os.getloadavg()[0]]
  measured = {m: profiling.repeated_module_costs(
      trainer, x, y, _REPETITIONS.value, _REPEATS.value, microbatches=m)
              for m in sorted({1, *microbatches})}
  load.append(os.getloadavg()[0])
  micro = {str(m): benchmark_lib.costs_ms(c[0])
           for m, c in measured.items() if m > 1}
  spread = {str(m): [benchmark_lib.costs_ms(c[1]), benchmark_lib.costs_ms(
      c[2])] for m, c in measured.items()}
  footprints = {str(m): frontier_lib.footprints_to_json(memory.footprints(
      trainer, tf.TensorSpec((x.shape[0] // m,) + x.shape[1:], tf.float32)))
                for m in microbatches}
  return {"module_costs_ms": benchmark_lib.costs_ms(measured[1][0]),
          "microbatch_costs_ms": micro, "costs_min_max_ms": spread,
          "repetitions": _REPETITIONS.value, "footprints_bytes": footprints,
          "staged_bytes": (_STEPS_PER_LOOP.value - 1) * (x.nbytes + y.nbytes),
          "load_average_1min": load,
          "plan": f"{num_modules} logical CPUs x 1 thread"}


def _parsed(inputs):
  """(costs, microbatch costs, footprints) of `inputs` (`measure_inputs`'
  JSON)."""
  costs = benchmark_lib.costs_from_ms(inputs["module_costs_ms"])
  micro = {int(m): benchmark_lib.costs_from_ms(c)
           for m, c in inputs["microbatch_costs_ms"].items()}
  footprints = {int(m): frontier_lib.footprints_from_json(f)
                for m, f in inputs["footprints_bytes"].items()}
  if not isinstance(inputs["staged_bytes"], (int, float)):
    raise TypeError(f"staged_bytes is {inputs['staged_bytes']!r}")
  return costs, micro, footprints


def predict(inputs, cells, error):
  """One K's result: every cell predicted from `inputs` (`measure_inputs`),
  the frontier, each interlocking cell against the pipelines."""
  costs, micro, footprints = _parsed(inputs)
  rows = {name: frontier_lib.predict_cell(name, costs, micro, footprints,
                                          inputs["staged_bytes"])
          for name in cells}
  return {"model": _PRESET.value, "num_modules": len(costs),
          "batch_size": _BATCH.value, "steps_per_loop": _STEPS_PER_LOOP.value,
          "prediction": "one device per module: K devices, one thread per "
                        "op, K cores, no contention (schedule model); "
                        "memory: step_model.memory.count, largest device",
          "cells": rows, "frontier": frontier_lib.frontier(rows),
          "vs_pipeline": frontier_lib.versus_pipeline(rows),
          "measured_error": error, "inputs": inputs}


def _error(report_path, inputs):
  """`frontier_lib.measured_error` of the --measured report from the
  inputs of its K, with the report's plan named."""
  report = user_files.read_json(report_path, "--measured",
                                {"strategies": dict})
  costs, micro, _ = _parsed(inputs)
  error = frontier_lib.measured_error(report, costs, micro)
  error["plan"] = (f"{report['num_modules']} simulated devices x 1 thread "
                   f"on {report['num_cores']} cores")
  error["report"] = report_path
  return error


def _shape_error(flag, path, e):
  """The line for stored inputs or a report of another shape (a cost that
  is text, a footprint missing)."""
  return (f"--{flag}: {path} does not hold what research.predict_frontier "
          f"needs ({type(e).__name__} {str(e)[:80]}); give a file it wrote "
          f"(or a research.benchmark report for --measured). Received: "
          f"{flag}={path!r}")


def outputs(prefix, ks):
  """Every file `main_run` writes: PREFIX_kK.json and .png per K."""
  return [f"{prefix}_k{k}.{kind}" for k in ks for kind in ("json", "png")]


def main_run(ks, microbatches):
  """Measures (or reuses) every K's inputs, predicts, writes and draws."""
  prefix = _OUT_PREFIX.value
  # Read before minutes of measuring: a bad --measured is named at once.
  report_k = user_files.read_json(_MEASURED.value, "--measured",
                                  {"num_modules": int})["num_modules"]
  inputs = {}
  for k in ks:
    path = f"{prefix}_k{k}.json"
    if _REUSE.value:
      inputs[k] = user_files.read_json(path, "--out_prefix",
                                       {"inputs": dict})["inputs"]
      try:  # stored inputs of another shape: named now, not as --measured
        _parsed(inputs[k])
      except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(_shape_error("out_prefix", path, e)) from None
    else:
      inputs[k] = benchmark_lib.run_child(
          ["--role=measure", f"--num_modules={k}",
           f"--microbatches={','.join(map(str, microbatches))}",
           f"--preset={_PRESET.value}", f"--batch_size={_BATCH.value}",
           f"--steps_per_loop={_STEPS_PER_LOOP.value}",
           f"--repeats={_REPEATS.value}",
           f"--repetitions={_REPETITIONS.value}"],
          module="research.predict_frontier")
  try:
    error = _error(_MEASURED.value, inputs[report_k]) if (
        report_k in inputs) else {
            "note": f"--measured is K = {report_k}, not predicted here"}
  except (KeyError, TypeError, AttributeError) as e:
    raise ValueError(_shape_error("measured", _MEASURED.value, e)) from None
  strategies = frontier_lib.STRATEGIES
  for k in ks:
    try:
      result = predict(inputs[k], frontier_lib.cell_names(
          strategies, microbatches), error)
    except (KeyError, TypeError, AttributeError) as e:
      raise ValueError(_shape_error("out_prefix", f"{prefix}_k{k}.json", e)
                       ) from None
    user_files.write_output(f"{prefix}_k{k}.json",
                            json.dumps(result, indent=1) + "\n",
                            "--out_prefix")
    user_files.write_output(f"{prefix}_k{k}.png", frontier_lib.plot(result),
                            "--out_prefix")
    print(f"K = {k}: frontier {', '.join(result['frontier'])} -> "
          f"{prefix}_k{k}.{{json,png}}")


@error_boundary.guard()
def main(argv):
  del argv  # flags only
  ks, microbatches = _ints(_NUM_MODULES), _ints(_MICROBATCHES)
  if any(_BATCH.value % m for m in microbatches):
    config_lib.fail("microbatches", ",".join(_MICROBATCHES.value),
                    f"each M must divide --batch_size={_BATCH.value}")
  if _ROLE.value == "measure":
    print(json.dumps(measure_inputs(ks[0], microbatches)))
    return
  if not _OUT_PREFIX.value:
    config_lib.fail("out_prefix", _OUT_PREFIX.value, "is needed")
  for path in outputs(_OUT_PREFIX.value, ks):  # before minutes of measuring
    user_files.check_output(path, "--out_prefix")
  main_run(ks, microbatches)


if __name__ == "__main__":
  app.run(main)
