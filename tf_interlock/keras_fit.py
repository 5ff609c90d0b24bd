"""The pieces `InterlockModel` plugs into Keras's compile/fit/evaluate.

* `optimizer_factory`, `per_example_loss`, `per_example_metric` turn
  `compile`'s Keras-style arguments into what `InterlockTrainer` takes: one
  optimizer per module, created under that module's device scope, and
  per-example losses. Each module's loss L_k must be averaged over the
  *global* batch by the engine (`tf.nn.compute_average_loss`), so a Keras
  loss's own reduction is bypassed: its `call` gives one value per example.
* `training_dataset` turns `fit`'s x/y into fixed-size batches (every
  interlocking step needs a static batch) and works out the steps per epoch.
* `FitState` is the function `fit` calls once per `steps_per_execution`
  batches: it runs `InterlockTrainer.train_loop` and keeps the epoch's
  running means, which Keras shows in the progress bar and History.
* `eval_trackers`/`update_eval_trackers`: evaluation of every exit.
"""

import math
import warnings

import keras
import numpy as np
import tensorflow as tf

from tf_interlock import evaluation
from tf_interlock import exits as exits_lib
from tf_interlock import losses as losses_lib
from tf_interlock import metric_names

_SPARSE_ACCURACY = ("accuracy", "acc", "sparse_categorical_accuracy")


def _clone(optimizer, where):
  if not isinstance(optimizer, keras.optimizers.Optimizer):
    raise ValueError(
        f"optimizer must be a Keras optimizer, a name, a list of K "
        f"optimizers or a callable k -> optimizer. Received: "
        f"{where}={optimizer!r}")
  # A fresh instance per module: its step counter and slots are created under
  # that module's device scope; the user's instance is never updated.
  return optimizer.__class__.from_config(optimizer.get_config())


def optimizer_factory(optimizer, num_modules):
  """A callable k -> a new optimizer for module k (k = 0..K-1)."""
  if isinstance(optimizer, str):
    try:
      keras.optimizers.get(optimizer)
    except ValueError as e:
      raise ValueError(f"Unknown optimizer name. Received: "
                       f"optimizer={optimizer!r}") from e
    return lambda k: keras.optimizers.get(optimizer)
  if isinstance(optimizer, (list, tuple)):
    if len(optimizer) != num_modules:
      raise ValueError(
          f"A list of optimizers needs one per module ({num_modules} "
          f"modules). Received: len(optimizer)={len(optimizer)}")
    for k, opt in enumerate(optimizer):
      _clone(opt, f"optimizer[{k}]")
    return lambda k: _clone(optimizer[k], f"optimizer[{k}]")
  if isinstance(optimizer, keras.optimizers.Optimizer):
    return lambda k: _clone(optimizer, "optimizer")
  if callable(optimizer):
    return optimizer
  return _clone(optimizer, "optimizer")  # Raises, naming the argument.


def compile_config(optimizer, loss, metrics, steps_per_execution):
  """`compile`'s arguments as a saveable config, or None.

  A plain Python callable (an optimizer factory, a per-example loss or
  metric function) cannot be saved safely: a model compiled with one is
  saved uncompiled, and must be compiled again after loading.
  """
  def saveable(value, kinds):
    return value is None or isinstance(value, (str,) + kinds)
  optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [
      optimizer]
  metric_list = metrics if isinstance(metrics, (list, tuple)) else [metrics]
  if not (all(saveable(o, (keras.optimizers.Optimizer,)) for o in optimizers)
          and saveable(loss, (keras.losses.Loss,))
          and all(saveable(m, ()) for m in metric_list)):
    return None
  return dict(optimizer=optimizer, loss=loss, metrics=metrics,
              steps_per_execution=steps_per_execution)


def per_example_loss(loss):
  """`loss_fn(labels, logits) -> [batch]` from a name, Loss or callable."""
  if loss is None:
    return losses_lib.sparse_softmax_cross_entropy
  fn = loss
  if isinstance(loss, str):
    try:
      fn = keras.losses.get(loss)
    except ValueError as e:
      raise ValueError(f"Unknown loss name. Received: loss={loss!r}") from e
  if isinstance(fn, keras.losses.Loss):
    # Loss.call is the unreduced loss: whatever `reduction` the object was
    # made with, the engine averages over the global batch itself.
    fn = fn.call
  if not callable(fn):
    raise ValueError(f"loss must be a name, a keras.losses.Loss or a "
                     f"callable (y_true, y_pred). Received: loss={loss!r}")

  def loss_fn(labels, logits):
    values = tf.convert_to_tensor(fn(labels, tf.cast(logits, tf.float32)))
    if values.shape.rank == 0:
      raise ValueError(
          f"loss must return one value per example (shape [batch]); it "
          f"returned a scalar, i.e. it reduced the batch itself. Pass a "
          f"keras.losses.Loss or a per-example function. Received: "
          f"loss={loss!r}")
    values = tf.cast(values, tf.float32)
    if values.shape.rank > 1:
      values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
    return values
  return loss_fn


def weighted(loss_fn):
  """`loss_fn` that also takes labels `(y, sample_weight)`: w * loss(y).

  `fit` passes sample weights along with the labels. The engine averages
  the weighted per-example losses over the global batch, which is Keras's
  default reduction: sum(w * loss) / batch size.
  """
  def loss_with_weights(labels, logits):
    if not isinstance(labels, tuple):
      return loss_fn(labels, logits)
    y, sample_weight = labels
    values = loss_fn(y, logits)
    return values * tf.reshape(tf.cast(sample_weight, values.dtype),
                               tf.shape(values))
  return loss_with_weights


def unweighted(metric_fn):
  """`metric_fn` that ignores sample weights, as Keras's `metrics=` do."""
  if metric_fn is None:
    return None

  def metric_without_weights(labels, logits):
    return metric_fn(labels[0] if isinstance(labels, tuple) else labels,
                     logits)
  return metric_without_weights


def _categorical_accuracy(labels, logits):
  return tf.cast(tf.equal(tf.argmax(labels, -1), tf.argmax(logits, -1)),
                 tf.float32)


def per_example_metric(metrics):
  """The one per-example metric `compile(metrics=...)` names, or None."""
  if metrics is None:
    return None
  items = list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
  if not items:
    return None
  if len(items) > 1:
    raise ValueError(f"InterlockModel reports one metric per module. "
                     f"Received: metrics={metrics!r}")
  metric = items[0]
  if metric in _SPARSE_ACCURACY:
    return losses_lib.sparse_accuracy
  if metric == "categorical_accuracy":
    return _categorical_accuracy
  if isinstance(metric, keras.metrics.Metric) or not callable(metric):
    # A stateful Metric would be one variable shared by every module's
    # update: it would serialize the steps the trainer runs in parallel.
    raise ValueError(
        f"metrics must be one of {_SPARSE_ACCURACY + ('categorical_accuracy',)}"
        f" or a per-example callable (y_true, y_pred) -> [batch]. Received: "
        f"metrics={metrics!r}")
  return metric


def check_exit(modules, exit_k):
  """None for the network's output, or k < K whose module has an aux head."""
  num = len(modules)
  if exit_k is None or exit_k == num:
    return None
  if (isinstance(exit_k, bool) or not isinstance(exit_k, int) or
      not 1 <= exit_k < num or not modules[exit_k - 1].has_aux_head):
    allowed = [k for k in range(1, num) if modules[k - 1].has_aux_head]
    raise ValueError(f"exit must be None, {num} (the network) or a module "
                     f"with an aux head, one of {allowed}. Received: "
                     f"exit={exit_k!r}")
  return exit_k


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


def _labels_with_weights(x, y, w):
  """(features, labels, weights) -> (features, (labels, weights))."""
  return x, (y, w)


def training_dataset(x, y, batch_size, shuffle, steps_per_epoch,
                     validation_split, validation_data, sample_weight=None,
                     input_shape=None):
  """Fixed-size training batches and the number of steps per epoch.

  Sample weights travel with the labels, as `(labels, sample_weight)`,
  which `weighted` losses understand.

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
  if x is None or y is None:
    raise ValueError("fit needs x and y arrays, or a dataset of (features, "
                     "labels). Received: y=None")
  num = len(x)
  if sample_weight is not None and len(sample_weight) != num:
    raise ValueError(f"sample_weight needs one weight per example ({num}). "
                     f"Received: len(sample_weight)={len(sample_weight)}")
  if validation_split:
    if validation_data is not None or not 0 < validation_split < 1:
      raise ValueError(f"validation_split must be in (0, 1), without "
                       f"validation_data. Received: "
                       f"validation_split={validation_split}")
    cut = int(math.floor(num * (1.0 - validation_split)))
    validation_data = (x[cut:], y[cut:]) + (
        () if sample_weight is None else (sample_weight[cut:],))
    x, y, num = x[:cut], y[:cut], cut
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
  dataset = tf.data.Dataset.from_tensor_slices(
      (x, y) if sample_weight is None else (
          x, (y, np.asarray(sample_weight, dtype="float32"))))
  if shuffle:
    dataset = dataset.shuffle(num, reshuffle_each_iteration=True)
  dataset = dataset.batch(batch_size, drop_remainder=True)
  if steps_per_epoch is None:
    return dataset, num // batch_size, None, validation_data
  return (dataset.repeat(), steps_per_epoch, steps_per_epoch,
          validation_data)


class FitState:
  """Steps done this epoch and the epoch's running per-module means."""

  def __init__(self):
    self.steps, self.done, self.sums = None, 0, {}

  def start(self, steps):
    self.steps = steps
    self.reset()

  def reset(self):
    self.done, self.sums = 0, {}

  def callback(self):
    state = self

    class _EpochStart(keras.callbacks.Callback):

      def on_epoch_begin(self, epoch, logs=None):
        state.reset()

    return _EpochStart()

  def train_function(self, model):
    """What `fit` calls once per `steps_per_execution` batches."""
    def train_function(iterator):
      # The epoch's last call runs only the steps left, so an epoch is
      # exactly `steps` steps even when steps_per_execution does not divide.
      num = min(model.steps_per_execution, self.steps - self.done)
      # Each distinct step count traces (and optimises) its own unrolled
      # function, whose cost grows with the steps unrolled: the leftover
      # steps run as one-step calls, the smallest function to trace.
      calls = ([(model.steps_per_execution, num)]
               if num == model.steps_per_execution else
               [(1, 1)] * (max(num, 1) - 1) + [(1, min(num, 1))])
      for steps, counted in calls:
        metrics = model.trainer.train_loop(iterator, num_steps=steps)
        for key, value in metrics.items():
          self.sums[key] = self.sums.get(key, 0.0) + value * counted
      self.done += num
      logs = {key: value / self.done for key, value in self.sums.items()}
      # Keras's own names are the network's, module K's.
      for name in ("loss", "accuracy"):
        key = metric_names.metric_name(model.num_modules - 1, name)
        if key in logs:
          logs[name] = logs[key]
      return logs
    return train_function


class _StepCallbackList(keras.callbacks.CallbackList):
  """Reports the epoch's last call as ending at its real last step.

  Keras numbers a call's steps as if every call ran steps_per_execution of
  them; the epoch's last call may run fewer (see `FitState`).
  """

  def __init__(self, callbacks, last_step, **kwargs):
    super().__init__(callbacks, **kwargs)
    self.last_step = last_step

  def on_train_batch_end(self, batch, logs=None):
    super().on_train_batch_end(min(batch, self.last_step), logs)


def callback_list(callbacks, model, state, epochs, verbose):
  """`fit`'s callbacks plus the one that resets `state` at each epoch."""
  if isinstance(callbacks, keras.callbacks.CallbackList):
    callbacks.append(state.callback())
    return callbacks
  return _StepCallbackList(
      list(callbacks or []) + [state.callback()], last_step=state.steps - 1,
      add_history=True, add_progbar=verbose != 0, verbose=verbose,
      epochs=epochs, steps=state.steps, model=model)


def eval_trackers(modules, with_metric):
  """Mean trackers of every exit's loss (and metric), in log order."""
  names = ["loss"] + (["accuracy"] if with_metric else [])
  for index in range(len(modules)):
    if exits_lib.is_exit(modules, index):
      names.append(metric_names.metric_name(index, "loss"))
      if with_metric:
        names.append(metric_names.metric_name(index, "accuracy"))
  return [keras.metrics.Mean(name=name) for name in names]


def update_eval_trackers(model, x, y):
  """Runs every exit on a batch (the one evaluator, `evaluation`) and
  updates the trackers; "loss" and "accuracy" are module K's."""
  trackers = {m.name: m for m in model.metrics}
  # pylint: disable=protected-access
  values = evaluation.exit_values(model.interlock_modules, x, y,
                                  model._loss_fn, model._metric_fn,
                                  scope=model._scope)
  # pylint: enable=protected-access
  network = metric_names.network_head(values)
  for head, per_example in values.items():
    for prefix in [f"{head}/"] + ([""] if head == network else []):
      trackers[prefix + "loss"].update_state(per_example["loss"])
      if "metric" in per_example:
        trackers[prefix + "accuracy"].update_state(per_example["metric"])
  return {m.name: m.result() for m in model.metrics}
