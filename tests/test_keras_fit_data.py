"""fit's training data: tf.data autotuning off, the batches unchanged."""

import numpy as np
import tensorflow as tf

from tf_interlock.keras import fit as keras_fit


def _batches(dataset):
  return [tuple(np.asarray(t) for t in tf.nest.flatten(b))
          for b in dataset.take(4)]


def test_arrays_and_datasets_train_without_autotune_same_batches():
  x = np.arange(48, dtype="float32").reshape(12, 4)
  y = np.arange(12, dtype="int32")
  arrays, steps, _, _ = keras_fit.training_dataset(
      x, y, 4, False, None, 0.0, None)
  assert steps == 3
  assert arrays.options().autotune.enabled is False
  got = _batches(arrays)
  assert len(got) == 3
  for i, (xb, yb) in enumerate(got):
    np.testing.assert_array_equal(xb, x[4 * i:4 * i + 4])
    np.testing.assert_array_equal(yb, y[4 * i:4 * i + 4])

  given = tf.data.Dataset.from_tensor_slices((x, y)).batch(4, drop_remainder=True)
  dataset, _, _, _ = keras_fit.training_dataset(
      given, None, None, False, None, 0.0, None)
  assert given.options().autotune.enabled is None
  assert dataset.options().autotune.enabled is False
  for a, b in zip(_batches(dataset), _batches(given), strict=True):
    for ta, tb in zip(a, b):
      np.testing.assert_array_equal(ta, tb)


def test_a_datasets_own_autotune_setting_is_kept():
  options = tf.data.Options()
  options.autotune.enabled = True
  given = tf.data.Dataset.from_tensor_slices(
      (np.zeros((8, 2), "float32"), np.zeros(8, "int32"))).batch(
          4, drop_remainder=True).with_options(options)
  dataset, _, _, _ = keras_fit.training_dataset(
      given, None, None, False, None, 0.0, None)
  assert dataset.options().autotune.enabled is True
