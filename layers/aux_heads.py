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

The kinds a caller names (`aux_head="authors"`) live in one registry here,
`KINDS`: the ResNets (`resnet.resnet_modules`), `tf_interlock.from_keras`,
the binaries' `--aux_head`, the user study and the benchmark all take its
names, build through `make_aux_head` and list `names()` when refusing one.
A new kind is a builder and one `register` call below.
"""

import dataclasses
from typing import Callable

import keras
from keras import ops

from layers import common
from layers.common import batch_norm, conv2d, track_as_attributes

# Conv widths of the auxiliary heads in the authors' released ResNet code.
AUTHORS_FILTERS = (128, 64)


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
    self.synchronized_bn = common.check_bool("synchronized_bn",
                                             synchronized_bn)
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
  """Builds a `ConvAuxHead` from a conv kind's name or a list of conv widths.

  Args:
    kind: "authors" or "pool" (`KINDS`), or a sequence of conv widths.
    num_classes: number of output logits.
    synchronized_bn: passed to `ConvAuxHead`.
    name: optional layer name.

  Returns:
    An unbuilt `ConvAuxHead`.
  """
  if isinstance(kind, str):
    return make_aux_head(kind, num_classes, IMAGE_FEATURES,
                         synchronized_bn=synchronized_bn, name=name,
                         conv_only=True)
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
    self.use_bias = common.check_bool("use_bias", use_bias)
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


# The shape `make_aux_head` assumes when a caller knows only that module k
# outputs image feature maps [B, H, W, C] (a ResNet's blocks).
IMAGE_FEATURES = (None, None, None, None)


@dataclasses.dataclass(frozen=True)
class AuxHeadKind:
  """One kind of aux head a caller may name.

  Attributes:
    name: what `aux_head=` takes ("authors").
    description: a few words, listed in errors, flag help and docs.
    build: `build(num_classes, shape, activation=..., output_shape=...,
      synchronized_bn=..., name=...)` -> an unbuilt Keras layer, or None
      for no aux head; `shape` is module k's output shape, batch axis
      first; `activation` that of the network's output layer (None:
      logits), `output_shape` the network's output shape.
    conv: True when `build` makes a `ConvAuxHead` (its `flops` counts the
      head's cost, which the ResNet's balanced split adds to each module).
  """
  name: str
  description: str
  build: Callable
  conv: bool = False


KINDS = {}


def register(kind):
  """Adds `kind` (an `AuxHeadKind`) to `KINDS`, under `kind.name`."""
  if kind.name in KINDS:
    raise ValueError(f"An aux head kind named {kind.name!r} is registered "
                     f"already. Received: kind.name={kind.name!r}")
  KINDS[kind.name] = kind
  return kind


def unregister(name):
  """Removes the kind registered as `name` (a test's, or a user's)."""
  KINDS.pop(name, None)


def names(conv_only=False):
  """The registered kinds' names, in registration order."""
  return [name for name, kind in KINDS.items() if kind.conv or not conv_only]


def describe():
  """"name (description), ..." of every kind, for help texts."""
  return ", ".join(f"{kind.name} ({kind.description})"
                   for kind in KINDS.values())


def check_kind(kind, conv_only=False, also=""):
  """Raises ValueError unless `kind` names a registered kind.

  Args:
    kind: the name given.
    conv_only: only the kinds that build a `ConvAuxHead` count.
    also: what else the caller takes, e.g. " or a list of conv widths".
  """
  allowed = names(conv_only)
  if not isinstance(kind, str) or kind not in allowed:
    raise ValueError(f"aux_head must be one of {allowed}{also}. Received: "
                     f"aux_head={kind!r}")


def make_aux_head(kind, num_classes, shape, *, activation=None,
                  output_shape=(), synchronized_bn=True, name=None,
                  conv_only=False):
  """Module k's aux head of a registered kind, unbuilt (None for "none").

  Args:
    kind: a name in `names()`.
    num_classes: the head's outputs.
    shape: the features' shape, batch axis included (`IMAGE_FEATURES` when
      only their rank is known).
    activation: the network output layer's activation, which a "linear"
      head ends with so that one loss fits every exit; None for logits.
    output_shape: the network's output shape (a per-position output makes
      the "linear" head per position).
    synchronized_bn: whether a conv head's BatchNormalization all-reduces
      its statistics over replicas (`common.batch_norm`).
    name: the layer's name.
    conv_only: refuse the kinds that build no `ConvAuxHead`.
  """
  check_kind(kind, conv_only,
             " or a list of conv widths" if conv_only else "")
  return KINDS[kind].build(num_classes, tuple(shape), activation=activation,
                           output_shape=tuple(output_shape),
                           synchronized_bn=synchronized_bn, name=name)


def _conv_builder(kind, filters):
  def build(num_classes, shape, *, activation, output_shape,
            synchronized_bn, name):
    del activation, output_shape  # logits, as the ResNets' own output
    if len(shape) != 4:
      raise ValueError(
          f"aux_head={kind!r} needs image features [B, H, W, C]; "
          f"{name or 'the head'} would read features of shape {shape}. "
          f"Received: aux_head={kind!r}")
    return ConvAuxHead(num_classes, filters=filters,
                       synchronized_bn=synchronized_bn, name=name)
  return build


def per_position(shape, output_shape):
  """True when features of `shape` and the network's output share every axis
  but the last (batch, then positions): a head then predicts each position.
  """
  return (len(output_shape) > 2 and len(shape) == len(output_shape) and
          tuple(shape[1:-1]) == tuple(output_shape[1:-1]))


def _linear(num_classes, shape, *, activation, output_shape,
            synchronized_bn, name):
  """One dense layer on the (spatially averaged, or flattened) features,
  ending with the network output's activation so that one loss fits all.
  When the network's output is per position (`per_position`, e.g. a
  language model's [B, T, V] logits), LayerNormalization then one dense
  layer at every position (`SequenceAuxHead`, the paper's LM head)."""
  del synchronized_bn  # no BatchNormalization
  if per_position(shape, output_shape):
    if activation in (None, "linear"):
      return SequenceAuxHead(num_classes, name=name)
    return keras.Sequential(
        [SequenceAuxHead(num_classes), keras.layers.Activation(activation)],
        name=name)
  head = []
  if len(shape) == 4:
    head.append(keras.layers.GlobalAveragePooling2D())
  elif len(shape) > 2:
    head.append(keras.layers.Flatten())
  head.append(keras.layers.Dense(num_classes, activation=activation))
  return keras.Sequential(head, name=name)


register(AuxHeadKind("authors", "conv 128 -> conv 64 -> pool -> dense; "
                     "image features",
                     _conv_builder("authors", AUTHORS_FILTERS), conv=True))
register(AuxHeadKind("pool", "pool -> dense; image features",
                     _conv_builder("pool", ()), conv=True))
register(AuxHeadKind("linear", "(pool or flatten) -> dense with the output's "
                     "activation; LayerNorm -> dense per position for a "
                     "per-position output; any features", _linear))
register(AuxHeadKind("none", "no aux heads; only e2e trains them",
                     lambda num_classes, shape, **unused: None))
