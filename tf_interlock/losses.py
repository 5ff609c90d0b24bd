"""Per-example losses and metrics for the interlocking training engine.

Every module's loss L_k (the true loss for the last module, the auxiliary
loss for the others; Gomez et al., 2022, arXiv:2010.04116) is a
per-example cross-entropy. The functions here return one value per example,
shape [B], and leave the batch reduction to the engine: under a distribution
strategy the batch mean must divide by the *global* batch size
(`tf.nn.compute_average_loss`), which only the engine knows.

Logits may come from a `mixed_bfloat16` model. bfloat16 keeps about three
significant digits, too few for a log-sum-exp over a large vocabulary, so the
softmax is always computed in float32.
"""

import copy

import keras
import tensorflow as tf


def _check_ranks(labels, logits):
  """Checks that logits carry exactly one more (class) axis than labels."""
  if labels.shape.rank is not None and logits.shape.rank is not None:
    if logits.shape.rank != labels.shape.rank + 1:
      raise ValueError(
          f"logits must have one more axis (the classes) than labels, whose "
          f"shape is {labels.shape}. Received: logits.shape={logits.shape}")
    if labels.shape.rank < 1:
      raise ValueError(
          f"labels must have a batch axis. Received: "
          f"labels.shape={labels.shape}")


def _mean_over_non_batch_axes(values):
  """Means [B, ...] down to [B] (e.g. over sequence positions)."""
  rank = values.shape.rank
  if rank == 1:
    return values
  axes = tf.range(1, tf.rank(values)) if rank is None else list(range(1, rank))
  return tf.reduce_mean(values, axis=axes)


mean_over_non_batch_axes = _mean_over_non_batch_axes


def _own_tensor(logits):
  """`logits` as new tensors that the loss must read through.

  Keras's probabilistic losses given a softmax or sigmoid output
  (`from_logits=False`) read the logits *before* the activation instead
  (the output's `_keras_logits`, or the Softmax op's input), for a stable
  log. The engine differentiates each loss with respect to the module's
  output (its cotangent), which such a loss never reads: the gradient
  would be None. Through an identity, the loss is computed from the
  output itself, -log(clip(p)), which has the same gradient.
  """
  return tf.nest.map_structure(tf.identity, logits)


def per_example_loss(loss_fn, name="loss_fn"):
  """Turns `loss_fn` into `f(labels, logits) -> per-example loss [B]`.

  A `keras.losses.Loss` reduces over the batch by default ("sum" or
  "sum_over_batch_size"), which would hide the batch from the engine: the
  engine must divide by the *global* batch. A copy with `reduction=None` is
  used instead, so any reduction the object was made with is handled alike;
  per-position losses ([B, T]) are averaged to one value per example.
  A Keras loss name is looked up first (`keras.losses.get`). A callable's
  values are averaged the same way (a [B] result is kept as is). The
  result's `per_position` gives the values before that mean (a callable's
  own `per_position`, if it has one: `sparse_softmax_cross_entropy`'s),
  which per-position sample weights weigh. The loss reads the logits
  through `_own_tensor`, so that a softmax output's loss has a gradient
  with respect to it.

  Args:
    loss_fn: a `keras.losses.Loss`, a Keras loss name, or a callable
      returning one loss per example (or per position).
    name: the argument's name, for error messages.

  Returns:
    A callable `(labels, logits) -> [B]`.

  Raises:
    ValueError: when `loss_fn` is none of these.
  """
  if isinstance(loss_fn, str):
    try:
      loss_fn = keras.losses.get(loss_fn)
    except ValueError as e:
      raise ValueError(f"Unknown loss name. Received: {name}={loss_fn!r}"
                       ) from e
  if isinstance(loss_fn, keras.losses.Loss):
    unreduced = copy.copy(loss_fn)
    unreduced.reduction = None

    def per_position(labels, logits):
      return tf.cast(unreduced(labels, _own_tensor(logits)), tf.float32)

    def per_example(labels, logits):
      return _mean_over_non_batch_axes(per_position(labels, logits))

    # Unreduced values, for sample weights per position (a padding mask).
    per_example.per_position = per_position
    return per_example
  if not callable(loss_fn):
    raise ValueError(
        f"{name} must be a keras.losses.Loss or a callable "
        f"(labels, logits) -> per-example loss [batch]. "
        f"Received: {name}={loss_fn!r}")

  # A callable that knows its unreduced values (ours below) gives them, so
  # that weights per position weigh each position; another's are its own.
  own = getattr(loss_fn, "per_position", None)

  def per_position_values(labels, logits):
    logits = _own_tensor(logits)
    if own is not None:
      return tf.convert_to_tensor(own(labels, logits))
    return tf.convert_to_tensor(loss_fn(labels, logits))

  def per_example_values(labels, logits):
    return _mean_over_non_batch_axes(per_position_values(labels, logits))

  per_example_values.per_position = per_position_values
  return per_example_values


def _sparse_softmax_cross_entropy_values(labels, logits):
  """The cross-entropy at every position: the labels' shape, float32."""
  labels = tf.convert_to_tensor(labels)
  logits = tf.convert_to_tensor(logits)
  _check_ranks(labels, logits)
  return tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=tf.cast(labels, tf.int32), logits=tf.cast(logits, tf.float32))


def sparse_softmax_cross_entropy(labels, logits):
  """Per-example softmax cross-entropy with integer labels.

  For a language model (labels [B, T], logits [B, T, V]) this is each
  sequence's mean next-token negative log-likelihood, so the batch mean of
  the result is the usual per-token loss when all sequences have length T.
  Its `per_position` attribute gives the values before that mean (labels'
  shape), which weights per position (`fit`'s per-token `sample_weight`)
  weigh.

  Args:
    labels: int tensor [B] or [B, T, ...] of class ids in [0, num_classes).
    logits: float tensor, the labels' shape plus a trailing class axis. Any
      float dtype; the computation runs in float32.

  Returns:
    float32 tensor [B]: the loss of each example, averaged over its
    non-batch axes.
  """
  return _mean_over_non_batch_axes(
      _sparse_softmax_cross_entropy_values(labels, logits))


sparse_softmax_cross_entropy.per_position = (
    _sparse_softmax_cross_entropy_values)


def _sparse_accuracy_values(labels, logits):
  """1.0/0.0 at every label position: [B] or [B, T, ...]."""
  labels = tf.convert_to_tensor(labels)
  logits = tf.convert_to_tensor(logits)
  _check_ranks(labels, logits)
  predictions = tf.argmax(tf.cast(logits, tf.float32), axis=-1,
                          output_type=tf.int64)
  return tf.cast(tf.equal(predictions, tf.cast(labels, tf.int64)),
                 tf.float32)


def sparse_accuracy(labels, logits):
  """Per-example top-1 accuracy with integer labels.

  Its `per_position` attribute gives the values before the mean over
  positions, which a weight per token weighs (`compile(weighted_metrics=
  ...)`).

  Args:
    labels: int tensor [B] or [B, T, ...] of class ids.
    logits: float tensor, the labels' shape plus a trailing class axis.

  Returns:
    float32 tensor [B]: 1.0/0.0 per example for [B] labels, or the fraction of
    correct positions for [B, T, ...] labels. Ties in the logits go to the
    lowest class id (the first maximum).
  """
  return _mean_over_non_batch_axes(_sparse_accuracy_values(labels, logits))


sparse_accuracy.per_position = _sparse_accuracy_values


def perplexity(mean_loss):
  """Perplexity exp(L) of a mean per-token cross-entropy L (in nats).

  Average the loss over tokens first, then exponentiate: the mean of
  per-batch perplexities is not the perplexity of the data.

  Args:
    mean_loss: scalar (or any shape) mean negative log-likelihood per token.

  Returns:
    float32 tensor of the same shape, exp(mean_loss).
  """
  return tf.exp(tf.cast(mean_loss, tf.float32))
