"""Tests for the per-example losses and metrics (tf_interlock.losses)."""

import numpy as np
import pytest
import tensorflow as tf

from tf_interlock import losses


def _reference_ce(labels, logits):
  logits = logits.astype(np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  return -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]


def test_cross_entropy_per_example_classification():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 7)).astype(np.float32)
  labels = rng.integers(0, 7, size=4)
  loss = losses.sparse_softmax_cross_entropy(labels, logits)
  assert loss.shape == (4,) and loss.dtype == tf.float32
  np.testing.assert_allclose(loss, _reference_ce(labels, logits), rtol=1e-5)


def test_cross_entropy_means_over_sequence_positions():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(3, 5, 11)).astype(np.float32)
  labels = rng.integers(0, 11, size=(3, 5))
  loss = losses.sparse_softmax_cross_entropy(labels, logits)
  assert loss.shape == (3,)
  np.testing.assert_allclose(
      loss, _reference_ce(labels, logits).mean(-1), rtol=1e-5)


def test_cross_entropy_runs_in_float32_for_bfloat16_logits():
  rng = np.random.default_rng(2)
  logits = tf.cast(rng.normal(size=(2, 4, 1000)) * 10, tf.bfloat16)
  labels = rng.integers(0, 1000, size=(2, 4))
  loss = losses.sparse_softmax_cross_entropy(labels, logits)
  assert loss.dtype == tf.float32
  # Same as float32 maths on the bf16-rounded logits, to float32 precision:
  # a bfloat16 log-sum-exp over 1000 classes would be off by ~0.1.
  expected = _reference_ce(labels, tf.cast(logits, tf.float32).numpy())
  np.testing.assert_allclose(loss, expected.mean(-1), rtol=1e-5)


def test_accuracy_per_example_and_ties():
  logits = np.array([[0.0, 2.0, 1.0], [3.0, 3.0, 0.0], [1.0, 0.0, 5.0]])
  labels = np.array([1, 1, 2])
  acc = losses.sparse_accuracy(labels, logits)
  assert acc.dtype == tf.float32
  # Row 2 ties classes 0 and 1: the first maximum (0) is the prediction.
  np.testing.assert_array_equal(acc, [1.0, 0.0, 1.0])


def test_accuracy_fraction_over_positions():
  logits = tf.one_hot([[0, 1, 2, 3], [3, 3, 3, 3]], depth=4)
  labels = np.array([[0, 1, 0, 0], [3, 3, 3, 3]])
  np.testing.assert_allclose(
      losses.sparse_accuracy(labels, tf.cast(logits, tf.bfloat16)),
      [0.5, 1.0])


def test_perplexity():
  # Uniform predictions over V classes: loss log V, perplexity V.
  vocab = 50
  logits = np.zeros((2, 3, vocab), np.float32)
  labels = np.zeros((2, 3), np.int64)
  mean_loss = tf.reduce_mean(losses.sparse_softmax_cross_entropy(
      labels, logits))
  np.testing.assert_allclose(losses.perplexity(mean_loss), vocab, rtol=1e-5)
  assert losses.perplexity(0.0).dtype == tf.float32
  np.testing.assert_allclose(losses.perplexity(np.log(7.0)), 7.0, rtol=1e-6)


def test_works_inside_tf_function_with_unknown_shapes():
  fn = tf.function(losses.sparse_softmax_cross_entropy, input_signature=[
      tf.TensorSpec(None, tf.int32), tf.TensorSpec(None, tf.float32)])
  out = fn(tf.constant([[1, 2]]), tf.zeros([1, 2, 3]))
  np.testing.assert_allclose(out, [np.log(3.0)], rtol=1e-6)
  out = fn(tf.constant([1, 2]), tf.zeros([2, 4]))
  np.testing.assert_allclose(out, [np.log(4.0)] * 2, rtol=1e-6)


@pytest.mark.parametrize("fn", [losses.sparse_softmax_cross_entropy,
                                losses.sparse_accuracy])
def test_rank_mismatch_raises(fn):
  with pytest.raises(ValueError, match=r"Received: logits.shape=\(4, 3\)"):
    fn(np.zeros((4, 3), np.int32), np.zeros((4, 3), np.float32))
  with pytest.raises(ValueError, match=r"Received: labels.shape=\(\)"):
    fn(np.int32(1), np.zeros((3,), np.float32))


def test_per_example_loss_takes_names_and_means_positions():
  # One per-example loss for the trainer and Keras's compile: a Keras loss
  # name is looked up, and a callable's per-position values [B, T] are
  # averaged to [B] (mean over positions, as for a Loss object).
  rng = np.random.default_rng(3)
  y_true = rng.normal(size=(4, 5)).astype(np.float32)
  y_pred = rng.normal(size=(4, 5)).astype(np.float32)
  by_name = losses.per_example_loss("mean_squared_error")(y_true, y_pred)
  np.testing.assert_allclose(by_name, ((y_true - y_pred) ** 2).mean(-1),
                             rtol=1e-6)
  positions = losses.per_example_loss(lambda t, p: tf.abs(t - p))
  np.testing.assert_allclose(positions(y_true, y_pred),
                             np.abs(y_true - y_pred).mean(-1), rtol=1e-6)
  with pytest.raises(ValueError, match="Received: loss='nope'"):
    losses.per_example_loss("nope", name="loss")
