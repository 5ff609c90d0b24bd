"""What `InterlockModel.fit` and `from_keras` refuse, in one line each.

The arguments first: `from_keras`, `InterlockModel.compile` and `fit` call
the `check_*` functions below before any work, so that a bad argument is
refused in one line naming the value and what is allowed, ending like
Keras's "Received: name=value", instead of an IndexError, a TypeError
about `<=` or a TF shape error from deep inside tracing. Then what is
refused while training:
* `NonFiniteGuard`, a Keras callback that `fit` adds unless one is given:
  after every `steps_per_execution` call it checks the logs (every
  module's loss and gradient norm), and at the end of every epoch every
  module's weights. A NaN or Inf in `x`, a NaN `sample_weight` or a
  too-high learning rate makes some module's weights non-finite; training
  on from there only spreads NaN. Weights gone non-finite in one step give
  a non-finite loss in the next, so the logs catch them one call later;
  the epoch's weight check catches the last step's. Reading every weight
  after every call would cost what plain Keras never pays: 2.6 ms for the
  4.2M weights of the benchmark MLP, 48 ms for GPT-2's 124M on the 2-core
  host, after every step at Keras's default steps_per_execution=1. The default,
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


def nonfinite_problem(model, logs, weights=True):
  """One line naming what went non-finite after a step, or None.

  Args:
    model: the `InterlockModel`.
    logs: the logs of the call that just ran ({name: value}).
    weights: also check every module's weights (one traced call over all
      of them).
  """
  bad = sorted(key for key, value in (logs or {}).items()
               if key.startswith("module_") and
               not math.isfinite(float(value)))
  if bad:
    index, name = metric_names.parse_metric_name(bad[0])
    return (f"non-finite {name} in {metric_names.module_name(index)} "
            f"({bad[0]}={float(logs[bad[0]])})")
  for k, finite in enumerate(_weights_finite(model) if weights else []):
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
          "instead, pass callbacks=[tf_interlock.keras.fit_checks."
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
    self._warned = False

  def on_train_begin(self, logs=None):
    self._warned = False

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch = epoch

  def on_train_batch_end(self, batch, logs=None):
    self._stop(nonfinite_problem(self.model, logs, weights=False),
               f"at batch {batch + 1} of epoch {self._epoch + 1}")

  def on_epoch_end(self, epoch, logs=None):
    self._stop(nonfinite_problem(self.model, {}, weights=True),
               f"at the end of epoch {epoch + 1}")

  def _stop(self, problem, when):
    if problem is None or self._warned:
      return
    line = advice(f"{problem} {when}")
    if self.action == "raise":
      raise NonFiniteError(line)
    print(f"warning: {line}", flush=True)
    self._warned = True  # once: the epoch's end would say it again
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


import numpy as np

from tf_interlock import int_args

# steps_per_execution unrolls that many steps into one tf.function, each
# with its own iterator get_next: above 32 TF warns about the many calls
# and tracing grows with every step (train/config.py caps the binary's
# --steps_per_loop the same way, MAX_GET_NEXT_CALLS).
MAX_STEPS_PER_EXECUTION = 32


_is_int = int_args.is_int


def check_from_keras(model, num_modules, num_classes=None):
  """from_keras(model, num_modules): K an int >= 1, a model with layers,
  num_classes (the aux heads' outputs) None or an int >= 1.

  Raises:
    ValueError: one line naming the bad argument.
  """
  if not _is_int(num_modules) or num_modules < 1:
    raise ValueError(f"num_modules must be an int >= 1 (the number of "
                     f"modules K). Received: num_modules={num_modules!r}")
  if num_classes is not None and (not _is_int(num_classes) or
                                  num_classes < 1):
    raise ValueError(
        f"num_classes must be None (the last axis of the model's output) or "
        f"an int >= 1 (the outputs of each aux head). "
        f"Received: num_classes={num_classes!r}")
  if isinstance(model, keras.Model):
    layers = [layer for layer in model.layers
              if not isinstance(layer, keras.layers.InputLayer)]
    if not layers:
      raise ValueError(
          f"from_keras needs a model with at least one layer after its "
          f"keras.Input to split into {num_modules} modules. Received: "
          f"model={model.name!r} with 0 layers")


def check_steps_per_execution(steps_per_execution):
  """compile(steps_per_execution=): an int in 1..32."""
  if (not _is_int(steps_per_execution) or
      not 1 <= steps_per_execution <= MAX_STEPS_PER_EXECUTION):
    raise ValueError(
        f"steps_per_execution must be an int in 1..{MAX_STEPS_PER_EXECUTION}"
        f": each step is unrolled into one traced function, and more make "
        f"tracing slow with little gain per call. Received: "
        f"steps_per_execution={steps_per_execution!r}")


def _length(value):
  """len(value) for an array-like with a length, else None."""
  try:
    return len(value)
  except TypeError:
    return None


def check_fit(x, y, batch_size, kwargs, epochs=1, initial_epoch=0,
              example_shape=None):
  """fit(x, y, batch_size, **kwargs) before any data is read.

  Args:
    x, y, batch_size: as given to `InterlockModel.fit`.
    kwargs: fit's other keyword arguments.
    epochs, initial_epoch: as given to `fit`.
    example_shape: the shape of one example the model takes (None where a
      size is free), or None when not known yet.

  Raises:
    ValueError: one line naming the bad argument.
  """
  if not _is_int(initial_epoch) or initial_epoch < 0:
    raise ValueError(f"initial_epoch must be an int >= 0. Received: "
                     f"initial_epoch={initial_epoch!r}")
  if not _is_int(epochs) or epochs <= initial_epoch:
    # Keras would return at once with an empty History: nothing trained.
    raise ValueError(
        f"epochs must be an int > initial_epoch ({initial_epoch}): fit runs "
        f"epochs {initial_epoch + 1}..epochs, and this would train none. "
        f"Received: epochs={epochs!r}")
  if "steps_per_execution" in kwargs:
    raise ValueError(
        "steps_per_execution is set in compile(), not fit(): "
        "model.compile(..., steps_per_execution=n). Received: "
        f"steps_per_execution={kwargs['steps_per_execution']!r}")
  if batch_size is not None and (not _is_int(batch_size) or batch_size < 1):
    raise ValueError(f"batch_size must be an int >= 1 (or None: 32). "
                     f"Received: batch_size={batch_size!r}")
  check_python_rows(x, y)
  if isinstance(x, (list, tuple)) and len(x) == 1 and y is not None:
    raise ValueError(
        "x is a list of one array, but the model has one input: pass the "
        "array itself, fit(x[0], y). Received: x=list of 1 array")
  check_lengths(x, y)
  check_example_shape(x, example_shape)


def _is_python_rows(value):
  """Whether `value` is data written as Python lists (numbers, strings or
  lists of them), not a list of input arrays or dicts (several inputs)."""
  return isinstance(value, (list, tuple)) and bool(value) and not any(
      hasattr(v, "shape") or isinstance(v, dict) for v in value)


def _ragged(name, value):
  """The one line for Python rows that no array can hold, or None."""
  lengths = [len(row) if isinstance(row, (list, tuple)) else None
             for row in value]
  for i, length in enumerate(lengths):
    if length != lengths[0]:
      def said(n):
        return "a single value" if n is None else f"{n} values"
      return (f"{name}'s rows differ in length (row 0 has "
              f"{said(lengths[0])}, row {i} has {said(length)}): every "
              f"example needs the same shape; pad them (e.g. "
              f"keras.utils.pad_sequences) into one numpy array. Received: "
              f"{name}=list of {len(value)} rows")
  try:
    np.asarray(value)
  except ValueError:
    return (f"{name}'s rows differ in length below the first axis: every "
            f"example needs the same shape; pad them into one numpy array. "
            f"Received: {name}=list of {len(value)} rows")
  return None


def check_python_rows(x, y=None):
  """x and y given as Python lists (fit, evaluate, predict).

  A Python list x is Keras's way to pass several inputs (one array each);
  a list of numbers, strings or lists is one input's examples written out,
  which Keras's `fit` refuses ("Unrecognized data type") and which would be
  counted here by its first row's length. Such an x is refused in one
  line, naming the rows that differ when no array can hold them. A list y
  (labels) is taken, as before, when its rows all have one length.

  Raises:
    ValueError: one line naming x or y.
  """
  for name, value in (("x", x), ("y", y)):
    line = _is_python_rows(value) and _ragged(name, value)
    if line:
      raise ValueError(line)
  if _is_python_rows(x):
    raise ValueError(
        f"x is a Python list of {len(x)} examples; pass one numpy array, "
        f"np.asarray(x, dtype=...) with the dtype the model takes, or a "
        f"list of arrays (one per input). Received: x=list of {len(x)} rows")


def check_lengths(x, y):
  """x and y (arrays) hold the same number of examples (fit, evaluate)."""
  check_python_rows(x, y)
  nx, ny = _length(x), _length(y)
  if (nx is not None and ny is not None and nx != ny and
      not isinstance(x, (list, tuple, dict))):
    raise ValueError(
        f"x and y must hold the same number of examples. Received: "
        f"len(x)={nx}, len(y)={ny}")


def check_example_shape(x, example_shape):
  """An array x's examples have the shape the model takes (None: any)."""
  shape = getattr(x, "shape", None)
  if example_shape is None or shape is None or isinstance(x, dict):
    return
  shape = tuple(shape)[1:]
  if len(shape) != len(example_shape) or any(
      want is not None and got is not None and want != got
      for got, want in zip(shape, example_shape)):
    want = tuple(example_shape)
    raise ValueError(
        f"x's examples have shape {shape}, but the model takes examples of "
        f"shape {want} (None: any size). Received: x.shape={tuple(x.shape)}")
