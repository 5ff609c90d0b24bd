"""A small Vision Transformer built as keras.io's ViT example builds one.

keras.io/examples/vision/image_classification_with_vision_transformer:
an adapted `Normalization` and random augmentation in a nested
`data_augmentation` Sequential, the user's own `Patches` and `PatchEncoder`
layers (the encoder owns a Dense and an Embedding), pre-LN blocks of
`MultiHeadAttention` and an MLP, then Flatten and an MLP head. Here tiny:
8x8x1 images, 4x4 patches, a few blocks of width 8, so a test trains it in
seconds.
"""

import keras
import numpy as np
import tensorflow as tf

SIZE, PATCH, WIDTH, CLASSES = 8, 4, 8, 10
NUM_PATCHES = (SIZE // PATCH) ** 2


class Patches(keras.layers.Layer):
  """Cuts images into flattened PATCH x PATCH patches (unregistered)."""

  def __init__(self, patch_size, **kwargs):
    super().__init__(**kwargs)
    self.patch_size = patch_size

  def call(self, images):
    patches = keras.ops.image.extract_patches(images, size=self.patch_size)
    shape = keras.ops.shape(patches)
    return keras.ops.reshape(patches, (shape[0], shape[1] * shape[2],
                                       shape[3]))

  def get_config(self):
    return {**super().get_config(), "patch_size": self.patch_size}


class PatchEncoder(keras.layers.Layer):
  """Projects patches and adds learned positions: a layer owning layers."""

  def __init__(self, num_patches, projection_dim, **kwargs):
    super().__init__(**kwargs)
    self.num_patches = num_patches
    self.projection_dim = projection_dim
    self.projection = keras.layers.Dense(projection_dim)
    self.position_embedding = keras.layers.Embedding(num_patches,
                                                     projection_dim)

  def call(self, patch):
    positions = keras.ops.expand_dims(keras.ops.arange(self.num_patches), 0)
    return self.projection(patch) + self.position_embedding(positions)

  def get_config(self):
    return {**super().get_config(), "num_patches": self.num_patches,
            "projection_dim": self.projection_dim}


def images(num=64, seed=0):
  """Random images with mean 3 and scale 2 (far from Normalization's
  defaults, so a lost adaptation shows) and random labels."""
  rng = np.random.default_rng(seed)
  x = (3.0 + 2.0 * rng.normal(size=(num, SIZE, SIZE, 1))).astype("float32")
  return x, rng.integers(0, CLASSES, size=num).astype("int32")


def vit(blocks=2, seed=0, augment=True, adapt_on=None):
  """The ViT; its Normalization adapted on `adapt_on` (default `images()`).

  Args:
    blocks: transformer blocks.
    seed: Keras's random seed for the weights.
    augment: include RandomFlip and RandomRotation, as keras.io does.
    adapt_on: images to adapt the Normalization on.
  """
  keras.utils.set_random_seed(seed)
  steps = [keras.layers.Normalization(name="normalization")]
  if augment:
    steps += [keras.layers.RandomFlip("horizontal"),
              keras.layers.RandomRotation(0.02)]
  data_augmentation = keras.Sequential(steps, name="data_augmentation")
  data_augmentation.layers[0].adapt(images()[0] if adapt_on is None
                                    else adapt_on)
  inputs = keras.Input((SIZE, SIZE, 1))
  h = PatchEncoder(NUM_PATCHES, WIDTH, name="patch_encoder")(
      Patches(PATCH)(data_augmentation(inputs)))
  for i in range(blocks):
    a = keras.layers.LayerNormalization(epsilon=1e-6)(h)
    a = keras.layers.MultiHeadAttention(2, WIDTH, dropout=0.1,
                                        name=f"attention_{i}")(a, a)
    h2 = keras.layers.Add()([a, h])
    m = keras.layers.LayerNormalization(epsilon=1e-6)(h2)
    m = keras.layers.Dense(2 * WIDTH, activation="gelu")(m)
    m = keras.layers.Dense(WIDTH, activation="gelu")(m)
    h = keras.layers.Add()([m, h2])
  h = keras.layers.Flatten()(keras.layers.LayerNormalization(epsilon=1e-6)(h))
  h = keras.layers.Dense(16, activation="gelu", name="head")(
      keras.layers.Dropout(0.5)(h))
  return keras.Model(inputs, keras.layers.Dense(CLASSES, name="logits")(h),
                     name="vit")


class Scaled(keras.layers.Layer):
  """Multiplies by a non-trainable variable set after build: a user's
  layer whose state is not a trainable weight (unregistered)."""

  def build(self, input_shape):
    self.scale = self.add_weight(shape=(), initializer="ones",
                                 trainable=False, name="scale")

  def call(self, inputs):
    return inputs * self.scale


def small_cnn(seed=0, augment=False):
  """keras.io-style CNN: adapted Normalization, conv blocks with BN whose
  moving statistics are not their initial values, a user's layer with a
  non-trainable variable, a nested Sequential block."""
  keras.utils.set_random_seed(seed)
  norm = keras.layers.Normalization(name="normalization")
  norm.adapt(images()[0])
  inputs = keras.Input((SIZE, SIZE, 1))
  h = norm(inputs)
  if augment:
    h = keras.layers.RandomRotation(0.05)(keras.layers.RandomFlip()(h))
  h = keras.layers.ReLU()(keras.layers.BatchNormalization()(
      keras.layers.Conv2D(4, 3, padding="same")(h)))
  block = keras.Sequential([
      keras.layers.Conv2D(8, 3, strides=2, padding="same"),
      keras.layers.BatchNormalization(), keras.layers.ReLU()], name="block")
  h = block(h)
  h = Scaled(name="scaled")(h)
  h = keras.layers.ReLU()(keras.layers.Conv2D(8, 3, padding="same")(h))
  h = keras.layers.GlobalAveragePooling2D()(h)
  model = keras.Model(inputs, keras.layers.Dense(CLASSES)(h), name="cnn")
  for layer in [layer for layer in model.layers + block.layers
                if isinstance(layer, keras.layers.BatchNormalization)]:
    layer.moving_mean.assign(np.full(layer.moving_mean.shape, 0.5))
    layer.moving_variance.assign(np.full(layer.moving_variance.shape, 2.0))
  model.get_layer("scaled").scale.assign(3.0)
  return model


WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen"]


def tokens(num=64, length=4, seed=0):
  """Sentences of `length` words, and the class of the first word."""
  rng = np.random.default_rng(seed)
  index = rng.integers(0, len(WORDS), size=(num, length))
  return np.array(WORDS)[index], (index[:, 0] % CLASSES).astype("int32")


def text_model(kind, seed=0):
  """A small classifier of word tokens whose first layer was adapted.

  Args:
    kind: "string_lookup" ([batch, 4] words), "text_vectorization"
      ([batch, 1] sentences), "integer_lookup" ([batch, 4] word ids) or
      "discretization" ([batch, 4] floats).
    seed: Keras's random seed for the weights.
  """
  keras.utils.set_random_seed(seed)
  words, _ = tokens()
  if kind == "string_lookup":
    first = keras.layers.StringLookup(name=kind)
    first.adapt(words[:40])  # some words stay out of the vocabulary
    inputs = keras.Input((4,), dtype="string")
  elif kind == "text_vectorization":
    first = keras.layers.TextVectorization(
        max_tokens=6, output_sequence_length=4, name=kind)
    first.adapt([" ".join(w) for w in words])
    inputs = keras.Input((1,), dtype="string")
  elif kind == "integer_lookup":
    first = keras.layers.IntegerLookup(name=kind)
    first.adapt(np.arange(3, 9))
    inputs = keras.Input((4,), dtype="int64")
  else:
    first = keras.layers.Discretization(num_bins=5, name=kind)
    first.adapt(np.random.default_rng(1).normal(size=(64, 4)))
    inputs = keras.Input((4,))
  h = keras.layers.Embedding(16, 8)(first(inputs))
  h = keras.layers.Flatten()(h)
  h = keras.layers.Dense(16, activation="relu")(h)
  h = keras.layers.Dense(16, activation="relu")(h)
  return keras.Model(inputs, keras.layers.Dense(CLASSES)(h), name=kind)


def text_inputs(kind):
  """Inputs for `text_model(kind)` (64 examples) and their labels."""
  words, labels = tokens(seed=1)
  # Keras's predict takes strings as a tf.Tensor (not numpy's str dtype).
  if kind == "string_lookup":
    return tf.constant(words), labels
  if kind == "text_vectorization":
    return tf.constant([[" ".join(w)] for w in words]), labels
  index = np.searchsorted(np.array(WORDS), words)
  if kind == "integer_lookup":
    return index.astype("int64"), labels
  return (index - 3.5).astype("float32") / 2, labels
