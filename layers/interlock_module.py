"""`InterlockModule`: one depthwise module of an interlocking network.

A network split depthwise into K modules M_1..M_K (Gomez et al., 2022,
arXiv:2010.04116, Sec. 3) is a stack of these layers. Each wraps

* a *body*: the module's main layers (weights theta_k), and
* an optional *auxiliary head* A_k (weights phi_k) that predicts the task
  from the module's output h_k, giving the local loss L_k.

The module's input is cut with `tf.stop_gradient`: no gradient ever crosses a
module boundary implicitly. The training engine (`tf_interlock.engine`) moves
gradients between modules only as explicit cotangents, which is what lets
each module run on its own core.
"""

import keras

from layers import boundary


def _as_layer(body, name):
  """Turns a layer, a model or a list of layers into one Keras layer."""
  if isinstance(body, (list, tuple)):
    if not body:
      raise ValueError(
          f"An InterlockModule needs at least one layer in its body. "
          f"Received: body={body!r}")
    return keras.Sequential(list(body), name=name)
  if not isinstance(body, keras.layers.Layer):
    raise TypeError(
        "The body must be a Keras layer, a Keras model or a list of Keras "
        f"layers. Received: body={body!r}")
  return body


@keras.saving.register_keras_serializable(package="tf_interlock")
class InterlockModule(keras.layers.Layer):
  """A module group with an optional auxiliary head and a gradient cut.

  Args:
    body: a Keras layer, a Keras model, or a list of Keras layers (wrapped in
      a `keras.Sequential`): the module's main computation, h_k = M_k(h_{k-1}).
    aux_head: optional Keras layer mapping h_k to task logits (the auxiliary
      head A_k). The last module of a network usually has none: its body ends
      with the model's own output head.
    **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

  Call arguments:
    inputs: the previous module's output h_{k-1} (or the network input):
      one tensor, or a nest whose integer and boolean leaves (masks, ids)
      ride along without gradients (`layers.boundary`).
    training: Python bool, passed to the body and the head.

  Returns:
    `h_k`, the body's output, whether or not there is an aux head (one
    return type): the head's logits are `aux_logits(h_k)`, and
    `tf_interlock.exits` yields every module's output and exit logits.
  """

  def __init__(self, body, aux_head=None, **kwargs):
    super().__init__(**kwargs)
    self.body = _as_layer(body, name=f"{self.name}_body")
    if aux_head is not None and not isinstance(aux_head, keras.layers.Layer):
      raise TypeError(
          f"aux_head must be a Keras layer or None. Received: "
          f"aux_head={aux_head!r}")
    self.aux_head = aux_head

  @property
  def has_aux_head(self):
    return self.aux_head is not None

  @property
  def layer_names(self):
    """The names of the body's layers in depth order (e.g. where
    `from_keras` cut: the first and last name are the module's bounds)."""
    names = getattr(self.body, "layer_names", None)
    if names is not None:
      return list(names)
    inner = getattr(self.body, "layers", None)
    if inner is not None:
      return [layer.name for layer in inner
              if not isinstance(layer, keras.layers.InputLayer)]
    return [self.body.name]

  def build(self, input_shape):
    if not self.body.built:
      self.body.build(input_shape)
    if self.aux_head is not None and not self.aux_head.built:
      self.aux_head.build(boundary.primary_shape(
          self.body.compute_output_shape(input_shape)))

  def forward(self, inputs, training=False):
    """h_k = M_k(stop_gradient(h_{k-1})): the body alone, input cut."""
    return self.body(boundary.cut(inputs), training=training)

  def aux_logits(self, outputs, training=False):
    """A_k(h_k): the auxiliary head's logits for this module's output (its
    primary tensor when the output is a nest, `layers.boundary`)."""
    if self.aux_head is None:
      raise ValueError(f"Module {self.name!r} has no auxiliary head.")
    return self.aux_head(boundary.primary(outputs), training=training)

  def call(self, inputs, training=False):
    return self.forward(inputs, training=training)

  def compute_output_shape(self, input_shape):
    return self.body.compute_output_shape(input_shape)

  def get_config(self):
    config = super().get_config()
    config["body"] = keras.saving.serialize_keras_object(self.body)
    config["aux_head"] = (None if self.aux_head is None else
                          keras.saving.serialize_keras_object(self.aux_head))
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    config["body"] = keras.saving.deserialize_keras_object(config["body"])
    if config.get("aux_head") is not None:
      config["aux_head"] = keras.saving.deserialize_keras_object(
          config["aux_head"])
    return cls(**config)
