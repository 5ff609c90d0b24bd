"""A model's input as one tensor or a nest: the front door's view of it.

A `from_keras` model with several inputs (a Transformer's token ids and
padding mask, as a dict or a list) takes a nest of arrays in `fit`,
`predict` and `evaluate`, builds from a nest of shapes and exports one
SavedModel argument per input. These functions answer each question the
Keras front door asks of its input for one tensor (exactly as before) and
for a nest alike.

A *shape* is a tuple (or, read back from JSON, a list) of ints and Nones
whose first entry is the batch axis; a nest of shapes is a dict or a list
of such shapes.
"""

import tensorflow as tf


def is_shape_nest(shape):
  """Whether `shape` is a dict or list of shapes rather than one shape."""
  return isinstance(shape, dict) or (
      isinstance(shape, (list, tuple)) and bool(shape) and
      isinstance(shape[0], (list, tuple, dict)))


def map_shapes(fn, shape, *others):
  """fn(shape, *others) for one shape, or leaf by leaf over a nest."""
  if isinstance(shape, dict):
    return {key: fn(shape[key], *(o[key] for o in others)) for key in shape}
  if is_shape_nest(shape):
    return [fn(*leaves) for leaves in zip(shape, *others)]
  return fn(shape, *others)


def as_slices(x):
  """x for `tf.data.Dataset.from_tensor_slices`: a list of input arrays as
  a tuple (a list would be stacked into one tensor)."""
  return tuple(x) if isinstance(x, list) else x


def num_examples(x):
  """The number of examples in an array or a nest of arrays."""
  return len(tf.nest.flatten(x)[0])


def sliced(x, start=None, stop=None):
  """x[start:stop] of an array, or of every array in a nest."""
  return tf.nest.map_structure(lambda a: a[start:stop], x)


def shape_of(features):
  """The (nest of) shape(s) of a batch, as tuples."""
  if not tf.nest.is_nested(features):
    return tuple(tf.convert_to_tensor(features).shape)
  return tf.nest.map_structure(
      lambda t: tuple(tf.convert_to_tensor(t).shape), features)


def dtype_of(features):
  """The (nest of) dtype name(s) of a batch."""
  return tf.nest.map_structure(
      lambda t: tf.convert_to_tensor(t).dtype.name, features)


def as_tuples(shape):
  """A shape (nest) with every shape a tuple (JSON gives lists)."""
  return map_shapes(tuple, shape)


def zeros(shape, dtype):
  """A one-example batch of zeros of `shape` (batch axis replaced)."""
  dtype = dtype or "float32"
  if is_shape_nest(shape):
    dtypes = dtype if isinstance(dtype, (dict, list, tuple)) else map_shapes(
        lambda _: dtype, shape)
    return map_shapes(lambda s, d: tf.zeros([1] + list(s)[1:], dtype=d),
                      shape, dtypes)
  return tf.zeros([1] + list(shape)[1:], dtype=dtype)


def specs(shape, dtype):
  """`tf.TensorSpec`s of any batch size for a shape (nest), for export."""
  dtype = dtype or "float32"
  if is_shape_nest(shape):
    return map_shapes(lambda s, d: tf.TensorSpec([None] + list(s)[1:], d),
                      shape, dtype)
  return tf.TensorSpec([None] + list(shape)[1:], dtype)


def first_shape(shape):
  """The shape of the first input in `tf.nest.flatten` order (a dict's
  keys sorted), as a batch of features is flattened."""
  if isinstance(shape, dict):
    return first_shape(shape[sorted(shape)[0]])
  if is_shape_nest(shape):
    return first_shape(shape[0])
  return shape
