"""What crosses a module boundary: one tensor, or a nest of them.

Module k hands module k+1 its output h_k (Gomez et al., 2022,
arXiv:2010.04116, Sec. 3). In a Transformer split depthwise that is a
hidden state *and* what every block reads besides it: the padding mask,
positions, segment ids. So h_k may be a nest (list or dict) of tensors:

* the floating-point leaves are *differentiable*: module k+1 differentiates
  them, they are cut with `tf.stop_gradient`, and a cotangent comes back
  for each;
* integer and boolean leaves (masks, ids) ride along: no cotangent exists
  for them, none is sent;
* the *primary* leaf, the first floating-point one (the hidden state, as
  `tf_interlock.from_keras` orders a cut's tensors), is what module k's
  auxiliary head reads.

One tensor is the nest of one leaf: every function here returns for it
what the code written for one tensor used (the tensor itself, or a list of
one), so a single-tensor boundary runs exactly the same ops as before.
"""

import tensorflow as tf


def cut(h):
  """stop_gradient of every leaf: no gradient crosses implicitly."""
  return tf.nest.map_structure(tf.stop_gradient, h)


def is_differentiable(t):
  """Whether a leaf gets a cotangent: a floating-point tensor."""
  return tf.as_dtype(t.dtype).is_floating


def differentiable(h):
  """The floating-point leaves of `h`, in `tf.nest.flatten` order."""
  return [t for t in tf.nest.flatten(h) if is_differentiable(t)]


def primary(h):
  """The leaf an auxiliary head reads: `h` itself for one tensor, else the
  first floating-point leaf.

  Raises:
    ValueError: `h` has no floating-point leaf.
  """
  if not tf.nest.is_nested(h):
    return h
  floats = differentiable(h)
  if not floats:
    raise ValueError(
        f"A module boundary needs a floating-point tensor for the aux head "
        f"and the cotangents. Received: dtypes="
        f"{[t.dtype.name for t in tf.nest.flatten(h)]}")
  return floats[0]


def primary_shape(shape):
  """The shape of the primary leaf, from a boundary's (nested) shape.

  A shape is a tuple of ints/None; a nest of them is a list or dict of such
  tuples. For a nest the first entry is taken: `from_keras` puts the
  primary tensor first.
  """
  if isinstance(shape, dict):
    return primary_shape(next(iter(shape.values())))
  if isinstance(shape, (list, tuple)) and shape and isinstance(
      shape[0], (list, tuple, dict)):
    return primary_shape(shape[0])
  return shape
