"""Checks of the Keras front door's arguments: one line that says what to do.

`from_keras`, `InterlockModel.compile` and `fit` call these first, so
that a bad argument is refused in one line naming the value and what is
allowed, ending like Keras's "Received: name=value", instead of an
IndexError, a TypeError about `<=` or a TF shape error from deep inside
tracing.
"""

import keras
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
