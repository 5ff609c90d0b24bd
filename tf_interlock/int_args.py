"""The one rule for an integer argument of the library's API.

An int is a Python int or a numpy integer (`np.int64(1)`, what indexing an
array or `np.argmax` gives), never a bool: `True` is an int to Python, but
`exit=True` or `num_microbatches=True` is a mistake, not the number 1. A
value that passes is returned as a Python int, so that it prints, compares
and serializes (JSON, Keras configs) as the number it is.
"""

import numbers


def is_int(value):
  """Whether `value` is a Python or numpy integer and not a bool."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def as_int(value):
  """`value` as a Python int when `is_int(value)`, else unchanged.

  The callers check the value's range and type after this, and name the
  value as received in their message.
  """
  return int(value) if is_int(value) else value
