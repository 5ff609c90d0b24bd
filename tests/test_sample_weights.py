"""Sample weights on every module's loss, as Keras weighs them
(tf_interlock.keras.sample_weights), and probabilistic losses on softmax outputs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_interlock.keras import split as keras_split
from tf_interlock import losses
from tf_interlock.keras import sample_weights
from tf_interlock.keras.model import InterlockModel


def per_token_batch(seed=0, batch=4, length=5, vocab=7):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(batch, length, vocab)).astype("float32")
  labels = rng.integers(0, vocab, size=(batch, length))
  weights = (np.arange(length) < rng.integers(1, length + 1,
                                              size=(batch, 1)))
  return labels, logits, weights.astype("float32")


@pytest.mark.parametrize("loss", [
    None, keras.losses.SparseCategoricalCrossentropy(from_logits=True)])
@pytest.mark.parametrize("shape", ["per_token", "per_example",
                                   "per_example_with_a_trailing_one"])
def test_the_batch_mean_is_keras_weighted_loss(loss, shape):
  labels, logits, weights = per_token_batch()
  if shape != "per_token":
    weights = np.array([0.0, 1.0, 2.0, 0.5], "float32")
    if shape == "per_example_with_a_trailing_one":
      weights = weights[:, None]
  loss_fn = sample_weights.weighted(losses.per_example_loss(
      losses.sparse_softmax_cross_entropy if loss is None else loss), loss)
  got = loss_fn((tf.constant(labels), tf.constant(weights)), logits)
  assert got.shape == (4,)
  # Keras's default reduction: sum(w * loss) / number of loss values (a
  # weight per example weighs each of its positions; Keras's Loss needs it
  # shaped (batch, 1) for that).
  want = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
      labels, logits, sample_weight=(
          weights if weights.ndim == 2 else weights[:, None]))
  np.testing.assert_allclose(float(tf.reduce_mean(got)), float(want),
                             rtol=1e-6)


def test_weights_per_token_for_a_loss_per_example_are_refused():
  labels, logits, weights = per_token_batch()
  loss_fn = sample_weights.weighted(losses.per_example_loss(
      lambda y, z: tf.reduce_mean(tf.square(z), axis=[1, 2])))
  with pytest.raises(ValueError, match=(
      r"sample_weight of shape \(batch, 5\) cannot weigh the loss, which "
      r"gives one value per example")):
    loss_fn((tf.constant(labels), tf.constant(weights)), logits)


@pytest.mark.parametrize("weights, labels", [
    ((8,), (8,)), ((8, 1), (8,)), ((8,), (8, 5)), ((8, 5), (8, 5)),
    ((8, 5), (8, 5, 3)), ((8, 1), (8, 5))])
def test_array_weights_that_fit_the_labels_pass(weights, labels):
  sample_weights.check_arrays(np.ones(weights), np.zeros(labels))


@pytest.mark.parametrize("weights, labels", [
    ((8, 5), (8,)), ((8, 6), (8, 5)), ((8, 5, 2), (8, 5))])
def test_array_weights_that_do_not_fit_are_one_line(weights, labels):
  with pytest.raises(ValueError, match=(
      rf"sample_weight needs one weight per example .* Received: "
      rf"sample_weight.shape={tuple(weights)!r}".replace(
          "(", r"\(").replace(")", r"\)"))) as info:
    sample_weights.check_arrays(np.ones(weights), np.zeros(labels))
  assert "\n" not in str(info.value)


def softmax_classifier():
  keras.utils.set_random_seed(0)
  inputs = keras.Input((4,))
  h = keras.layers.Dense(8, activation="relu")(inputs)
  h = keras.layers.Dense(8, activation="relu")(h)
  return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(h))


@pytest.mark.parametrize("strategy", ["e2e", "2wise"])
def test_a_softmax_output_trains_with_a_probabilistic_loss(strategy):
  # Keras's loss on a softmax output reads the logits before it; every
  # module's loss must still reach the module's output.
  x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
  y = np.arange(16) % 3
  weights = np.linspace(0.0, 2.0, 16).astype("float32")
  loss = keras.losses.SparseCategoricalCrossentropy()
  plain = softmax_classifier()
  plain.compile(keras.optimizers.SGD(0.1), loss)
  want = plain.fit(x, y, sample_weight=weights, batch_size=8, epochs=2,
                   shuffle=False, verbose=0).history["loss"]
  model = InterlockModel(keras_split.from_keras(softmax_classifier(), 2),
                         strategy=strategy, placement="simulated")
  model.compile(keras.optimizers.SGD(0.1), loss)
  got = model.fit(x, y, sample_weight=weights, batch_size=8, epochs=2,
                  shuffle=False, verbose=0).history
  assert np.all(np.isfinite(got["module_1/loss"]))
  if strategy == "e2e":
    np.testing.assert_allclose(got["loss"], want, rtol=1e-5)
    np.testing.assert_allclose(model.predict(x, verbose=0),
                               plain.predict(x, verbose=0), atol=1e-6)
