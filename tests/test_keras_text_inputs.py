"""Strings in: a TextVectorization adapted inside the model, and a
tensorflow_text tokenizer in the tf.data pipeline feeding a split model.

Each splits, trains under "e2e" exactly as plain Keras does, and reloads
from a `.keras` file with equal predictions.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text as tf_text

import tf_interlock as ti

pytestmark = pytest.mark.slow

BATCH, LENGTH, CLASSES = 4, 6, 3
WORDS = ("red", "green", "blue", "cat", "dog", "sun", "moon", "sky", "sea")


def sentences(num=4 * BATCH, seed=0):
  """Sentences of 2..LENGTH words, and labels that depend on the words."""
  rng = np.random.default_rng(seed)
  texts, labels = [], []
  for _ in range(num):
    words = rng.choice(WORDS, size=rng.integers(2, LENGTH + 1))
    texts.append(" ".join(words))
    labels.append(sum(WORDS.index(w) for w in words) % CLASSES)
  return np.array(texts), np.array(labels, "int32")


def classifier(first, inputs, seed):
  """`first` (the strings' layer, or None) then a small text classifier."""
  keras.utils.set_random_seed(seed)
  h = first(inputs) if first is not None else inputs
  h = keras.layers.Embedding(len(WORDS) + 2, 8)(h)
  h = keras.layers.Conv1D(8, 3, padding="same", activation="relu")(h)
  h = keras.layers.Conv1D(8, 3, padding="same", activation="relu")(h)
  h = keras.layers.GlobalAveragePooling1D()(h)
  h = keras.layers.Dense(8, activation="relu")(h)
  return keras.Model(inputs, keras.layers.Dense(CLASSES)(h))


def vectorizing_model(seed=0):
  """keras.io's text classification: the adapted TextVectorization is the
  model's first layer, so the model takes raw strings."""
  vectorize = keras.layers.TextVectorization(
      max_tokens=len(WORDS) + 2, output_sequence_length=LENGTH,
      name="vectorize")
  vectorize.adapt(sentences(seed=5)[0])
  return classifier(vectorize, keras.Input((1,), dtype="string"), seed)


def assert_e2e_equals_plain_and_reloads(build, data, x, tmp_path,
                                        num_modules=3):
  """e2e fit on `data` equals plain Keras fit; `x` predicts equally after a
  .keras reload."""
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  plain = build()
  plain.compile(keras.optimizers.Adam(1e-2), loss)
  want = plain.fit(data, epochs=2, verbose=0)
  modules = ti.from_keras(build(), num_modules)
  assert len(modules) == num_modules
  model = ti.InterlockModel(modules, strategy="e2e", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2), loss)
  got = model.fit(data, epochs=2, verbose=0)
  np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                             rtol=1e-5)
  predicted = model.predict(x, verbose=0)
  np.testing.assert_allclose(predicted, plain.predict(x, verbose=0),
                             atol=1e-5)
  path = str(tmp_path / "m.keras")
  model.save(path)
  restored = keras.models.load_model(path)
  np.testing.assert_allclose(restored.predict(x, verbose=0), predicted,
                             atol=1e-6)
  return model


def test_text_vectorization_adapted_inside_the_model(tmp_path):
  texts, labels = sentences()
  x = tf.constant(texts[:, None])
  data = tf.data.Dataset.from_tensor_slices((x, labels)).batch(
      BATCH, drop_remainder=True)
  model = assert_e2e_equals_plain_and_reloads(vectorizing_model, data, x,
                                              tmp_path)
  # The vocabulary went with the first module, and strings are what the
  # split model takes.
  assert "vectorize" in model.modules[0].body.layer_names


def tokenized(texts, labels, lookup):
  """The tf.data pipeline: tensorflow_text's WhitespaceTokenizer, then a
  StringLookup, padded to LENGTH ids."""
  tokenizer = tf_text.WhitespaceTokenizer()

  def encode(text, label):
    ids = lookup(tokenizer.tokenize(text))
    return ids.to_tensor(shape=[None, LENGTH]), label
  return (tf.data.Dataset.from_tensor_slices((texts, labels))
          .batch(BATCH, drop_remainder=True).map(encode))


def test_tensorflow_text_tokenizer_in_the_input_pipeline(tmp_path):
  texts, labels = sentences()
  lookup = keras.layers.StringLookup(vocabulary=list(WORDS))
  data = tokenized(texts, labels, lookup)
  x = np.concatenate([ids for ids, _ in data.as_numpy_iterator()])
  assert x.shape == (len(texts), LENGTH) and x.dtype == np.int64

  def build():
    return classifier(None, keras.Input((LENGTH,), dtype="int64"), seed=0)
  assert_e2e_equals_plain_and_reloads(build, data, x, tmp_path)
  # The same pipeline feeds a 2-wise split that trains every module.
  model = ti.InterlockModel(ti.from_keras(build(), 3), strategy="2wise",
                            placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2))
  model.build(x.shape)
  before = [[w.numpy() for w in m.trainable_weights] for m in model.modules]
  model.fit(data, epochs=1, verbose=0)
  for k, module in enumerate(model.modules):
    assert any(not np.array_equal(a, b.numpy()) for a, b in zip(
        before[k], module.trainable_weights)), k
