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
  for _ in range(blocks):
    a = keras.layers.LayerNormalization(epsilon=1e-6)(h)
    a = keras.layers.MultiHeadAttention(2, WIDTH, dropout=0.1)(a, a)
    h2 = keras.layers.Add()([a, h])
    m = keras.layers.LayerNormalization(epsilon=1e-6)(h2)
    m = keras.layers.Dense(2 * WIDTH, activation="gelu")(m)
    m = keras.layers.Dense(WIDTH, activation="gelu")(m)
    h = keras.layers.Add()([m, h2])
  h = keras.layers.Flatten()(keras.layers.LayerNormalization(epsilon=1e-6)(h))
  h = keras.layers.Dense(16, activation="gelu")(keras.layers.Dropout(0.5)(h))
  return keras.Model(inputs, keras.layers.Dense(CLASSES)(h), name="vit")
