"""Module inputs that get no cotangent: a layer without a gradient inside.

A layer whose op has no gradient (a `tf.numpy_function` or `tf.py_function`
without one, a cast to an integer, ...) cuts the chain rule: the tape gives
None for dL/dx_k, the cotangent module k would hand to module k - 1.
Plain Keras trains such a model, warning that some variables get no
gradient, and those below the cut are not updated. The engine does the
same: a missing cotangent is taken as zero, so module k - 1 (and every
module below it) gets no gradient from the streams that cross module k,
and one warning names the module and the layer that cut it.
"""

import warnings

import tensorflow as tf

from tf_interlock import keras_private


def _probe(op, found):
  """`op` wrapped to record its name when no input gets a gradient."""
  def call(*args, **kwargs):
    inputs = [t for t in tf.nest.flatten((args, kwargs))
              if tf.is_tensor(t) and t.dtype.is_floating]
    with tf.GradientTape() as tape:
      tape.watch(inputs)
      out = op(*args, **kwargs)
    outputs = [t for t in tf.nest.flatten(out)
               if tf.is_tensor(t) and t.dtype.is_floating]
    if inputs and outputs and all(
        g is None for g in tape.gradient(outputs, inputs)):
      found.append(op.name)
    return out
  return call


def layers_without_gradient(body, x):
  """Names of the body's layers through which no gradient flows.

  Traces the body's functional graph (a `from_keras` piece) once, on an
  input shaped like `x`, taking each layer's gradient on its own.

  Args:
    body: module k's body.
    x: its (symbolic or eager) input, with a static shape.

  Returns:
    The layers' names in depth order; [] when the body has no functional
    graph to walk or its input shape is not static.
  """
  graph = getattr(body, "model", None)
  if (not keras_private.can_run_through_graph(graph) or
      not x.shape.is_fully_defined()):
    return []
  found = []

  def run(sample):
    return keras_private.run_through_graph(
        graph, sample, lambda op: _probe(op, found))
  # Traced into a graph of its own, never run: only the tape's answers
  # (None or not) matter, and the training step's graph stays as it was.
  # (Not under tf.init_scope, which pauses every gradient tape.)
  tf.function(run).get_concrete_function(tf.TensorSpec(x.shape, x.dtype))
  return found


def warn(k, module, x):
  """Warns once that module k + 1 sends module k a zero cotangent."""
  names = layers_without_gradient(module.body, x)
  where = (f"layer {names[0]!r}" if len(names) == 1 else
           f"layers {names}" if names else f"body {module.body.name!r}")
  warnings.warn(
      f"No gradient flows through {where} of module {k + 1} "
      f"({module.name!r}), e.g. a tf.numpy_function without a gradient: "
      f"its input gets no cotangent, so it sends zero to module {k} and "
      f"the layers below that point get no gradient from the losses above "
      f"it (as Keras, which warns that such variables get no gradient).",
      stacklevel=2)
