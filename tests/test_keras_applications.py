"""keras.applications models as their users build them, through from_keras.

Each case is the transfer-learning idiom (an `include_top=False` base nested
in a small model with a head of one's own) or the application itself: it
must split, train exactly as plain Keras does under "e2e" and reload from a
`.keras` file with equal predictions; MobileNetV3 and a small model of its
operations also export. All but that small model are in make test-slow.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_interlock as ti

BATCH = 4
CLASSES = 5


def images(size, num=2 * BATCH, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.uniform(0, 255, size=(num, size, size, 3)).astype("float32")
  return x, rng.integers(0, CLASSES, size=num).astype("int32")


def nested(base_fn, size, preprocess=None):
  """A builder of `base_fn`'s base nested in a model with a Dense head.

  The base's Dropout layers (EfficientNet's stochastic depth) get rate 0:
  plain Keras and the split model draw other masks.
  """
  def build():
    keras.utils.set_random_seed(0)
    base = base_fn(weights=None, include_top=False,
                   input_shape=(size, size, 3))
    for layer in base.layers:
      if isinstance(layer, keras.layers.Dropout):
        layer.rate = 0.0
    inputs = keras.Input((size, size, 3))
    h = base(preprocess(inputs) if preprocess else inputs)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(h))
  return build


def flat(app_fn, size, **kwargs):
  """A builder of the application itself, its own classifier on top."""
  def build():
    keras.utils.set_random_seed(0)
    return app_fn(weights=None, input_shape=(size, size, 3),
                  classes=CLASSES, classifier_activation=None, **kwargs)
  return build


def assert_splits_trains_reloads_and_exports(build, size, num_modules,
                                             tmp_path, rtol=1e-5,
                                             atol=1e-4, export=True):
  """e2e fit of the split model equals plain Keras fit; the trained model
  reloads from .keras and (with `export`) exports with the same
  predictions. The biggest models skip the export, which adds minutes of
  tracing to make test-slow and tests nothing of theirs that MobileNetV3
  does not."""
  x, y = images(size)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  plain = build()
  plain.compile(keras.optimizers.Adam(1e-3), loss)
  want = plain.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False,
                   verbose=0)
  modules = ti.from_keras(build(), num_modules)
  assert len(modules) == num_modules
  model = ti.InterlockModel(modules, strategy="e2e", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-3), loss)
  got = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False,
                  verbose=0)
  np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                             rtol=rtol)
  predicted = model.predict(x, verbose=0)
  np.testing.assert_allclose(predicted, plain.predict(x, verbose=0),
                             rtol=rtol, atol=atol)
  path = str(tmp_path / "m.keras")
  model.save(path)
  restored = keras.models.load_model(path)
  np.testing.assert_allclose(restored.predict(x, verbose=0), predicted,
                             rtol=1e-6, atol=1e-6)
  if not export:
    return
  served = tf.saved_model.load(model.export_saved_model(
      str(tmp_path / "export"))).signatures["serving_default"]
  np.testing.assert_allclose(served(inputs=tf.constant(x))["logits"],
                             predicted, rtol=1e-5, atol=1e-5)


def hard_swish_model():
  """A merge layer `keras.layers.Add` beside raw Operations with a Python
  constant operand (`x + 3.0`, `x * (1 / 6)`), which Keras also names
  "Add" and "Multiply": MobileNetV3's hard-swish in small."""
  keras.utils.set_random_seed(0)
  inputs = keras.Input((8, 8, 3))
  h = keras.layers.Conv2D(6, 3, padding="same")(inputs / 255.0)
  for _ in range(3):
    c = keras.layers.Conv2D(6, 3, padding="same")(h)
    swish = c * keras.layers.ReLU(6.0)(c + 3.0) * (1.0 / 6.0)
    h = keras.layers.ReLU()(keras.layers.Add()(
        [h, keras.layers.Conv2D(6, 3, padding="same")(swish)]))
  h = keras.layers.GlobalAveragePooling2D()(h)
  return keras.Model(inputs, keras.layers.Dense(CLASSES)(h))


def test_operations_with_constant_operands_split_train_and_reload(tmp_path):
  assert_splits_trains_reloads_and_exports(hard_swish_model, 8, 3, tmp_path)


@pytest.mark.slow
def test_mobilenet_v3_small_nested_hard_swish_operations_split_and_train(
    tmp_path):
  # MobileNetV3's hard-swish is `x * relu6(x + 3.0) * (1 / 6)`: raw
  # Operations with a Python constant operand, named "add" and "multiply"
  # as the merge layers are.
  build = nested(lambda **kw: keras.applications.MobileNetV3Small(
      alpha=0.5, **kw), 64)
  assert_splits_trains_reloads_and_exports(build, 64, 3, tmp_path)


@pytest.mark.slow
def test_mobilenet_v3_small_with_one_module(tmp_path):
  # No dropout in its classifier: plain Keras draws other masks.
  build = flat(keras.applications.MobileNetV3Small, 64, alpha=0.5,
               dropout_rate=0.0)
  assert_splits_trains_reloads_and_exports(build, 64, 1, tmp_path)


@pytest.mark.slow
def test_mobilenet_v3_large_flat(tmp_path):
  build = flat(keras.applications.MobileNetV3Large, 64, alpha=0.75,
               dropout_rate=0.0)
  assert_splits_trains_reloads_and_exports(build, 64, 4, tmp_path,
                                           export=False)


@pytest.mark.slow
def test_convnext_tiny_nested_as_a_base(tmp_path):
  build = nested(keras.applications.ConvNeXtTiny, 32)
  assert_splits_trains_reloads_and_exports(build, 32, 4, tmp_path,
                                           export=False)


@pytest.mark.slow
def test_efficientnet_v2_b0_nested_as_a_base(tmp_path):
  build = nested(keras.applications.EfficientNetV2B0, 64)
  # Float32 round-off over 4 module boundaries of a 270-layer network with
  # BN and squeeze-excite in every block: 3e-5 apart after two Adam steps
  # (its stochastic depth left at 0.2 made it 2e-2).
  assert_splits_trains_reloads_and_exports(build, 64, 4, tmp_path,
                                           rtol=1e-4, export=False)
