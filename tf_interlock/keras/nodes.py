"""What `from_keras` asks of one operation of a functional graph.

A Keras 3 functional graph holds Layers and also raw `keras.Operation`s:
arithmetic on Keras tensors (`x / 127.5 - 1.0`, ConvNeXt's `inputs +
layer(x)`), `keras.ops` calls (`keras.ops.mean(x, axis=(1, 2))`) and what
`keras.applications.*.preprocess_input` records. An Operation is not a
Layer: it has no weights, no `count_params()` and no `activation`. Every
question the splitter asks of a graph node goes through these functions, so
that an Operation stands wherever a Layer may.
"""

import keras

# Raw operations that merge tensors or post-process one (the keras.ops
# counterparts of keras_blocks' merge layers): their class names.
_MERGE_OPS = frozenset({
    "Add", "Subtract", "Multiply", "Divide", "TrueDivide", "Concatenate",
    "Average", "Maximum", "Minimum", "Stack"})
# Raw operations that apply a nonlinearity: activations of keras.ops.nn and
# the elementwise nonlinear functions of keras.ops.numpy.
_NONLINEAR_OPS = frozenset({
    "Relu", "Relu6", "Sigmoid", "Softplus", "Softsign", "Silu", "Swish",
    "LogSigmoid", "LeakyRelu", "HardSigmoid", "HardSilu", "HardSwish",
    "Elu", "Selu", "Gelu", "Celu", "Glu", "HardTanh", "SoftShrink",
    "HardShrink", "TanhShrink", "Softmax", "LogSoftmax", "Sparsemax",
    "Squareplus", "SparsePlus", "Tanh", "Exp", "Log", "Abs", "Square",
    "Sqrt", "Rsqrt", "Maximum", "Minimum", "Max", "Min", "Power", "Sin",
    "Cos", "Erf", "Sign", "Clip"})


def is_layer(operation):
  """Whether a graph node is a Layer (else a raw Operation)."""
  return isinstance(operation, keras.layers.Layer)


def weights(operation):
  """The node's weights; [] for a raw Operation."""
  return list(operation.weights) if is_layer(operation) else []


def count_params(operation):
  """The node's parameter count; 0 for a raw Operation."""
  return operation.count_params() if is_layer(operation) else 0


def is_merge_op(operation):
  """Whether a raw Operation merges or rescales tensors (x + y, x / c)."""
  return not is_layer(operation) and type(operation).__name__ in _MERGE_OPS


def is_nonlinear_op(operation):
  """Whether a raw Operation applies a nonlinearity (keras.ops.relu, ...).

  Any other raw Operation (arithmetic, reductions, reshapes) counts as
  linear, so a block made only of such operations joins its neighbour.
  """
  return type(operation).__name__ in _NONLINEAR_OPS
