"""The pieces `InterlockModel` plugs into Keras's compile/fit/evaluate.

* The optimizers, the per-example loss and metrics are the trainer's own
  (`trainer.optimizer_factory`, `losses.per_example_loss`,
  `keras_metrics.per_example_metrics`): each module's
  loss L_k is averaged over the *global* batch by the engine
  (`tf.nn.compute_average_loss`), so a Keras loss's own reduction is
  bypassed.
* `training_dataset` turns `fit`'s x/y into fixed-size batches (every
  interlocking step needs a static batch) and works out the steps per epoch.
* `FitLogs.train_function` is the function `fit` calls once per
  `steps_per_execution` batches: it runs `InterlockTrainer.train_loop` and
  adds its means to Keras `Mean` trackers, which Keras resets every epoch
  and shows in the progress bar and History.
* `eval_trackers`/`update_eval_trackers`: evaluation of every exit, whose
  values `evaluation.exit_values` gives.
"""

import math
import warnings

import keras
import numpy as np
import tensorflow as tf

from tf_interlock import exits as exits_lib
from tf_interlock.keras import input_nest
from tf_interlock import int_args
from tf_interlock import metric_names
from tf_interlock.keras import metrics as keras_metrics
from tf_interlock.keras import sample_weights


def compile_config(optimizer, loss, metrics, weighted_metrics,
                   steps_per_execution):
  """`compile`'s arguments as a saveable config, or None.

  A plain Python callable (an optimizer factory, a per-example loss or
  metric function) cannot be saved safely: a model compiled with one is
  saved uncompiled, and must be compiled again after loading. "auto" is
  saved as "auto": after loading it means the task's defaults again,
  which the last module saves (`task_defaults`).
  """
  def saveable(value, kinds):
    return value is None or isinstance(value, (str,) + kinds)
  optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [
      optimizer]
  metric_list = (keras_metrics.as_list(metrics) +
                 keras_metrics.as_list(weighted_metrics))
  if not (all(saveable(o, (keras.optimizers.Optimizer,)) for o in optimizers)
          and saveable(loss, (keras.losses.Loss,))
          and all(saveable(m, (keras.metrics.Metric,)) for m in metric_list)):
    return None
  return dict(optimizer=optimizer, loss=loss, metrics=metrics,
              weighted_metrics=weighted_metrics,
              steps_per_execution=steps_per_execution)


def check_exit(modules, exit_k):
  """None for the network's output, or k < K whose module has an aux head."""
  num = len(modules)
  if exit_k is None:
    return None
  if int_args.is_int(exit_k) and exit_k == num:
    return None
  if (not int_args.is_int(exit_k) or
      not 1 <= exit_k < num or not modules[exit_k - 1].has_aux_head):
    allowed = [k for k in range(1, num) if modules[k - 1].has_aux_head]
    raise ValueError(f"exit must be None, {num} (the network) or a module "
                     f"with an aux head, one of {allowed}. Received: "
                     f"exit={exit_k!r}")
  return int(exit_k)


def _check_batches(dataset, input_shape):
  """Raises unless `dataset` yields fixed-size batches of examples.

  Args:
    dataset: (features, labels) or (features, labels, sample_weight).
    input_shape: the built model's input shape (batch axis first), or None.
  """
  spec = dataset.element_spec
  if not isinstance(spec, tuple) or len(spec) not in (2, 3):
    raise ValueError(f"fit needs a dataset of (features, labels) pairs or "
                     f"(features, labels, sample_weight) triples. "
                     f"Received: element_spec={spec!r}")
  features = tf.nest.flatten(spec[0])[0].shape
  labels = tf.nest.flatten(spec[1])[0].shape
  # A batch of inputs is at least (batch, feature) and a batch of labels
  # has a batch axis, which the two share: a scalar label, features of rank
  # < 2 (one LM sequence of tokens) or static leading sizes that differ
  # (one image (H, W, C) against its one-hot label (classes,)) are one
  # example. A built model also knows the rank of a batch of inputs.
  leading = (features[0] if features.rank else None,
             labels[0] if labels.rank else None)
  if (labels.rank == 0 or features.rank < 2 or
      (None not in leading and leading[0] != leading[1]) or
      (input_shape is not None and features.rank == len(input_shape) - 1)):
    raise ValueError(
        f"fit needs a batched dataset; batch the dataset: "
        f".batch(N, drop_remainder=True). Received: unbatched features "
        f"shape={features}, labels shape={labels}")
  batch = features[:1]
  if batch[0] is None:
    raise ValueError(
        "fit needs batches of one fixed size: every interlocking step is "
        "traced for a static batch. Batch with drop_remainder=True. "
        f"Received: features batch shape={batch}")


def without_autotune(dataset):
  """`dataset` with tf.data's autotuning off, unless its options set it.

  Why: an autotuned pipeline (every one, by default: tf.data injects an
  autotuned prefetch) runs a model thread that re-optimises the pipeline
  after 10, 20, 40, ... ms, doubling each time. Destroying the iterator,
  which Keras does at the end of every `fit` call (and of every epoch of a
  finite dataset), waited for that thread's current wait to end: a `fit`
  call then lasted until the next 10 ms * 2^n after its iterator began
  (5.12 s for the benchmark's 80 steps, whatever the strategy). The
  elements, and their order, do not change.
  """
  if dataset.options().autotune.enabled is not None:
    return dataset
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)


def _labels_with_weights(x, y, w):
  """(features, labels, weights) -> (features, (labels, weights))."""
  return x, (y, w)


def training_dataset(x, y, batch_size, shuffle, steps_per_epoch,
                     validation_split, validation_data, sample_weight=None,
                     input_shape=None, autotune=False):
  """Fixed-size training batches and the number of steps per epoch.

  Sample weights travel with the labels, as `(labels, sample_weight)`,
  which `sample_weights.weighted` losses understand.

  Without `autotune` (`ExecutionOptions.data_autotune`), the dataset's
  tf.data autotuning is turned off (`without_autotune`) unless its options
  set it.

  Returns:
    (dataset, steps, keras_steps, validation_data): `steps` batches make an
    epoch; `keras_steps` is the `steps_per_epoch` to give Keras (None: a
    fresh pass over a finite dataset each epoch).
  """
  if isinstance(x, tf.data.Dataset):
    if y is not None or validation_split or sample_weight is not None:
      raise ValueError("With a dataset x, pass neither y, sample_weight nor "
                       "validation_split (a dataset yields (features, "
                       "labels[, sample_weight])). Received: y, "
                       "sample_weight or validation_split")
    _check_batches(x, input_shape)
    x = x if autotune else without_autotune(x)
    if len(x.element_spec) == 3:
      x = x.map(_labels_with_weights)
    size = int(x.cardinality())
    if size in (tf.data.INFINITE_CARDINALITY, tf.data.UNKNOWN_CARDINALITY):
      if steps_per_epoch is None:
        raise ValueError(
            "An infinite dataset, or one of unknown length, needs "
            "steps_per_epoch. Received: steps_per_epoch=None")
      return x, steps_per_epoch, steps_per_epoch, validation_data
    if steps_per_epoch not in (None, size):
      raise ValueError(
          f"The dataset has {size} batches: steps_per_epoch must be None or "
          f"{size} (repeat() the dataset for other epoch lengths). "
          f"Received: steps_per_epoch={steps_per_epoch}")
    return x, size, None, validation_data
  if y is None and (hasattr(x, "__next__") or
                    isinstance(x, keras.utils.PyDataset)):
    # Batches of unknown size and count: each interlocking step is traced
    # for one static batch, which tf.data can promise and a generator not.
    raise ValueError(
        f"fit takes arrays or a tf.data.Dataset, not a Python generator or "
        f"PyDataset: wrap it as tf.data.Dataset.from_generator(gen, "
        f"output_signature=...) with fixed-size batches, and pass "
        f"steps_per_epoch. Received: x={type(x).__name__}")
  if x is None or y is None:
    raise ValueError("fit needs x and y arrays, or a dataset of (features, "
                     "labels). Received: y=None")
  num = input_nest.num_examples(x)
  if sample_weight is not None and len(sample_weight) != num:
    raise ValueError(f"sample_weight needs one weight per example ({num}). "
                     f"Received: len(sample_weight)={len(sample_weight)}")
  sample_weights.check_arrays(sample_weight, y)
  if validation_split:
    if validation_data is not None or not 0 < validation_split < 1:
      raise ValueError(f"validation_split must be in (0, 1), without "
                       f"validation_data. Received: "
                       f"validation_split={validation_split}")
    cut = int(math.floor(num * (1.0 - validation_split)))
    validation_data = (input_nest.sliced(x, cut), y[cut:]) + (
        () if sample_weight is None else (sample_weight[cut:],))
    x, y, num = input_nest.sliced(x, None, cut), y[:cut], cut
    if sample_weight is not None:
      sample_weight = sample_weight[:cut]
  batch_size = batch_size or 32
  if num < batch_size:
    raise ValueError(f"fit needs at least one full batch of {batch_size} "
                     f"examples; got {num}. Received: batch_size={batch_size}")
  if num % batch_size:
    warnings.warn(f"Each epoch skips {num % batch_size} of {num} examples: "
                  f"interlocking steps need full batches of {batch_size}.",
                  stacklevel=3)
  x = input_nest.as_slices(x)
  dataset = tf.data.Dataset.from_tensor_slices(
      (x, y) if sample_weight is None else (
          x, (y, np.asarray(sample_weight, dtype="float32"))))
  if shuffle:
    dataset = dataset.shuffle(num, reshuffle_each_iteration=True)
  dataset = dataset.batch(batch_size, drop_remainder=True)
  dataset = dataset if autotune else without_autotune(dataset)
  if steps_per_epoch is None:
    return dataset, num // batch_size, None, validation_data
  return (dataset.repeat(), steps_per_epoch, steps_per_epoch,
          validation_data)


class FitLogs:
  """`fit`'s per-module logs, kept in Keras `Mean` trackers.

  `train_function` is what `fit` calls once per `steps_per_execution`
  batches: one `InterlockTrainer.train_loop` call, whose metrics are the
  means over its steps. Keras 3.15's own function (`TensorFlowTrainer.
  _make_function`) runs the steps as a `tf.while_loop` whose body calls
  `train_step`, a nested `tf.function`, under a `tf.cond` on the next
  batch, `unrolled_steps_per_execution` (default 1) steps per iteration,
  and returns the last step's outputs only. With `train_step` = one routed
  step that loop was slower than `train_loop` for e2e
  (docs/results/fit_train_function/report.md), so `fit` keeps calling
  `train_loop`.

  Each call's means go into the model's trackers
  weighted by the steps it ran, so a tracker holds the epoch's running mean
  (sum_calls steps_c * mean_c / sum_calls steps_c). Keras's `fit` resets
  every tracker in `model.metrics` when an epoch begins (`reset_metrics`).
  `steps_done` counts the steps run this epoch; `callback`, which
  `InterlockModel.fit` adds to Keras's, zeroes it in `on_epoch_begin`.

  Names the evaluation also reports ("loss", "module_k/loss", ...) share
  its trackers; training-only ones ("module_k/grad_norm", with loss
  scaling "module_k/loss_scale" and "module_k/skipped") are made on first
  use and listed in `extra`.
  """

  def __init__(self):
    self.steps_per_epoch = None
    self.steps_done = 0
    self.extra = {}
    self._updaters = {}
    self.callback = _EpochStart(self)

  def _updater(self, trackers):
    """One `tf.function` that adds a call's means to `trackers` (a list),
    each with its weight, and returns their results: one call op instead
    of some ten eager ops per tracker (about 20 ms a call on the
    benchmark's host)."""
    key = tuple(id(t) for t in trackers)
    if key not in self._updaters:
      def update(values, weights):
        for tracker, value, weight in zip(trackers, tf.unstack(values),
                                          tf.unstack(weights)):
          tracker.update_state(value, sample_weight=weight)
        return [tracker.result() for tracker in trackers]
      self._updaters[key] = tf.function(update, autograph=False)
    return self._updaters[key]

  def train_function(self, model, names):
    """The callable `fit` calls with Keras's iterator; returns the logs.

    `names`: compile's metric names (`metric_names.with_keras_names`)."""
    def train_function(iterator):
      trackers = {m.name: m for m in model.metrics}
      spe = model.steps_per_execution
      # The epoch's last call runs only the steps left, so an epoch is
      # exactly `steps_per_epoch` steps when spe does not divide it.
      num = min(spe, self.steps_per_epoch - self.steps_done)
      self.steps_done += max(num, 0)
      # Each distinct step count traces (and optimises) its own unrolled
      # function, whose cost grows with the steps unrolled: the leftover
      # steps run as one-step calls, the smallest function to trace.
      calls = ([(spe, num)] if num == spe else
               [(1, 1)] * (max(num, 1) - 1) + [(1, min(num, 1))])
      for steps, counted in calls:
        # A weighted metric's mean is its numerator's over its weights'
        # (`keras_metrics.split_weights`), weighted by its weights.
        metrics, weights = (
            metric_names.with_keras_names(values, model.num_modules, names)
            for values in keras_metrics.split_weights(
                model.trainer.train_loop(iterator, num_steps=steps)))
        for key in metrics:
          if key not in trackers:
            trackers[key] = self.extra[key] = keras.metrics.Mean(name=key)
        keys = list(metrics)
        results = self._updater([trackers[key] for key in keys])(
            tf.constant([_ratio(metrics[key], weights.get(key))
                         for key in keys], tf.float32),
            tf.constant([counted * weights.get(key, 1.0) for key in keys],
                        tf.float32))
      return dict(zip(keys, results))
    return train_function


def _ratio(value, weights):
  """`value` over `weights` (None: `value`); 0 where the weights are 0,
  which then add nothing to the tracker, as in Keras."""
  if weights is None:
    return value
  return value / weights if weights else 0.0


class _EpochStart(keras.callbacks.Callback):
  """Zeroes `FitLogs.steps_done` when Keras begins an epoch."""

  def __init__(self, fit_logs):
    super().__init__()
    self._fit_logs = fit_logs

  def on_epoch_begin(self, epoch, logs=None):
    del epoch, logs
    self._fit_logs.steps_done = 0


def with_callback(callbacks, callback):
  """`callbacks` (None, a list or a Keras `CallbackList`) plus `callback`.

  A list is copied; a `CallbackList` (which Keras's `fit` uses as given)
  gets `callback` added to its public `callbacks` list, once.
  """
  if isinstance(callbacks, keras.callbacks.CallbackList):
    if callback not in callbacks.callbacks:
      callbacks.callbacks.append(callback)
    return callbacks
  return list(callbacks or []) + [callback]


def logs_in_order(model, logs):
  """`logs`'s values in `model.metrics` order, then the rest by name;
  one value alone is returned as itself (Keras's `train_on_batch`)."""
  names = [metric.name for metric in model.metrics]
  values = ([logs[name] for name in names if name in logs] +
            [logs[key] for key in sorted(logs) if key not in names])
  return values[0] if len(values) == 1 else values


def eval_trackers(modules, with_metric):
  """Mean trackers of every exit's loss (and metrics), in log order.

  `with_metric`: a bool ("accuracy" or none) or the metrics' names.
  """
  if isinstance(with_metric, bool):
    with_metric = [metric_names.DEFAULT_METRIC] if with_metric else []
  names = ["loss"] + list(with_metric)
  for index in range(len(modules)):
    if exits_lib.is_exit(modules, index):
      names.append(metric_names.metric_name(index, "loss"))
      names.extend(metric_names.metric_name(index, metric)
                   for metric in with_metric)
  return [keras.metrics.Mean(name=name) for name in names]


def update_eval_trackers(trackers, values, names):
  """Adds one batch of every exit's per-example values to the trackers.

  Args:
    trackers: `eval_trackers`'s, for the same modules and `names`.
    values: `evaluation.exit_values`'s {"module_k": {"loss", "metric"}},
      the deepest head the network's; a weighted metric's numerator comes
      with its weights (`keras_metrics.split_weights`).
    names: compile's metric names; module K's values are logged under
      these (and "loss") too (`metric_names.with_keras_names`).

  Returns:
    {name: result} of every tracker, in their order.
  """
  flat = {}
  for head, per_example in values.items():
    index = metric_names.head_index(head)
    flat[metric_names.metric_name(index, "loss")] = per_example["loss"]
    for name, value in metric_names.named_scores(
        per_example.get("metric", {})).items():
      flat[metric_names.metric_name(index, name)] = value
  by_name = {tracker.name: tracker for tracker in trackers}
  network = metric_names.head_index(metric_names.network_head(values)) + 1
  flat, weights = (metric_names.with_keras_names(part, network, names)
                   for part in keras_metrics.split_weights(flat))
  for key, value in flat.items():
    if key in weights:
      # Keras's weighted mean: sum(w * value) / sum(w) over the examples.
      by_name[key].update_state(tf.math.divide_no_nan(value, weights[key]),
                                sample_weight=weights[key])
    else:
      by_name[key].update_state(value)
  return {tracker.name: tracker.result() for tracker in trackers}
