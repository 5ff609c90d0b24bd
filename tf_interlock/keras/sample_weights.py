"""`fit`'s sample weights on every module's loss, as Keras weighs them.

A weight is given per example ([batch]) or per label position ([batch, T],
what keras_hub's preprocessors give to mask padding: `sample_weight=
padding_mask`). Keras multiplies the loss's unreduced values by the
weights (a trailing axis of size 1 squeezed) and divides the sum by the
number of values (reduction "sum_over_batch_size"): sum(w * loss) / (B * T)
for a per-token loss. Every module's loss L_k here is the same: each
position's loss is weighed before the mean over positions, and the engine
then averages over the *global* batch, so a padded position counts in no
module's loss (the aux heads' per-position losses included).

Shapes that cannot weigh the loss are refused in one line naming
`sample_weight` and both shapes: `check_arrays` before `fit` reads a batch
(array weights against array labels), `weighted` when a step is traced
(a dataset's weights, or weights per position for a loss that gives one
value per example). A loss that cannot take the labels with a module's
outputs is refused the same way, naming `loss`.
"""

import numpy as np
import tensorflow as tf

from tf_interlock import losses


def example_shape(shape):
  """A shape with its batch axis written as `batch`, for messages."""
  rest = list(shape)[1:]
  return "(batch" + ("".join(f", {d}" for d in rest) if rest else ",") + ")"


def check_arrays(sample_weight, y):
  """Raises unless array weights fit array labels: [B], [B, 1], or the
  labels' leading axes ([B, T] for labels [B, T] or [B, T, classes]).

  Args:
    sample_weight: `fit`'s argument (an array or None).
    y: `fit`'s labels (an array, or anything else, which is not checked).
  """
  if sample_weight is None or not hasattr(y, "shape"):
    return
  weights, labels = np.shape(sample_weight)[1:], np.shape(y)[1:]
  if weights in ((), (1,)) or tuple(labels[:len(weights)]) == weights:
    return
  raise ValueError(
      f"sample_weight needs one weight per example (shape (batch,)) or one "
      f"per label position (the labels' leading axes: shape "
      f"{example_shape(np.shape(y)[:2])}). Received: sample_weight.shape="
      f"{np.shape(sample_weight)} for y.shape={np.shape(y)}")


def broadcasts(weights_shape, values_shape):
  """True unless static shapes say that weights of `weights_shape` cannot
  multiply values of `values_shape` (same rank; each axis equal, of size
  1, or unknown)."""
  if weights_shape.rank is None or values_shape.rank is None:
    return True
  return weights_shape.rank == values_shape.rank and all(
      w in (None, 1) or v is None or w == v
      for w, v in zip(weights_shape.as_list(), values_shape.as_list()))


def _fitted(weights, values):
  """`weights` shaped to multiply `values`, the loss's unreduced values
  (Keras's rule: a trailing axis of size 1 squeezed, then equal axes or
  axes of size 1, which broadcast: (batch, 1) weighs every position)."""
  if (weights.shape.rank is not None and values.shape.rank is not None and
      weights.shape.rank == values.shape.rank + 1 and weights.shape[-1] == 1):
    weights = tf.squeeze(weights, -1)
  if not broadcasts(weights.shape, values.shape):
    what = ("one value per example" if values.shape.rank == 1 else
            f"one value per position, shape {example_shape(values.shape)}")
    raise ValueError(
        f"sample_weight of shape {example_shape(weights.shape)} cannot "
        f"weigh the loss, which gives {what}: pass one weight per example "
        f"(batch,) or, for a loss per position (a keras.losses.Loss or "
        f"the default), one per label position. Received: "
        f"sample_weight.shape={example_shape(weights.shape)}")
  return tf.cast(weights, values.dtype)


def _shapes(nest):
  """A tensor's shape as `example_shape` writes it; a nest's, each."""
  shapes = [example_shape(getattr(t, "shape", ()))
            for t in tf.nest.flatten(nest)]
  return shapes[0] if len(shapes) == 1 else "[" + ", ".join(shapes) + "]"


def _checked_call(loss_fn, labels, logits, loss_name):
  """`loss_fn(labels, logits)`, a shape mismatch told in one line."""
  try:
    return loss_fn(labels, logits)
  except ValueError as e:
    if not any(word in str(e) for word in ("hape", "imension", "rank")):
      raise
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    raise ValueError(
        f"The loss cannot take labels of shape {_shapes(labels)} with "
        f"outputs of shape {_shapes(logits)} ({first}); pass a loss that "
        f"matches the model's outputs, or labels of the shape it needs. "
        f"Received: loss={loss_name}, y.shape={_shapes(labels)}") from e


def loss_name(loss):
  """How a message names compile's `loss` (None: the generic default)."""
  if loss is None:
    return "sparse_softmax_cross_entropy (the default)"
  if isinstance(loss, str):
    return repr(loss)
  return getattr(loss, "__name__", type(loss).__name__)


def weighted(loss_fn, loss=None):
  """`loss_fn` that also takes labels `(y, sample_weight)`.

  Args:
    loss_fn: `losses.per_example_loss`'s callable (with `per_position`).
    loss: what compile was given (or resolved), for messages.

  Returns:
    `(labels, logits) -> [B]`: the per-example loss for plain labels;
    for `(y, sample_weight)` the mean over positions of w * loss, with
    per-example weights w * loss(y), so that the engine's mean over the
    global batch is Keras's sum(w * loss) / (B * T).
  """
  name = loss_name(loss)

  def loss_with_weights(labels, logits):
    if not isinstance(labels, tuple):
      return _checked_call(loss_fn, labels, logits, name)
    y, sample_weight = labels
    sample_weight = tf.convert_to_tensor(sample_weight)
    per_position = (sample_weight.shape.rank is None or
                    sample_weight.shape.rank > 1)
    values = _checked_call(
        loss_fn.per_position if per_position else loss_fn, y, logits, name)
    return losses.mean_over_non_batch_axes(
        values * _fitted(sample_weight, values))
  return loss_with_weights
