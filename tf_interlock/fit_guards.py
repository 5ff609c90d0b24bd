"""What `InterlockModel.fit` refuses to train on silently.

* `NonFiniteGuard`, a Keras callback that `fit` adds unless one is given:
  after every `steps_per_execution` call it checks the logs (every
  module's loss and gradient norm) and every module's weights. A NaN or
  Inf in `x`, a NaN `sample_weight` or a too-high learning rate makes some
  module's weights non-finite, sometimes while the epoch's logs still look
  finite; training on from there only spreads NaN. The default,
  `NonFiniteGuard("raise")`, stops `fit` with one line naming the module
  (the binary's `--on_nan=stop`); `NonFiniteGuard("terminate")` stops as
  `keras.callbacks.TerminateOnNaN` does (`model.stop_training`, `fit`
  returns its History) after printing that line.
* `check_labels`: array labels of a sparse classification loss must be
  whole numbers in [0, num_classes) before the first step. Out of range,
  TF's CPU kernel fails deep in a traceback and XLA trains on NaN without
  a word; fractions would be truncated to integers.
* `check_not_empty`: `train_on_batch` on a batch of no examples.
"""

import math
import weakref

import keras
import numpy as np
import tensorflow as tf

from tf_interlock import metric_names

ACTIONS = ("raise", "terminate")


class NonFiniteError(FloatingPointError):
  """A module's loss, gradients or weights went NaN or infinite in `fit`."""


def nonfinite_problem(model, logs):
  """One line naming what went non-finite after a step, or None.

  Args:
    model: the `InterlockModel`.
    logs: the logs of the call that just ran ({name: value}).
  """
  bad = sorted(key for key, value in (logs or {}).items()
               if key.startswith("module_") and
               not math.isfinite(float(value)))
  if bad:
    index, name = metric_names.parse_metric_name(bad[0])
    return (f"non-finite {name} in {metric_names.module_name(index)} "
            f"({bad[0]}={float(logs[bad[0]])})")
  for k, finite in enumerate(_weights_finite(model)):
    if not finite:
      return (f"non-finite weights in {metric_names.module_name(k)} while "
              "the logs look finite")
  return None


# One traced check per model: a module's weights finite or not, for all
# modules in one call (eager ops per variable would cost milliseconds).
_CHECKS = weakref.WeakKeyDictionary()


def _weights_finite(model):
  """Whether each module's weights are all finite, module by module."""
  if model not in _CHECKS:
    groups = [[v for v in module.weights if "float" in str(v.dtype)]
              for module in model.interlock_modules]
    _CHECKS[model] = tf.function(lambda: tf.stack([
        tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in group])
        for group in groups]), autograph=False)
  return [bool(finite) for finite in _CHECKS[model]().numpy()]


def advice(where):
  """The end of the line: what to check, and how to change the guard."""
  return (f"{where}; stopped: check the inputs, labels and sample weights "
          "for NaN or Inf, or lower the learning rate. To stop quietly "
          "instead, pass callbacks=[tf_interlock.fit_guards."
          "NonFiniteGuard('terminate')]")


class NonFiniteGuard(keras.callbacks.Callback):
  """Stops `fit` when a module's loss, gradients or weights go non-finite.

  `InterlockModel.fit` adds `NonFiniteGuard("raise")` unless `callbacks`
  holds one already; pass your own to change what it does.

  Args:
    action: "raise" (default): raise `NonFiniteError` with one line naming
      the module and the batch. "terminate": print that line and set
      `model.stop_training`, as `keras.callbacks.TerminateOnNaN` does.
  """

  def __init__(self, action="raise"):
    super().__init__()
    if action not in ACTIONS:
      raise ValueError(f"NonFiniteGuard's action must be one of {ACTIONS}. "
                       f"Received: action={action!r}")
    self.action = action
    self._epoch = 0

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch = epoch

  def on_train_batch_end(self, batch, logs=None):
    problem = nonfinite_problem(self.model, logs)
    if problem is None:
      return
    line = advice(f"{problem} at batch {batch + 1} of epoch "
                  f"{self._epoch + 1}")
    if self.action == "raise":
      raise NonFiniteError(line)
    print(f"warning: {line}", flush=True)
    self.model.stop_training = True


def with_guard(callbacks):
  """`callbacks` plus a default `NonFiniteGuard`, unless one is there.

  A list is copied; a Keras `CallbackList` gets the guard appended.
  """
  given = (callbacks.callbacks if isinstance(
      callbacks, keras.callbacks.CallbackList) else list(callbacks or []))
  if any(isinstance(c, NonFiniteGuard) for c in given):
    return callbacks
  if isinstance(callbacks, keras.callbacks.CallbackList):
    guard = NonFiniteGuard()
    guard.set_model(callbacks.model)  # Keras uses a given list as it is
    callbacks.callbacks.append(guard)
    return callbacks
  return given + [NonFiniteGuard()]


def sparse_loss(loss):
  """True when `compile`'s `loss` takes integer class ids (the default)."""
  return (loss is None or loss in ("sparse_categorical_crossentropy",) or
          isinstance(loss, keras.losses.SparseCategoricalCrossentropy))


def check_labels(y, num_classes, name="y"):
  """Raises unless array labels are whole class ids in [0, num_classes).

  Datasets and generators are not read here (that would cost a pass over
  the data); arrays, lists and eager tensors are.

  Args:
    y: `fit`'s labels.
    num_classes: `num_classes()` is the size of the network's last (class)
      axis; called only for array labels.
    name: the argument, for the message.

  Raises:
    ValueError: naming the first bad label, its index and what is allowed.
  """
  if isinstance(y, tf.data.Dataset) or y is None or not hasattr(
      y, "__len__"):
    return
  labels = np.asarray(y)
  if labels.dtype.kind not in "iuf" or labels.size == 0:
    return
  num_classes = num_classes()
  bad = ~np.isfinite(labels) if labels.dtype.kind == "f" else np.zeros(
      labels.shape, bool)
  if labels.dtype.kind == "f":
    bad |= np.isfinite(labels) & (labels != np.floor(
        np.nan_to_num(labels)))
  bad |= np.isfinite(labels) & ((labels < 0) | (labels >= num_classes))
  if bad.any():
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    value = labels[index].item()  # a Python number: "4", not "np.int64(4)"
    where = index[0] if len(index) == 1 else index
    raise ValueError(
        f"{name}[{where}] = {value!r} is not a class id: labels of a sparse "
        f"classification loss must be whole numbers in [0, {num_classes}) "
        f"(the network has {num_classes} classes). Received: "
        f"{name}[{where}]={value!r}")


def check_not_empty(x, name="x"):
  """Raises if the batch `x` holds no examples (`train_on_batch`)."""
  first = tf.nest.flatten(x)[0] if x is not None else None
  size = None if first is None else np.shape(first)[0] if np.ndim(
      first) else None
  if size == 0:
    raise ValueError(f"train_on_batch needs at least one example; the batch "
                     f"is empty. Received: {name}.shape="
                     f"{tuple(np.shape(first))}")
