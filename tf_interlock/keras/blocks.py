"""Where `from_keras` may cut a Keras model when it balances the modules.

Interlocking needs one tensor across each module boundary (Gomez et al.,
2022, arXiv:2010.04116, Sec. 3), but not every such place is a good module
boundary. Module k's aux head A_k reads h_k, the module's output: cut a
convolution from the BatchNormalization and ReLU that follow it and h_k is
a pre-normalisation linear map of the input, on which a linear aux head
stays at chance, while module k's own body learns nothing nonlinear.

So the automatic balance deals *blocks* into modules, where:

* a block may end only after a layer whose output is not taken over by a
  normalisation, activation or merge right after it: the layer's
  post-processing belongs to its block (a conv, its BN and its ReLU stay
  together). A merge's output (a residual sum) may end a block even when a
  normalisation follows: that is a pre-activation network's block boundary;
* a block without weights (e.g. pooling before the head) joins the block
  before it;
* every block holds at least one nonlinearity: a block without one (a bare
  stem convolution, a linear output head) joins its neighbour.

An explicit `split=` may still cut at any single-tensor place.
"""

import keras

from tf_interlock.keras import nodes as keras_nodes

_NORMALIZATIONS = (keras.layers.BatchNormalization,
                   keras.layers.LayerNormalization,
                   keras.layers.GroupNormalization,
                   keras.layers.UnitNormalization)
_ACTIVATIONS = (keras.layers.Activation, keras.layers.ReLU,
                keras.layers.LeakyReLU, keras.layers.PReLU, keras.layers.ELU,
                keras.layers.Softmax)
_MERGES = (keras.layers.Add, keras.layers.Subtract, keras.layers.Multiply,
           keras.layers.Average, keras.layers.Maximum, keras.layers.Minimum,
           keras.layers.Concatenate, keras.layers.Dot)
_MAX_POOLS = (keras.layers.MaxPooling1D, keras.layers.MaxPooling2D,
              keras.layers.MaxPooling3D, keras.layers.GlobalMaxPooling1D,
              keras.layers.GlobalMaxPooling2D, keras.layers.GlobalMaxPooling3D)
# Layers that are affine (or reshape, drop or sum) when their `activation`,
# if any, is linear.
_LINEAR = (keras.layers.Dense, keras.layers.EinsumDense,
           keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D,
           keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose,
           keras.layers.Conv3DTranspose, keras.layers.DepthwiseConv2D,
           keras.layers.SeparableConv2D, keras.layers.Flatten,
           keras.layers.Reshape, keras.layers.Permute, keras.layers.Dropout,
           keras.layers.SpatialDropout2D, keras.layers.ZeroPadding2D,
           keras.layers.Cropping2D, keras.layers.Identity,
           keras.layers.Rescaling, keras.layers.Embedding,
           keras.layers.AveragePooling1D, keras.layers.AveragePooling2D,
           keras.layers.AveragePooling3D,
           keras.layers.GlobalAveragePooling1D,
           keras.layers.GlobalAveragePooling2D,
           keras.layers.GlobalAveragePooling3D,
           keras.layers.UpSampling2D) + _NORMALIZATIONS + _MERGES


def _activation_name(layer):
  activation = getattr(layer, "activation", None)
  if activation is None:
    return "linear"
  return keras.activations.serialize(activation)


def is_nonlinear(layer):
  """Whether `layer` applies a nonlinearity.

  Activations, max pooling and layers with a non-linear `activation=` do;
  affine layers, normalisations, merges and reshapes do not. Any other
  layer (e.g. a residual block or a nested model) is taken to hold one. A
  raw `keras.Operation` is nonlinear only when it is an activation or an
  elementwise nonlinear function (`keras_nodes.is_nonlinear_op`).
  """
  if not keras_nodes.is_layer(layer):
    return keras_nodes.is_nonlinear_op(layer)
  if isinstance(layer, keras.layers.Activation):
    return _activation_name(layer) != "linear"
  if isinstance(layer, _ACTIVATIONS + _MAX_POOLS):
    return True
  if isinstance(layer, _LINEAR):
    return _activation_name(layer) != "linear"
  return True


def _is_merge(layer):
  """A merge layer or its raw-operation counterpart (`x + y`, `x / c`)."""
  return isinstance(layer, _MERGES) or keras_nodes.is_merge_op(layer)


def _takes_over(layer, node, tensor):
  """Whether `layer` (at `node`) post-processes `tensor`: a normalisation,
  activation or merge that reads it."""
  return ((isinstance(layer, _NORMALIZATIONS + _ACTIVATIONS) or
           _is_merge(layer)) and
          any(t is tensor for t in node.input_tensors))


def block_ends(layers, nodes, crossing):
  """Block boundaries for the automatic balance.

  Args:
    layers: the model's layers (no InputLayer) in topological order.
    nodes: each layer's node in the model's graph.
    crossing: for each cut after layer c (c < len(layers) - 1), the
      (tensor, producer name, consumer name) tuples that cross it.

  Returns:
    The sorted indices e (1 <= e <= len(layers)) such that layers[a:e] of
    consecutive ends are the blocks; the last is len(layers).
  """
  ends = []
  for c in range(len(layers) - 1):
    if len(crossing[c]) != 1:
      continue
    tensor = crossing[c][0][0]
    nxt = c + 1
    producer_is_merge = _is_merge(layers[c]) and any(
        t is tensor for t in nodes[c].output_tensors)
    if _takes_over(layers[nxt], nodes[nxt], tensor) and not (
        producer_is_merge and not _is_merge(layers[nxt])):
      continue
    if not keras_nodes.weights(layers[nxt]):
      continue  # A block without weights joins the block before it.
    ends.append(nxt)
  ends.append(len(layers))
  # Every block keeps a nonlinearity: a block without one joins the next
  # (the last block, e.g. a linear output head, joins the one before it).
  starts = [0] + ends[:-1]
  merged = []
  for a, e in zip(starts, ends):
    if merged and not any(is_nonlinear(l) for l in layers[merged[-1][0]:
                                                          merged[-1][1]]):
      merged[-1] = (merged[-1][0], e)
    else:
      merged.append((a, e))
  if len(merged) > 1 and not any(is_nonlinear(l) for l in
                                 layers[merged[-1][0]:merged[-1][1]]):
    merged[-2:] = [(merged[-2][0], merged[-1][1])]
  return [e for _, e in merged]
