"""What research.real_models measures, as functions of values (no flags).

Three models users bring, with random weights and random data: keras_hub's
GPT-2 causal LM and BERT text classifier, and keras.applications'
MobileNetV2 nested as a transfer-learning base (base, pooling, a Dense
head). Each is trained either by plain Keras `fit` (the user's alternative)
or, split by `from_keras` into K modules, by `InterlockModel.fit` with one
strategy on one layout of simulated devices. One cell (a model and plain
Keras, or a model, a layout and a strategy) runs in one fresh process: TF's
thread pools and logical devices are fixed when its runtime starts, and no
cell may profit from another's traced functions or warm caches.
"""

import dataclasses
import re
import time

import keras
import numpy as np
import tensorflow as tf

import tf_interlock as ti
from tf_interlock import strategy as strategy_lib
from step_model import threading_plan
from research import benchmark_lib
from train import placement_runtime

MODELS = ("gpt2", "bert", "mobilenet_v2")
# The cell name of plain Keras `fit` (default threading, every core).
KERAS = "keras"
# A layout "kN": K = N modules on N simulated devices, 1 intra-op thread
# each ("k2": the fair layout for 2 cores). "kNhost": K = N modules on the
# host's one default device with TF's default threading, what
# `InterlockModel` gives without a placement (the fair layout for e2e,
# whose modules run one after another).
_LAYOUT = re.compile(r"^k([1-9][0-9]*)(host)?$")


@dataclasses.dataclass(frozen=True)
class Sizes:
  """The three models' shapes and the batch, the same in every cell.

  Attributes:
    num_layers, hidden_dim, num_heads, seq_len, vocab_size: GPT-2's and
      BERT's backbone (intermediate dim 4 x hidden_dim; the backbones'
      default dropout, 0.1).
    image_size: MobileNetV2's square input (3 channels).
    num_classes: BERT's and MobileNetV2's classes.
    batch_size: examples (sequences, images) per step.
  """
  num_layers: int = 4
  hidden_dim: int = 256
  num_heads: int = 4
  seq_len: int = 128
  vocab_size: int = 5000
  image_size: int = 96
  num_classes: int = 10
  batch_size: int = 8


def layout_modules(layout):
  """K of a layout name ("k2" -> 2, "k2host" -> 2), or None when it is not
  one."""
  found = _LAYOUT.match(layout)
  return found and int(found.group(1))


def is_host_layout(layout):
  """Whether `layout` ("kNhost") keeps every module on the default device."""
  return layout.endswith("host")


def set_up_layout(layout):
  """Splits this process's CPU for `layout`, before the TF runtime starts,
  as the binaries set up a simulated placement (`train.runtime_setup`):
  K logical CPU devices of one intra-op thread each, one module each.

  Returns:
    (the `ThreadingPlan`, the placement to give `InterlockModel`).
  """
  k = layout_modules(layout)
  plan = threading_plan.make_plan(k, k, 1,
                                  num_cores=threading_plan.host_cores())
  threading_plan.use_own_pools(plan)  # a pool per device (none at t = 1)
  placement_runtime.of("simulated").configure_devices(
      plan.num_devices, intra_op_threads=plan.threads_per_device)
  return plan, benchmark_lib.simulated_placement(plan)


def build_model(name, sizes, seed=0):
  """The user's unsplit Keras model `name` (of MODELS), random weights."""
  keras.utils.set_random_seed(seed)
  if name == "mobilenet_v2":
    shape = (sizes.image_size, sizes.image_size, 3)
    base = keras.applications.MobileNetV2(weights=None, include_top=False,
                                          input_shape=shape)
    inputs = keras.Input(shape)
    h = keras.layers.GlobalAveragePooling2D()(base(inputs))
    return keras.Model(inputs, keras.layers.Dense(sizes.num_classes)(h))
  # Imported here: seconds of imports only a cell that builds one pays
  # (the refusal sweeps import every binary).
  import keras_hub  # pylint: disable=g-import-not-at-top
  shape = dict(vocabulary_size=sizes.vocab_size, num_layers=sizes.num_layers,
               num_heads=sizes.num_heads, hidden_dim=sizes.hidden_dim,
               intermediate_dim=4 * sizes.hidden_dim,
               max_sequence_length=sizes.seq_len)
  if name == "gpt2":
    return keras_hub.models.GPT2CausalLM(
        backbone=keras_hub.models.GPT2Backbone(**shape), preprocessor=None)
  return keras_hub.models.BertTextClassifier(
      keras_hub.models.BertBackbone(**shape), num_classes=sizes.num_classes,
      preprocessor=None)


def make_dataset(name, sizes, num_batches, autotune=False):
  """`num_batches` distinct random batches of model `name`'s inputs and
  labels, repeated; tf.data autotuning off unless `autotune` (both fits
  read the same pipeline: with it on, Keras's iterator teardown waits
  for the autotuner, docs/results/fit_speed/README.md)."""
  rng = np.random.default_rng(0)
  num = num_batches * sizes.batch_size
  if name == "mobilenet_v2":
    x = rng.normal(size=(num, sizes.image_size, sizes.image_size, 3))
    x = x.astype("float32")
  else:  # random token ids, no padding
    ids = rng.integers(1, sizes.vocab_size, size=(num, sizes.seq_len + 1))
    x = {"token_ids": ids[:, :-1].astype("int32"),
         "padding_mask": np.ones((num, sizes.seq_len), "int32")}
    if name == "bert":  # one segment
      x["segment_ids"] = np.zeros((num, sizes.seq_len), "int32")
  # GPT-2: the next token at every position; else one class per example.
  y = (ids[:, 1:].astype("int32") if name == "gpt2" else
       rng.integers(0, sizes.num_classes, size=num).astype("int32"))
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
      sizes.batch_size, drop_remainder=True).repeat()
  options = tf.data.Options()
  options.autotune.enabled = autotune
  return dataset.with_options(options)


def _loss():
  # Every task's own default, named so plain Keras and every module agree.
  return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def compile_model(model, cell, steps_per_execution, learning_rate=1e-3,
                  execution=None):
  """Compiles `model` (the user's model, or an InterlockModel for a
  strategy cell) alike: Adam, the tasks' loss, no metrics, the same
  `steps_per_execution`, jit_compile left to each ("auto": off on CPU);
  a strategy cell also gets `execution` (`ti.ExecutionOptions`; None: the
  defaults)."""
  # keras_hub's tasks add an accuracy metric by default ("auto", for the
  # split task too): none here, for plain Keras and every strategy.
  extra = {} if cell == KERAS or execution is None else {
      "execution_options": execution}
  model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=_loss(),
                metrics=None, weighted_metrics=None,
                steps_per_execution=steps_per_execution, **extra)


def interlock_model(model, cell, placement, num_modules, e2e_aux_heads=False):
  """`model` split into K modules, as an `InterlockModel` of strategy cell
  `cell` (`benchmark_lib.parse_cell`: "2wise", "e2e-m4", ...).

  e2e trains without aux heads unless `e2e_aux_heads`: its heads would be
  probes, work that plain Keras does not do; local and n-wise need them
  (`from_keras`'s default, "linear")."""
  strategy, microbatches = benchmark_lib.parse_cell(cell)
  end_to_end = strategy_lib.parse_strategy(strategy).window is None
  modules = ti.from_keras(model, num_modules, aux_head=(
      None if end_to_end and not e2e_aux_heads else "linear"))
  return ti.InterlockModel(modules, strategy, placement=placement,
                           num_microbatches=microbatches,
                           **benchmark_lib.cell_options(cell))


def _timed(fn):
  """(wall seconds, this process's CPU seconds) of `fn()`."""
  wall, cpu = time.perf_counter(), time.process_time()
  fn()
  return time.perf_counter() - wall, time.process_time() - cpu


def measure_fit(model, dataset, steps, calls):
  """Times `fit` calls of `steps` steps each on `dataset`.

  first_call_s: the first call, which builds the optimizer, traces the
  train function and runs it (its CPU seconds too: tracing is one Python
  thread, less sensitive to a loaded host). step_s: the steady state, the
  median over `calls` calls after `benchmark_lib.WARMUP_CALLS` more, per
  step (its min and max beside it).
  """
  fit = lambda: model.fit(dataset, steps_per_epoch=steps, shuffle=False,  # noqa
                          verbose=0)
  first, first_cpu = _timed(fit)
  stats = benchmark_lib.time_call_stats(fit, calls)
  step = stats["median"] / steps
  return {"first_call_s": first, "first_call_cpu_s": first_cpu,
          "step_s": step, "step_min_s": stats["min"] / steps,
          "step_max_s": stats["max"] / steps, "steps_per_s": 1 / step}


def run_cell(name, cell, layout, sizes, *, steps, steps_per_execution,
             calls, autotune=False, e2e_aux_heads=False, execution=None):
  """One cell in this process: model `name` trained by plain Keras
  (`cell` == KERAS, default threading) or by strategy `cell` on `layout`
  (set up first, before any TF op). Its report row."""
  plan = placement = None
  num_modules = None if cell == KERAS else layout_modules(layout)
  if cell != KERAS and not is_host_layout(layout):
    plan, placement = set_up_layout(layout)
  start = time.perf_counter()
  model = build_model(name, sizes)
  params = model.count_params()
  if cell != KERAS:
    model = interlock_model(model, cell, placement, num_modules,
                            e2e_aux_heads)
  compile_model(model, cell, steps_per_execution, execution=execution)
  setup = time.perf_counter() - start  # build, split, compile: no step
  row = measure_fit(model, make_dataset(name, sizes, steps, autotune), steps,
                    calls)
  return dict(row, model=name, strategy=cell,
              layout=None if cell == KERAS else layout,
              num_modules=num_modules,
              plan=("default threading" if plan is None
                    else plan.describe()),
              setup_s=setup, params=params,
              thread_pools=benchmark_lib.threading_state())


# Issue 45's goals against plain Keras on the same model.
E2E_SPEED = 0.95  # e2e steps/s, at least, on every model and layout
K2_SPEED = 1.0  # local and 2wise steps/s at K = 2, at least
FIRST_CALL = 2.0  # every strategy's first fit call, at most
GOALS_TEXT = (f"Goals (issue 45): e2e >= {E2E_SPEED:g}x plain Keras steps/s "
              f"on each model; local and 2wise at K = 2 >= {K2_SPEED:g}x; "
              f"first call <= {FIRST_CALL:g}x plain Keras's.")


def goals_of(row):
  """{goal: met} of a strategy row with its ratios against plain Keras:
  the speed goal of its strategy (e2e; local or 2wise at K = 2), if any,
  and the first-call goal."""
  strategy, microbatches = benchmark_lib.parse_cell(row["strategy"])
  window = strategy_lib.parse_strategy(strategy).window
  speed = row["steps_per_s_vs_keras"]
  found = {}
  if microbatches == 1 and window is None:
    found[f"steps_per_s_vs_keras >= {E2E_SPEED:g}"] = speed >= E2E_SPEED
  elif microbatches == 1 and window in (1, 2) and row["num_modules"] == 2:
    found[f"steps_per_s_vs_keras >= {K2_SPEED:g}"] = speed >= K2_SPEED
  found[f"first_call_vs_keras <= {FIRST_CALL:g}"] = (
      row["first_call_vs_keras"] <= FIRST_CALL)
  return found


def add_ratios(rows):
  """Gives each strategy row its ratios against its model's plain Keras
  row (steps/s: > 1 is faster; first call: < 1 is sooner) and its goals."""
  plain = {r["model"]: r for r in rows
           if r["strategy"] == KERAS and "error" not in r}
  for row in rows:
    base = plain.get(row["model"])
    if row["strategy"] == KERAS or base is None or "error" in row:
      continue
    row["steps_per_s_vs_keras"] = row["steps_per_s"] / base["steps_per_s"]
    row["first_call_vs_keras"] = row["first_call_s"] / base["first_call_s"]
    row["goals"] = goals_of(row)


def _goal_text(row):
  if "goals" not in row:
    return "-"
  missed = [goal.split()[0].split("_vs_")[0] for goal, met in
            row["goals"].items() if not met]
  return "met" if not missed else "MISSED " + ", ".join(missed)


def format_table(report):
  """The human-readable report of `research.real_models`."""
  ratio = lambda row, key: (f"{row[key]:.2f}x" if key in row  # noqa
                            else "-")
  lines = [f"{'model':12s} {'layout':6s} {'strategy':9s} {'plan':22s} "
           f"{'steps/s':>8s} {'vs Keras':>8s} {'first s':>8s} "
           f"{'vs Keras':>8s} {'setup s':>8s}  goals"]
  for row in report["cells"]:
    head = (f"{row['model']:12s} {row.get('layout') or '-':6s} "
            f"{row['strategy']:9s} ")
    if "error" in row:
      lines.append(f"{head}failed: {row['error']}")
      continue
    lines.append(
        f"{head}{row['plan']:22s} {row['steps_per_s']:8.2f} "
        f"{ratio(row, 'steps_per_s_vs_keras'):>8s} "
        f"{row['first_call_s']:8.1f} {ratio(row, 'first_call_vs_keras'):>8s} "
        f"{row['setup_s']:8.1f}  {_goal_text(row)}")
  lines += [
      "", GOALS_TEXT,
      f"steps/s: fit calls of {report['steps']} steps "
      f"(steps_per_execution={report['steps_per_execution']}, batch "
      f"{report['sizes']['batch_size']}), median of {report['calls']} calls "
      f"after the first and {benchmark_lib.WARMUP_CALLS} warm-ups. first s: "
      f"the first fit call (builds, traces, runs). setup s: build, split, "
      f"compile. Plain Keras: its own process, every core; a layout kN: "
      f"N simulated devices x 1 thread; kNhost: N modules on the one "
      f"default device, default threading. One process per cell."]
  return "\n".join(lines)
