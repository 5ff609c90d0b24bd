r"""How long the first training call takes, per strategy, against plain Keras.

A training call (`InterlockTrainer.train_loop`, what `InterlockModel.fit`
runs once per `steps_per_execution` batches) is one `tf.function` of
`steps_per_loop` unrolled steps. Its first call traces the Python into a
graph, lets the runtime optimise and place it, and then runs it; later
calls only run it. This tool measures, each cell in a fresh process (so
no cell profits from another's warm caches):

  trace_s   Python tracing alone (`get_concrete_function`), strategies only;
  first_s   the first call: trace + graph optimisation + one run;
  steady_s  the median of later calls (one run);
  over_s    first_s - steady_s: what the first call costs on top;
  trace_cpu_s, first_cpu_s: the same as this process's CPU seconds (less
            sensitive to a loaded host than wall time).

Plain Keras (`keras.Sequential` of the same layers, `compile(
steps_per_execution=steps_per_loop)`) runs under TF's default threading;
the strategies run on K simulated devices, as `research.benchmark` does.

Usage:
  python -m research.tracing_time --model=resnet --num_modules=2 \
      --strategies=e2e,local,2wise --steps_per_loop=1,8
"""

import json
import os
import re
import sys
import time

from train import runtime_env  # noqa: F401  (before TensorFlow)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from layers import resnet  # noqa: E402
from tf_interlock import placement as placement_lib  # noqa: E402
from tf_interlock import step_loop  # noqa: E402
from tf_interlock import strategy as strategy_lib  # noqa: E402
from tf_interlock.execution_options import ExecutionOptions  # noqa: E402
from research import benchmark_lib  # noqa: E402
from train import config as config_lib  # noqa: E402
from train import error_boundary  # noqa: E402
from train import user_files  # noqa: E402

_MODEL = flags.DEFINE_string(
    "model", "resnet", "Network: mlp (dense layers) or resnet (a preset).")
_PRESET = flags.DEFINE_string(
    "preset", "resnet20", "ResNet preset with --model=resnet, e.g. resnet20.")
_NUM_MODULES = flags.DEFINE_integer(
    "num_modules", 2, "K, the number of modules (>= 1; one simulated "
    "device each).")
_STRATEGIES = flags.DEFINE_list(
    "strategies", ["e2e", "local", "2wise"],
    "Strategies to time, comma-separated (e2e, local, 2wise, Nwise, "
    "e2e-mM for M microbatches); plain Keras is always timed too.")
_STEPS_PER_LOOP = flags.DEFINE_list(
    "steps_per_loop", ["1", "8"],
    "Steps per tf.function call to time, comma-separated ints >= 1.")
_BATCH = flags.DEFINE_integer(
    "batch_size", 32, "Global batch per step, in examples (>= 1), for "
    "every strategy and for plain Keras.")
_WIDTH = flags.DEFINE_integer(
    "width", 256, "model=mlp: units of every hidden Dense layer (>= 1).")
_CALLS = flags.DEFINE_integer(
    "calls", 3, "Timed calls after the first (>= 1), for the steady "
    "median.")
_CELL = flags.DEFINE_string(
    "cell", None, "Internal: time one strategy (or 'keras') in this process "
    "at --steps_per_loop (one value) and print its JSON.")
_GRAPPLER = flags.DEFINE_list(
    "grappler", [], "Graph optimiser options for every cell's process, as "
    "name=true|false pairs for tf.config.optimizer.set_experimental_options "
    "(e.g. disable_meta_optimizer=true, or constant_folding=false); empty: "
    "TF's defaults.")
_LOOPS = flags.DEFINE_list(
    "loops", ["unrolled"], "How each strategy's call runs its steps, "
    "comma-separated: unrolled (every step in the graph), while (one "
    "step traced, looped: tf_interlock.step_loop), whileU (blocks of "
    "U steps looped, e.g. while4: ExecutionOptions(loop_block=U)), "
    "pipelined (local only: module k on step t - k, one iteration looped: "
    "tf_interlock.pipelined_loop) and/or pipelinedU (U iterations a trip); "
    "each is one row.")
_JIT = flags.DEFINE_boolean(
    "jit_compile", False, "Compile with XLA: the strategies' "
    "jit_compile=True (each module's functions on simulated devices), and "
    "plain Keras's compile(jit_compile=True).")
_OPTIMIZATIONS = flags.DEFINE_list(
    "graph_optimizations", ["default"], "The strategies' graph optimisation "
    "of the training call, comma-separated: default (the process's) and/or "
    "light (tf_interlock.tf_private.light_graph_optimization); each is one "
    "row per loop.")
_LOOP = flags.DEFINE_string(
    "loop", "unrolled", "Internal: the loop of the --cell.")
_OPTIMIZATION = flags.DEFINE_string(
    "graph_optimization", "default", "Internal: the --cell's graph "
    "optimisation.")
_JSON_OUT = flags.DEFINE_string(
    "json_out", None, "Also write the report as JSON to this path.")

KERAS = "keras"


def validate():
  """Refuses bad flags with one line, before anything runs."""
  config_lib.check_choice("model", _MODEL.value, ("mlp", "resnet"))
  if _MODEL.value == "resnet":
    config_lib.check_choice("preset", _PRESET.value, tuple(resnet.PRESETS))
  for name, value in (("num_modules", _NUM_MODULES.value),
                      ("batch_size", _BATCH.value), ("width", _WIDTH.value),
                      ("calls", _CALLS.value)):
    config_lib.check_number(name, value, minimum=1, integer=True)
  for value in _STEPS_PER_LOOP.value:
    if not value.isdigit() or int(value) < 1:
      config_lib.fail("steps_per_loop", ",".join(_STEPS_PER_LOOP.value),
                      "must be comma-separated ints >= 1")
  for name in _STRATEGIES.value + ([_CELL.value] if _CELL.value else []):
    if name == KERAS:
      continue
    strategy, microbatches = benchmark_lib.parse_cell(name)
    try:
      strategy_lib.parse_strategy(strategy)
    except ValueError as e:
      config_lib.fail("strategies", name, str(e).split(" Received:")[0])
    if _BATCH.value % microbatches:
      config_lib.fail("strategies", name, f"{microbatches} microbatches "
                      f"must divide --batch_size={_BATCH.value}")
  for loop in _LOOPS.value + [_LOOP.value]:
    if loop_options(loop) is None:
      config_lib.fail("loops", ",".join(_LOOPS.value),
                      "must be comma-separated values of auto, unrolled, "
                      "while, or whileU for an int U >= 1")
  for value in _OPTIMIZATIONS.value + [_OPTIMIZATION.value]:
    if value not in ("default", "light"):
      config_lib.fail("graph_optimizations", ",".join(_OPTIMIZATIONS.value),
                      "must be comma-separated values of default, light")
  grappler_options()


def loop_options(value):
  """{"loop": ..., "loop_block": U} of a --loops value, or None when bad:
  "whileU" is a while loop over blocks of U steps, "pipelinedU" a
  pipeline looping U iterations a trip."""
  if value in ("auto",) + step_loop.LOOPS:
    return {"loop": value, "loop_block": 1}
  found = re.fullmatch(r"(while|pipelined)([1-9][0-9]*)", value)
  return found and {"loop": found.group(1),
                    "loop_block": int(found.group(2))}


def grappler_options():
  """--grappler as {option: bool}; refuses a malformed pair in one line."""
  options = {}
  for pair in _GRAPPLER.value:
    name, _, value = pair.partition("=")
    if not name or value not in ("true", "false"):
      config_lib.fail("grappler", ",".join(_GRAPPLER.value),
                      "must be comma-separated name=true|false pairs")
    options[name] = value == "true"
  return options


def spec(steps_per_loop):
  return benchmark_lib.make_spec(
      _MODEL.value, _NUM_MODULES.value, preset=_PRESET.value,
      width=_WIDTH.value, batch_size=_BATCH.value, steps=_CALLS.value,
      steps_per_loop=steps_per_loop)


def _timed(fn):
  """(wall seconds, this process's CPU seconds) of `fn()`. Tracing is
  single-threaded Python, so its CPU seconds barely depend on what else
  the host runs, unlike its wall time."""
  wall, cpu = time.perf_counter(), time.process_time()
  fn()
  return time.perf_counter() - wall, time.process_time() - cpu


def _first_and_steady(call, calls):
  """((wall, CPU) seconds of the first call, median wall seconds of
  `calls` later calls)."""
  first = _timed(call)
  return first, float(np.median([_timed(call)[0] for _ in range(calls)]))


def time_strategy(s, name):
  """One strategy on K simulated devices: trace, first and steady seconds."""
  num_modules = s.config.interlock.num_modules
  placement_lib.configure_simulated_devices(num_modules)
  placement = placement_lib.make_placement("simulated", num_modules)
  options = ExecutionOptions(**loop_options(_LOOP.value),
                             graph_optimization=_OPTIMIZATION.value)
  trainer = benchmark_lib.build_trainer(s, name, placement,
                                        jit_compile=_JIT.value,
                                        options=options)
  dataset = tf.data.Dataset.from_tensors(benchmark_lib.make_batch(s))
  iterator = iter(trainer.distribute_dataset(dataset.repeat()))
  loop = trainer.loop_function(s.config.run.steps_per_loop)
  trace, trace_cpu = _timed(lambda: loop.get_concrete_function(iterator))
  # The concrete function is cached: the first call now optimises and runs
  # it; first_s adds the tracing back so that it means the same as Keras's.
  (first, first_cpu), steady = _first_and_steady(
      lambda: trainer.train_loop(iterator),
                                    s.steps)
  return {"trace_s": trace, "trace_cpu_s": trace_cpu,
          "first_s": trace + first, "first_cpu_s": trace_cpu + first_cpu,
          "steady_s": steady}


def time_keras(s):
  """Plain Keras, default threading: first and steady train_function call."""
  modules = benchmark_lib.build_modules(s, aux_heads=False)
  model = keras.Sequential([m.body for m in modules])
  model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                steps_per_execution=s.config.run.steps_per_loop,
                jit_compile=_JIT.value)
  x, _ = benchmark_lib.make_batch(s)
  model.build((None,) + x.shape[1:])
  model.optimizer.build(model.trainable_variables)
  model.make_train_function()
  iterator = iter(tf.data.Dataset.from_tensors(
      benchmark_lib.make_batch(s)).repeat())
  (first, first_cpu), steady = _first_and_steady(
      lambda: model.train_function(iterator),
                                    s.steps)
  return {"trace_s": None, "trace_cpu_s": None, "first_s": first,
          "first_cpu_s": first_cpu, "steady_s": steady}


def run_cell(name, steps_per_loop):
  options = grappler_options()
  if options:
    tf.config.optimizer.set_experimental_options(options)
  s = spec(steps_per_loop)
  row = time_keras(s) if name == KERAS else time_strategy(s, name)
  row.update(strategy=name, steps_per_loop=steps_per_loop,
             loop=None if name == KERAS else _LOOP.value,
             graph_optimization=(None if name == KERAS
                                 else _OPTIMIZATION.value),
             over_s=row["first_s"] - row["steady_s"])
  return row


def _child(name, steps_per_loop, loop="unrolled", optimization="default"):
  """`run_cell` in a fresh process: its row."""
  names = ("model", "preset", "num_modules", "batch_size", "width", "calls",
           "jit_compile")
  args = [f"--{n}={flags.FLAGS[n].value}" for n in names]
  args.append(f"--grappler={','.join(_GRAPPLER.value)}")
  return benchmark_lib.run_child(
      [*args, f"--cell={name}", f"--steps_per_loop={steps_per_loop}",
       f"--loop={loop}", f"--graph_optimization={optimization}"],
      module="research.tracing_time")


def report():
  """Every (strategy, steps_per_loop) cell, plain Keras first."""
  rows = []
  for steps_per_loop in (int(v) for v in _STEPS_PER_LOOP.value):
    rows.append(_child(KERAS, steps_per_loop))
    for name in _STRATEGIES.value:
      for loop in _LOOPS.value:
        for optimization in _OPTIMIZATIONS.value:
          rows.append(_child(name, steps_per_loop, loop, optimization))
  return {"model": _MODEL.value, "preset": _PRESET.value,
          "jit_compile": _JIT.value,
          "num_modules": _NUM_MODULES.value, "batch_size": _BATCH.value,
          "grappler": grappler_options(),
          "load_average": list(os.getloadavg()), "rows": rows}


def format_table(result):
  """The report as a fixed-width table, seconds per call."""
  lines = [f"model={result['model']} K={result['num_modules']} "
           f"batch={result['batch_size']} grappler="
           f"{result.get('grappler') or 'default'} load average="
           f"{'/'.join(f'{v:.1f}' for v in result['load_average'])} "
           f"jit_compile={result.get('jit_compile', False)}",
           f"{'strategy':10} {'loop':8} {'graph':7} {'steps':>5} "
           f"{'trace_s':>8} {'first_s':>8} "
           f"{'steady_s':>8} {'over_s':>8} {'trace_cpu':>9} "
           f"{'first_cpu':>9}"]
  dash = lambda v: "-" if v is None else f"{v:.2f}"  # noqa
  for row in result["rows"]:
    lines.append(f"{row['strategy']:10} {row.get('loop') or '-':8} "
                 f"{row.get('graph_optimization') or '-':7} "
                 f"{row['steps_per_loop']:>5} "
                 f"{dash(row['trace_s']):>8} {row['first_s']:8.2f} "
                 f"{row['steady_s']:8.3f} {row['over_s']:8.2f} "
                 f"{dash(row['trace_cpu_s']):>9} "
                 f"{row['first_cpu_s']:9.2f}")
  return "\n".join(lines)


@error_boundary.guard()
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    validate()
    if _JSON_OUT.value and not _CELL.value:  # before minutes of timing
      user_files.check_output(_JSON_OUT.value, "--json_out")
    if _CELL.value:
      if len(_STEPS_PER_LOOP.value) != 1:
        config_lib.fail("steps_per_loop", ",".join(_STEPS_PER_LOOP.value),
                        "must be one value with --cell")
      print(json.dumps(run_cell(_CELL.value, int(_STEPS_PER_LOOP.value[0]))))
      return
    result = report()
  except (ValueError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(format_table(result))
  if _JSON_OUT.value:
    user_files.write_output(_JSON_OUT.value,
                            json.dumps(result, indent=1) + "\n", "--json_out")


if __name__ == "__main__":
  app.run(main)
