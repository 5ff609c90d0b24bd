"""from_keras on the graphs Keras users bring: raw keras.ops between layers,
keras.applications models, nested models used as layers."""

import keras
import numpy as np
import pytest

from tf_interlock.keras import split as keras_split
from tf_interlock.keras.model import InterlockModel

BATCH = 4


def chained(modules, x):
  for module in modules:
    x = module.body(x, training=False)
  return x.numpy()


def raw_ops_model(seed=0):
  """Layers joined by raw keras.ops: rescaling arithmetic, a residual `+`,
  keras.ops.relu and keras.ops.mean (Operation nodes, not Layers)."""
  keras.utils.set_random_seed(seed)
  inputs = keras.Input((8, 8, 3))
  h = keras.applications.mobilenet_v2.preprocess_input(inputs)
  h = h / 2.0 - 0.25
  h = keras.layers.Conv2D(6, 3, padding="same", activation="relu")(h)
  for _ in range(2):
    h = keras.ops.relu(h + keras.layers.Conv2D(6, 3, padding="same")(h))
  h = keras.ops.mean(h, axis=(1, 2))
  return keras.Model(inputs, keras.layers.Dense(5)(h))


def images(num=4 * BATCH, size=8, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.uniform(0, 255, size=(num, size, size, 3)).astype("float32")
  return x, rng.integers(0, 5, size=num).astype("int32")


def test_raw_operations_stand_where_layers_may():
  model = raw_ops_model()
  assert any(not isinstance(op, keras.layers.Layer)
             for op in model.operations)
  x, _ = images()
  modules = keras_split.from_keras(model, 3)
  # The automatic cuts fall after the stem and after a residual
  # `relu(h + conv(h))`, never inside one (the skip tensor would cross too).
  stem = next(op.name for op in model.operations
              if isinstance(op, keras.layers.Conv2D))
  assert [m.layer_names[-1] for m in modules][:2] == [stem, "relu"]
  np.testing.assert_allclose(chained(modules, x), model(x).numpy(),
                             atol=1e-5)
  # The params balance counts 0 for an Operation.
  assert len(keras_split.from_keras(model, 3, balance="params")) == 3


def test_raw_operations_e2e_fit_equals_plain_keras_fit():
  x, y = images(seed=1)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  plain = raw_ops_model()
  plain.compile(keras.optimizers.Adam(1e-2), loss)
  want = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                   verbose=0)
  model = InterlockModel(keras_split.from_keras(raw_ops_model(), 3),
                         strategy="e2e", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2), loss)
  got = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                  verbose=0)
  np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                             rtol=1e-5)
  np.testing.assert_allclose(model.predict(x, verbose=0),
                             plain.predict(x, verbose=0), atol=1e-5)


def convnext_tiny():
  keras.utils.set_random_seed(0)
  return keras.applications.ConvNeXtTiny(weights=None,
                                         input_shape=(32, 32, 3), classes=5)


@pytest.mark.slow
def test_convnext_tiny_splits_into_modules_equal_to_the_source():
  # ConvNeXt's residual adds are raw `inputs + layer(x)` Operations.
  model = convnext_tiny()
  x, _ = images(num=2, size=32)
  modules = keras_split.from_keras(model, 4)
  assert [m.has_aux_head for m in modules] == [True, True, True, False]
  assert all(m.layer_names[-1].startswith("add") for m in modules[:3])
  np.testing.assert_allclose(chained(modules, x), model(x).numpy(),
                             atol=1e-4)


@pytest.mark.slow
def test_convnext_tiny_trains_2wise_on_simulated_devices():
  x, y = images(num=2 * BATCH, size=32)
  model = InterlockModel(keras_split.from_keras(convnext_tiny(), 4),
                         strategy="2wise", placement="simulated")
  model.compile(keras.optimizers.SGD(1e-2))
  model.build(x.shape)
  before = [[w.numpy() for w in m.trainable_weights] for m in model.modules]
  history = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0).history
  for k, module in enumerate(model.modules):
    assert np.isfinite(history[f"module_{k + 1}/loss"][0]), k
    assert any(not np.array_equal(a, b.numpy()) for a, b in zip(
        before[k], module.trainable_weights)), k


def nested_model(seed=0, frozen=False):
  """A Sequential base (with BatchNormalization) inside a functional model,
  called as a layer, as the transfer-learning guide does."""
  keras.utils.set_random_seed(seed)
  base = keras.Sequential([keras.Input((8, 8, 3))] + [
      layer for filters in (4, 8) for layer in (
          keras.layers.Conv2D(filters, 3, padding="same"),
          keras.layers.BatchNormalization(), keras.layers.ReLU())],
                          name="base")
  base.layers[1].moving_mean.assign(np.full((4,), 0.5))
  base.trainable = not frozen
  inputs = keras.Input((8, 8, 3))
  h = base(inputs / 255.0, training=False)
  h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(h)
  h = keras.layers.GlobalAveragePooling2D()(h)
  return keras.Model(inputs, keras.layers.Dense(5)(h))


def test_a_nested_model_is_cut_inside_and_left_untouched():
  model = nested_model()
  base = model.get_layer("base")
  nodes_before = [len(layer._inbound_nodes) for layer in base.layers]
  x, _ = images(seed=2)
  modules = keras_split.from_keras(model, 3)
  # Three modules out of one nested block: the cuts go inside `base`.
  names = [m.layer_names for m in modules]
  inner = {layer.name for layer in base.layers}
  assert all(set(n) & inner for n in names[:2]), names
  np.testing.assert_allclose(chained(modules, x), model(x).numpy(),
                             atol=1e-5)
  assert [len(layer._inbound_nodes) for layer in base.layers] == nodes_before


def test_nested_model_e2e_fit_equals_plain_keras_fit():
  x, y = images(seed=3)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  plain = nested_model()
  plain.compile(keras.optimizers.Adam(1e-2), loss)
  want = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                   verbose=0)
  model = InterlockModel(keras_split.from_keras(nested_model(), 3),
                         strategy="e2e", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2), loss)
  got = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                  verbose=0)
  np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                             rtol=1e-5)
  np.testing.assert_allclose(model.predict(x, verbose=0),
                             plain.predict(x, verbose=0), atol=1e-5)


def test_a_frozen_nested_base_stays_frozen_when_inlined():
  x, y = images(seed=4)
  model = InterlockModel(keras_split.from_keras(nested_model(frozen=True), 3),
                         strategy="2wise", placement="simulated")
  model.compile(keras.optimizers.SGD(0.1))
  model.build(x.shape)
  first = model.modules[0].body
  assert not first.trainable_weights
  before = [w.numpy() for w in first.weights]
  model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
  for a, b in zip(before, first.weights, strict=True):
    np.testing.assert_array_equal(a, b.numpy())


def test_transfer_learning_idiom_with_mobilenet_v2_base():
  keras.utils.set_random_seed(0)
  base = keras.applications.MobileNetV2(weights=None, include_top=False,
                                        input_shape=(32, 32, 3), alpha=0.35)
  inputs = keras.Input((32, 32, 3))
  h = base(keras.applications.mobilenet_v2.preprocess_input(inputs))
  h = keras.layers.GlobalAveragePooling2D()(h)
  model = keras.Model(inputs, keras.layers.Dense(5)(h))
  modules = keras_split.from_keras(model, 4)
  assert len(modules) == 4
  x, _ = images(num=2, size=32)
  np.testing.assert_allclose(chained(modules, x), model(x).numpy(),
                             atol=1e-4)
