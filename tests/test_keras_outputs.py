"""Models with several outputs: refused in one line naming them, and the
documented way to train them (docs/keras.md, "Several outputs"): one
concatenated output and one loss over its slices, which trains exactly as
Keras trains the model with a loss per output and `loss_weights`."""

import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_interlock as ti

BATCH, CLASSES, BOX = 4, 5, 2
BOX_WEIGHT = 0.5


def two_heads(seed=0):
  """A trunk and two heads: classes (cross-entropy) and a box (MSE)."""
  keras.utils.set_random_seed(seed)
  inputs = keras.Input((6,))
  h = inputs
  for _ in range(3):
    h = keras.layers.Dense(16, activation="relu")(h)
  return keras.Model(inputs, {
      "label": keras.layers.Dense(CLASSES, name="label")(h),
      "box": keras.layers.Dense(BOX, name="box")(h)})


def data(num=4 * BATCH, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num, 6)).astype("float32")
  return x, {"label": rng.integers(0, CLASSES, size=num).astype("int32"),
             "box": rng.normal(size=(num, BOX)).astype("float32")}


def test_several_outputs_are_refused_in_one_line_naming_them():
  with pytest.raises(ValueError, match=r"has 2: \['label', 'box'\]\. "
                     r"Concatenate .*Received: model="):
    ti.from_keras(two_heads(), 2)


def packed(model):
  """The documented move: the same layers, their outputs concatenated."""
  return keras.Model(model.input, keras.layers.Concatenate()(
      [model.output["label"], model.output["box"]]))


def packed_loss(y, logits):
  """Keras's per-output losses and loss_weights, per example: y holds the
  class in column 0 and the box after it; logits the class logits, then
  the box."""
  label = tf.cast(y[:, 0], tf.int32)
  cross_entropy = keras.losses.sparse_categorical_crossentropy(
      label, logits[:, :CLASSES], from_logits=True)
  box = tf.reduce_mean(tf.square(y[:, 1:] - logits[:, CLASSES:]), axis=-1)
  return cross_entropy + BOX_WEIGHT * box


def test_concatenated_outputs_train_as_keras_trains_the_two_heads():
  x, y = data()
  plain = two_heads()
  plain.compile(keras.optimizers.Adam(1e-2), loss={
      "label": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      "box": "mse"}, loss_weights={"label": 1.0, "box": BOX_WEIGHT})
  want = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                   verbose=0)
  y_packed = np.concatenate([y["label"][:, None].astype("float32"),
                             y["box"]], axis=1)
  model = ti.InterlockModel(ti.from_keras(packed(two_heads()), 3),
                            strategy="e2e", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2), packed_loss)
  got = model.fit(x, y_packed, batch_size=BATCH, epochs=2, shuffle=False,
                  verbose=0)
  np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                             rtol=1e-5)
  # Both heads are the slices of the prediction; every early exit predicts
  # both too (its linear head has CLASSES + BOX outputs).
  predicted = model.predict(x, verbose=0)
  expected = plain.predict(x, verbose=0)
  np.testing.assert_allclose(predicted[:, :CLASSES], expected["label"],
                             atol=1e-5)
  np.testing.assert_allclose(predicted[:, CLASSES:], expected["box"],
                             atol=1e-5)
  assert model.predict(x, exit=1, verbose=0).shape == (len(x), CLASSES + BOX)


def test_the_docs_example_runs_as_written():
  with open(os.path.join(os.path.dirname(os.path.dirname(
      os.path.realpath(__file__))), "docs", "keras.md")) as f:
    blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
  block, = [b for b in blocks if "two_heads = keras.Model" in b]
  scope = {}
  exec(block, scope)  # pylint: disable=exec-used
  assert scope["label_logits"].shape == (64, 5)
  assert scope["box"].shape == (64, 2)
