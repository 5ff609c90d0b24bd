"""One run, or the op costs, of a user-model study (`research.user_study`).

  python -m research.user_study_cell --cell='{"mode": "run", ...}'

`research.user_study` starts this module in a process of its own per
(strategy, seed) and once for the op costs, so that each sets up the
placement's devices and thread pools before TensorFlow starts (see
`research.user_study` for why). --cell is JSON: the study's settings,
"mode" ("run" or "costs"), "strategy", "seed" and "out", the JSON file the
result goes to.

A run trains with `InterlockModel.fit`, one Keras epoch per
`eval_every_steps` steps, and evaluates on the whole evaluation data at
each epoch's end (fit's validation). Its clocks are those of the preset
studies (`research.study_clock.account_time`): each call of the train
function is a loop; the first one's tracing is compile_s, evaluations are
eval_s, and the training clock is the rest.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import dataclasses
import json
import math
import os
import sys
import time

from absl import app
from absl import flags
import keras
import tensorflow as tf

import tf_interlock as ti
from tf_interlock import metric_names
from step_model import profiling
from train import placement_runtime
from train import run_dir as run_dir_lib
from train import run_lock
from research import legacy_heads
from research import study_clock
from research import study_store
from research import user_study

_CELL = flags.DEFINE_string("cell", None, "The run's settings as JSON "
                            "(written by research.user_study).")
# Epochs for a time budget: more than any budget reaches.
_UNBOUNDED = 10**9


class Clock(keras.callbacks.Callback):
  """Each call of the train function (a loop) and each evaluation's end,
  with the evaluation logs, as `study_clock.account_time` takes them."""

  def __init__(self, lock):
    super().__init__()
    self.loops, self.eval_walls, self.evals = [], {}, {}
    self.step = 0
    self.lock = lock  # the run's, renewed at each evaluation

  def on_train_batch_begin(self, batch, logs=None):
    self._start, self._first = time.perf_counter(), batch

  def on_train_batch_end(self, batch, logs=None):
    seconds = time.perf_counter() - self._start
    steps = batch - self._first + 1
    self.step += steps
    self.loops.append((self.step, time.time(), seconds / steps))

  def on_epoch_end(self, epoch, logs=None):
    # fit's validation ran just before: this is the evaluation's end.
    self.eval_walls[self.step] = time.time()
    self.evals[self.step] = {k[len("val_"):]: float(v)
                             for k, v in (logs or {}).items()
                             if k.startswith("val_")}
    self.lock.refresh()


def _batched(data, batch_size, seed, train):
  """A dataset of (features, labels) batches from a dataset or (x, y)."""
  if not isinstance(data, tf.data.Dataset):
    if not isinstance(data, (tuple, list)) or len(data) != 2:
      raise ValueError(f"data must return datasets or (x, y) tuples. "
                       f"Received: {type(data).__name__}")
    data = tf.data.Dataset.from_tensor_slices(tuple(data))
    if train:
      data = data.shuffle(len(data), seed=seed)
    data = data.batch(batch_size, drop_remainder=train)
  return data.repeat() if train else data


def heads_of(logs, metric, num_modules):
  """{"module_k": {name: value}} of evaluation logs; perplexity = exp(the
  head's loss)."""
  heads = {}
  for key, value in logs.items():
    try:
      index, name = metric_names.parse_metric_name(key)
    except ValueError:
      continue  # "loss" (the network's, also module_K's), ...
    heads.setdefault(metric_names.module_name(index), {})[name] = value
  if metric == "perplexity":
    for values in heads.values():
      values["perplexity"] = math.exp(min(values["loss"], 700.0))
  return legacy_heads.canonical_heads(heads, num_modules)


def build(spec):
  """The compiled `InterlockModel` and the (train, evaluation) data."""
  search = spec["search_path"]
  model_fn = user_study.resolve(spec["model_fn"], "model_fn", search)
  data_fn = user_study.resolve(spec["data"], "data", search)
  seed, k = spec["seed"], spec["num_modules"]
  keras.utils.set_random_seed(seed)
  source = user_study.call_with_seed(model_fn, seed)
  if not isinstance(source, keras.Model):
    raise ValueError(f"model_fn must return a keras.Model. Received: "
                     f"{type(source).__name__}")
  modules = ti.from_keras(source, k, split=spec["split"],
                          balance=spec["balance"], aux_head=spec["aux_head"])
  model = ti.InterlockModel(modules, spec["strategy"],
                            placement=spec["placement"])
  optimizer = spec["optimizer"]
  model.compile(optimizer=(optimizer if isinstance(optimizer, str) else
                           keras.optimizers.deserialize(optimizer)),
                loss=spec["loss"],
                metrics=(["accuracy"] if spec["metric"] == "accuracy"
                         else None),
                steps_per_execution=spec["steps_per_execution"])
  train, evaluation = user_study.call_with_seed(data_fn, seed)
  return (model, _batched(train, spec["batch_size"], seed, True),
          _batched(evaluation, spec["batch_size"], seed, False))


def run(spec, model, train, evaluation, lock):
  """Trains and evaluates one (strategy, seed); its result."""
  every = spec["eval_every_steps"]
  clock = Clock(lock)
  callbacks = [clock]
  budget = spec["time_budget_s"]
  if budget is not None:
    callbacks.append(ti.callbacks.TimeBudget(budget, count="batches"))
  model.fit(train, epochs=(_UNBOUNDED if budget is not None else
                           spec["train_steps"] // every),
            steps_per_epoch=every, validation_data=evaluation,
            callbacks=callbacks, verbose=2)
  timing = study_clock.account_time(clock.loops, clock.eval_walls)
  k, metric = spec["num_modules"], spec["metric"]
  heads = {step: heads_of(logs, metric, k)
           for step, logs in clock.evals.items()}
  network = metric_names.network_head(heads[clock.step])
  clock_s, each = timing.pop("clock"), timing.pop("eval_s_each")
  return {
      "steps": clock.step, **timing, "eval": heads[clock.step],
      "stopped_by_budget": bool(budget is not None and
                                callbacks[-1].stopped),
      "curve": [{"step": step, "seconds": clock_s[step],
                 "value": heads[step][network][metric],
                 "eval_s": each[step]} for step in sorted(heads)]}


def costs(spec, model, train):
  """The per-module op costs (`profiling.measure_module_costs`) and their
  one core per module projection."""
  features, labels = next(iter(train))
  # One step builds the modules and the optimizers as fit does.
  model.fit(train.take(1), epochs=1, steps_per_epoch=1, verbose=0)
  measured = profiling.measure_module_costs(model.trainer, features, labels,
                                            spec["repeats"])
  others = [s for s in spec["strategies"] if s != "e2e"]
  return {
      "costs": [dataclasses.asdict(c) for c in measured],
      "has_aux": [bool(m.has_aux_head) for m in model.trainer.modules],
      "num_microbatches": 1, "num_modules": spec["num_modules"],
      "placement": spec["placement"], "batch_size": int(labels.shape[0]),
      "projection_one_core_per_module":
          profiling.project_one_core_per_module(measured, others),
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  spec = json.loads(_CELL.value)
  os.environ[user_study.IN_CELL] = spec["mode"]
  # Before the first tensor: the devices and thread pools of the placement.
  placement_runtime.of(spec["placement"]).configure_devices(
      spec["num_modules"], intra_op_threads=spec["threads_per_device"])
  try:
    model, train, evaluation = build(spec)
    if spec["mode"] == "costs":
      result = costs(spec, model, train)
    else:
      with run_lock.held(spec["model_dir"], run_dir_lib.LOCK) as lock:
        result = run(spec, model, train, evaluation, lock)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  study_store.write_json(spec["out"], result)


if __name__ == "__main__":
  app.run(main)
