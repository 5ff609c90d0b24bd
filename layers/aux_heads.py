"""Auxiliary heads A_k: small networks predicting the task from h_k.

Interlocking backpropagation (Gomez et al., 2022, arXiv:2010.04116)
gives every module k < K a head A_k so that the module has a local loss
L_k = loss(A_k(h_k), y). Two families are used:

* `ConvAuxHead` for image feature maps [B, H, W, C]: optional 3x3 conv + BN +
  ReLU layers, global average pooling, then a dense classifier. The heads of
  the authors' released ResNet code are conv 128 -> conv 64 -> pool -> dense
  (`make_conv_aux_head("authors", ...)`); `filters=()` is the minimal
  pool + dense head, which is also a ResNet's own output head.
* `SequenceAuxHead` for language-model hidden states [B, T, d]: LayerNorm then
  a projection to vocabulary logits, optionally tied to an embedding matrix E
  (logits = LN(h) @ E^T, Press & Wolf, 2017). A pre-LN Transformer's own
  output head (final LayerNorm + projection) has exactly this form.
"""

import keras
from keras import ops

from layers.common import batch_norm, conv2d, track_as_attributes

# Conv widths of the auxiliary heads in the authors' released ResNet code.
AUTHORS_FILTERS = (128, 64)
CONV_AUX_HEAD_KINDS = {"authors": AUTHORS_FILTERS, "pool": ()}


@keras.saving.register_keras_serializable(package="tf_interlock")
class ConvAuxHead(keras.layers.Layer):
  """[conv 3x3 -> BN -> ReLU]* -> global average pool -> dense logits.

  Args:
    num_classes: number of output logits.
    filters: sequence of conv widths, one 3x3 conv + BN + ReLU each; `()`
      gives the minimal pool + dense head.
    synchronized_bn: use synchronized BatchNormalization (see
      `common.batch_norm`).
    **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

  Call arguments:
    inputs: feature map [B, H, W, C].
    training: Python bool, BN uses batch statistics when True.

  Returns:
    Logits [B, num_classes].
  """

  def __init__(self, num_classes, filters=AUTHORS_FILTERS,
               synchronized_bn=True, **kwargs):
    super().__init__(**kwargs)
    if int(num_classes) < 1:
      raise ValueError(
          f"num_classes must be a positive int. Received: "
          f"num_classes={num_classes!r}")
    self.num_classes = int(num_classes)
    self.filters = tuple(int(f) for f in filters)
    if any(f < 1 for f in self.filters):
      raise ValueError(
          f"filters must be positive ints. Received: filters={filters!r}")
    self.synchronized_bn = bool(synchronized_bn)
    self.convs = [conv2d(f, 3, dtype=self.dtype_policy, name=f"conv{i + 1}")
                  for i, f in enumerate(self.filters)]
    self.norms = [batch_norm(self.synchronized_bn, dtype=self.dtype_policy,
                             name=f"bn{i + 1}")
                  for i in range(len(self.filters))]
    track_as_attributes(self, self.convs + self.norms)
    self.classifier = keras.layers.Dense(
        self.num_classes, dtype=self.dtype_policy, name="classifier")

  def build(self, input_shape):
    shape = tuple(input_shape)
    for conv, norm in zip(self.convs, self.norms):
      conv.build(shape)
      shape = conv.compute_output_shape(shape)
      norm.build(shape)
    self.classifier.build((shape[0], shape[-1]))

  def call(self, inputs, training=False):
    x = inputs
    for conv, norm in zip(self.convs, self.norms):
      x = ops.relu(norm(conv(x), training=training))
    return self.classifier(ops.mean(x, axis=(1, 2)))

  def compute_output_shape(self, input_shape):
    return (input_shape[0], self.num_classes)

  def flops(self, input_shape):
    """FLOPs (2 x multiply-adds) of one example with input shape (H, W, C)."""
    height, width, channels = input_shape[-3:]
    total = 0
    for f in self.filters:
      total += 2 * height * width * 9 * channels * f
      channels = f
    return total + 2 * channels * self.num_classes

  def get_config(self):
    config = super().get_config()
    config.update(num_classes=self.num_classes, filters=list(self.filters),
                  synchronized_bn=self.synchronized_bn)
    return config


def make_conv_aux_head(kind, num_classes, *, synchronized_bn=True, name=None):
  """Builds a `ConvAuxHead` from a preset name or a list of conv widths.

  Args:
    kind: "authors" (conv 128, conv 64, as the authors' released code),
      "pool" (pool + dense only), or a sequence of conv widths.
    num_classes: number of output logits.
    synchronized_bn: passed to `ConvAuxHead`.
    name: optional layer name.

  Returns:
    An unbuilt `ConvAuxHead`.
  """
  if isinstance(kind, str):
    if kind not in CONV_AUX_HEAD_KINDS:
      raise ValueError(
          f"aux_head must be one of {sorted(CONV_AUX_HEAD_KINDS)} or a list "
          f"of conv widths. Received: aux_head={kind!r}")
    kind = CONV_AUX_HEAD_KINDS[kind]
  return ConvAuxHead(num_classes, filters=kind,
                     synchronized_bn=synchronized_bn, name=name)


@keras.saving.register_keras_serializable(package="tf_interlock")
class SequenceAuxHead(keras.layers.Layer):
  """LayerNorm -> projection to vocabulary logits, optionally tied.

  With `tie_to`, the projection reuses the embedding matrix E [V, d] of
  another layer: logits = LN(h) @ E^T (+ bias). E is then one of this head's
  weights too, so whoever trains the head also moves E: in interlocking
  training both the module owning the embedding and the module owning this
  head update it (end-to-end with plain SGD at one learning rate, the two
  updates add up to the usual tied-weights update).

  A tied head refers to a variable it does not own, which a config cannot
  express: `get_config` raises for it. Save tied models with
  `tf.train.Checkpoint` (which keeps shared variables shared) and rebuild
  them in code.

  Args:
    vocab_size: number of output logits V.
    tie_to: optional `keras.layers.Embedding` (built on demand), other built
      layer with an `embeddings` variable [V, d], or `keras.Variable` [V, d].
    use_bias: add a learned bias to the logits.
    epsilon: LayerNormalization epsilon.
    **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

  Call arguments:
    inputs: hidden states [B, T, d] (any rank >= 2; the last axis is d).
    training: Python bool (unused: no dropout or batch statistics).

  Returns:
    Logits [B, T, V].
  """

  def __init__(self, vocab_size, tie_to=None, use_bias=True, epsilon=1e-5,
               **kwargs):
    super().__init__(**kwargs)
    if int(vocab_size) < 1:
      raise ValueError(
          f"vocab_size must be a positive int. Received: "
          f"vocab_size={vocab_size!r}")
    if tie_to is not None and not isinstance(
        tie_to, (keras.Variable, keras.layers.Layer)):
      raise TypeError(
          f"tie_to must be None, a keras.Variable or a Keras layer with an "
          f"`embeddings` variable. Received: tie_to={tie_to!r}")
    self.vocab_size = int(vocab_size)
    self.tie_to = tie_to
    self.use_bias = bool(use_bias)
    self.epsilon = float(epsilon)
    self.norm = keras.layers.LayerNormalization(
        epsilon=self.epsilon, dtype=self.dtype_policy, name="norm")
    self.projection = None
    self.bias = None
    if tie_to is None:
      self.projection = keras.layers.Dense(
          self.vocab_size, use_bias=self.use_bias, dtype=self.dtype_policy,
          name="projection")

  @property
  def tied(self):
    return self.tie_to is not None

  @property
  def tied_embeddings(self):
    """The shared [V, d] matrix, or None for an untied head."""
    if isinstance(self.tie_to, keras.layers.Layer):
      return self.tie_to.embeddings
    return self.tie_to

  def build(self, input_shape):
    self.norm.build(input_shape)
    if not self.tied:
      self.projection.build(input_shape)
      return
    if (isinstance(self.tie_to, keras.layers.Embedding) and
        not self.tie_to.built):
      self.tie_to.build()
    if (isinstance(self.tie_to, keras.layers.Layer) and
        not hasattr(self.tie_to, "embeddings")):
      raise TypeError(
          f"A tie_to layer must be a keras.layers.Embedding or a built layer "
          f"with an `embeddings` variable. Received: tie_to={self.tie_to!r}")
    expected = (self.vocab_size, input_shape[-1])
    if tuple(self.tied_embeddings.shape) != expected:
      raise ValueError(
          f"The tied embedding matrix must have shape {expected} "
          f"(vocab_size, hidden size). Received: "
          f"tie_to.shape={tuple(self.tied_embeddings.shape)}")
    self.bias = (self.add_weight(shape=(self.vocab_size,), initializer="zeros",
                                 name="bias") if self.use_bias else None)

  def call(self, inputs, training=False):
    h = self.norm(inputs)
    if not self.tied:
      return self.projection(h)
    # logits[..., v] = <h, E_v>: the transpose of the embedding lookup.
    embeddings = ops.cast(self.tied_embeddings, self.compute_dtype)
    logits = ops.einsum("...d,vd->...v", h, embeddings)
    if self.bias is not None:
      logits = logits + ops.cast(self.bias, self.compute_dtype)
    return logits

  def compute_output_shape(self, input_shape):
    return tuple(input_shape[:-1]) + (self.vocab_size,)

  def flops(self, input_shape):
    """FLOPs (2 x multiply-adds) of one sequence with input shape (T, d):
    the [T, d] x [d, V] projection."""
    seq_len, d_model = input_shape[-2:]
    return 2 * seq_len * d_model * self.vocab_size

  def get_config(self):
    if self.tied:
      raise ValueError(
          f"A SequenceAuxHead tied to another layer's embedding matrix cannot "
          f"be serialized on its own (the tie would be lost on reload); save "
          f"it with tf.train.Checkpoint and rebuild it in code. Received: "
          f"tie_to={getattr(self.tie_to, 'name', self.tie_to)!r}")
    config = super().get_config()
    config.update(vocab_size=self.vocab_size, use_bias=self.use_bias,
                  epsilon=self.epsilon)
    return config
