"""Small Keras models, as a user would bring them, for the from_keras tests."""

import keras
import numpy as np

from tf_interlock import keras_private
from tf_interlock import placement as placement_lib


def sequential_cnn(seed=0, size=28):
  """Conv-BN-ReLU x 3 for size x size x 1, with non-initial BN statistics."""
  keras.utils.set_random_seed(seed)
  model = keras.Sequential([keras.Input((size, size, 1))] + [
      layer for filters, strides in ((4, 1), (4, 2), (8, 2)) for layer in (
          keras.layers.Conv2D(filters, 3, strides=strides, padding="same"),
          keras.layers.BatchNormalization(), keras.layers.ReLU())] + [
              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
  # Moving statistics away from their initial values: they must carry over.
  for layer in model.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
      layer.moving_mean.assign(np.full(layer.moving_mean.shape, 0.5))
  return model


def residual_model(seed=0, blocks=3):
  """A functional ResNet-style model: a stem, residual blocks, a head."""
  keras.utils.set_random_seed(seed)
  inputs = keras.Input((8, 8, 3))
  h = keras.layers.Conv2D(8, 3, padding="same", name="stem")(inputs)
  for b in range(blocks):
    y = keras.layers.Conv2D(8, 3, padding="same", activation="relu",
                            name=f"b{b}_conv1")(h)
    y = keras.layers.Conv2D(8, 3, padding="same", name=f"b{b}_conv2")(y)
    h = keras.layers.ReLU(name=f"b{b}_out")(
        keras.layers.Add(name=f"b{b}_add")([h, y]))
  h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
  return keras.Model(inputs, keras.layers.Dense(5, name="logits")(h))


def assert_on_devices(trainer, placement):
  for k, (module, opt) in enumerate(zip(trainer.modules, trainer.optimizers)):
    variables = module.weights + opt.variables
    assert variables
    for v in variables:
      assert placement_lib.same_device(v.value.device, placement.devices[k]), (
          k, v.path, v.value.device)


def transfer_model(seed=0):
  """keras.io's transfer-learning shape: a small nested functional base
  ("small_base": conv-BN-ReLU x 3, its last block a nested Sequential
  "block3"), frozen as in phase 1, under a pooling and a Dense head.
  Input 8 x 8 x 3, 5 classes."""
  keras.utils.set_random_seed(seed)
  base_in = keras.Input((8, 8, 3))
  h = base_in
  for b, filters in ((1, 4), (2, 8)):
    h = keras.layers.Conv2D(filters, 3, padding="same", name=f"conv{b}")(h)
    h = keras.layers.BatchNormalization(name=f"bn{b}")(h)
    h = keras.layers.ReLU(name=f"relu{b}")(h)
  block3 = keras.Sequential([
      keras.layers.Conv2D(8, 3, padding="same", name="conv3"),
      keras.layers.BatchNormalization(name="bn3"),
      keras.layers.ReLU(name="relu3")], name="block3")
  base = keras.Model(base_in, block3(h), name="small_base")
  for layer in keras_private.flatten_layers(base):
    if isinstance(layer, keras.layers.BatchNormalization):
      layer.moving_mean.assign(np.full(layer.moving_mean.shape, 0.25))
  base.trainable = False
  inputs = keras.Input((8, 8, 3))
  h = base(inputs, training=False)
  h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
  return keras.Model(inputs, keras.layers.Dense(5, name="head")(h),
                     name="transfer")


def gpt2_causal_lm(vocab, length, seed=0):
  """A tiny keras_hub `GPT2CausalLM` (2 layers of width 16, no dropout, no
  preprocessor) with random weights: nothing is downloaded."""
  import keras_hub  # pylint: disable=import-outside-toplevel
  keras.utils.set_random_seed(seed)
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=vocab, num_layers=2, num_heads=2, hidden_dim=16,
      intermediate_dim=32, max_sequence_length=length, dropout=0.0)
  return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def lm_data(num, vocab, length, seed=0):
  """(x, y, sample_weight) as keras_hub's causal LM preprocessors give it:
  `num` random sequences of `length` token ids below `vocab`, each padded
  after 3 to `length` tokens; the weight is the padding mask, one per
  token, so that padded positions count in no loss."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, vocab, size=(num, length + 1)).astype("int32")
  mask = (np.arange(length) < rng.integers(3, length + 1, size=(num, 1)))
  mask = mask.astype("int32")
  x = {"token_ids": tokens[:, :-1] * mask, "padding_mask": mask}
  return x, tokens[:, 1:] * mask, mask.astype("float32")
