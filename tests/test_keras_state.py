"""`from_keras` keeps everything a Keras model had, and Keras habits hold
(issue 41), on a keras.io-style ViT and a small CNN (tests/keras_vit.py).

Adapted preprocessing and non-trainable state survive the split and a
reload; a layer frozen at any depth stays frozen through `fit`; random
augmentation layers export; callbacks find the direction of every logged
metric; `model.export`, `get_layer` and `model.strategy` behave as Keras's.
"""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_interlock as ti
from tf_interlock import keras_private
from tests import keras_vit

BATCH = 16
CUSTOM = {"Patches": keras_vit.Patches,
          "PatchEncoder": keras_vit.PatchEncoder, "Scaled": keras_vit.Scaled}
TEXT_KINDS = ("string_lookup", "text_vectorization", "integer_lookup",
              "discretization")


def source_model(name):
  if name == "vit":
    return keras_vit.vit(blocks=2)
  if name == "cnn":
    return keras_vit.small_cnn()
  return keras_vit.text_model(name)


def inputs_of(name):
  if name in ("vit", "cnn"):
    return keras_vit.images(seed=1)
  return keras_vit.text_inputs(name)


def split(source, strategy="2wise"):
  return ti.InterlockModel(ti.from_keras(source, 3), strategy,
                           placement="simulated")


TrainedViT = collections.namedtuple(
    "TrainedViT", "model history callbacks folder source before")


@pytest.fixture(scope="module")
def trained_vit(tmp_path_factory):
  """The ViT, its FROZEN layers frozen (below), split in 3, trained 2-wise
  for 3 epochs with validation, an accuracy and a top-k metric, and
  callbacks monitoring them without `mode=`: a TrainedViT (the callbacks
  by name, the source model, and FROZEN's and TRAINED's weights before
  fit, by name)."""
  folder = tmp_path_factory.mktemp("vit")
  x, y = keras_vit.images()
  source = keras_vit.vit(blocks=2)
  for find in FROZEN.values():
    find(source).trainable = False
  model = split(source)
  model.compile("adam", metrics=[
      "accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
  model.build((None,) + x.shape[1:])
  before = {name: _weights(model, find)
            for name, find in {**FROZEN, **TRAINED}.items()}
  callbacks = {
      "val_accuracy": keras.callbacks.EarlyStopping(
          monitor="val_accuracy", patience=5),
      "val_module_2/accuracy": keras.callbacks.ModelCheckpoint(
          str(folder / "best.keras"), monitor="val_module_2/accuracy",
          save_best_only=True),
      "val_module_1/loss": keras.callbacks.EarlyStopping(
          monitor="val_module_1/loss", patience=5),
      "module_1/sparse_top_k_categorical_accuracy":
          keras.callbacks.EarlyStopping(
              monitor="module_1/sparse_top_k_categorical_accuracy",
              patience=5),
  }
  history = model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0,
                      validation_data=(x[:BATCH], y[:BATCH]),
                      callbacks=list(callbacks.values())).history
  return TrainedViT(model, history, callbacks, folder, source, before)


@pytest.fixture(scope="module")
def trained_cnn():
  """The small CNN with its random augmentation, split in 3 and trained
  2-wise for an epoch (Adam, an accuracy): the model the reload and export
  tests read (they never train it on)."""
  x, y = keras_vit.images()
  model = split(keras_vit.small_cnn(augment=True))
  model.compile("adam", metrics=["accuracy"])
  model.fit(x, y, batch_size=BATCH, verbose=0)
  return model


@pytest.mark.parametrize("name", ("vit", "cnn") + TEXT_KINDS)
def test_adapted_state_survives_the_split(name):
  # The ViT's Normalization sits in a nested Sequential; the CNN adds BN
  # moving statistics and a user's layer with a non-trainable variable.
  source = source_model(name)
  x, _ = inputs_of(name)
  want = source.predict(x, verbose=0)
  got = split(source).predict(x, verbose=0)
  np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("name", ["vit", "cnn", "string_lookup",
                                  "text_vectorization"])
def test_trained_split_model_reloads_with_its_state(name, tmp_path,
                                                    request):
  x, y = inputs_of(name)
  if name == "vit":
    model = request.getfixturevalue("trained_vit")[0]
  elif name == "cnn":
    model = request.getfixturevalue("trained_cnn")
  else:
    model = split(source_model(name))
    model.compile("adam", metrics=["accuracy"])
    model.fit(x, y, batch_size=BATCH, verbose=0)
  want = model.predict(x, verbose=0)
  path = str(tmp_path / "model.keras")
  model.save(path)
  loaded = keras.models.load_model(path, custom_objects=CUSTOM)
  np.testing.assert_allclose(loaded.predict(x, verbose=0), want, atol=1e-5)
  if name == "vit":
    # The adapted statistics did not train: still the source's. from_keras
    # looks into the nested data_augmentation block, so its layers are
    # found by their own names.
    norm = loaded.get_layer("normalization")
    source_norm = source_model("vit").get_layer("data_augmentation").layers[0]
    np.testing.assert_allclose(norm.mean, source_norm.mean, rtol=1e-6)
    np.testing.assert_allclose(norm.variance, source_norm.variance,
                               rtol=1e-6)


def _trainable_flags(layer):
  return [(type(inner).__name__, inner.trainable)
          for inner in [layer] + keras_private.flatten_layers(layer)]


# Frozen: a layer owning layers, a layer inside a user's layer, one
# sublayer of an attention layer; each next to one that trains.
FROZEN = {
    "attention_0": lambda m: m.get_layer("attention_0"),
    "patch_encoder.projection":
        lambda m: m.get_layer("patch_encoder").projection,
    "attention_1.query_dense":
        lambda m: m.get_layer("attention_1").query_dense,
}
TRAINED = {
    "patch_encoder.position_embedding":
        lambda m: m.get_layer("patch_encoder").position_embedding,
    "attention_1.key_dense": lambda m: m.get_layer("attention_1").key_dense,
    "head": lambda m: m.get_layer("head"),
}


def _weights(model, find):
  return [w.numpy() for w in find(model).weights]


def test_a_layer_frozen_at_any_depth_keeps_its_weights_through_fit(
    trained_vit):
  # trained_vit's source had FROZEN's layers frozen before the split.
  model, source = trained_vit.model, trained_vit.source
  for name in ("attention_0", "patch_encoder", "attention_1"):
    assert (_trainable_flags(model.get_layer(name)) ==
            _trainable_flags(source.get_layer(name))), name
  assert not any(find(model).trainable for find in FROZEN.values())
  for name, find in FROZEN.items():
    for a, b in zip(trained_vit.before[name], _weights(model, find),
                    strict=True):
      np.testing.assert_array_equal(a, b, err_msg=name)
  for name, find in TRAINED.items():
    assert any(np.any(a != b) for a, b in zip(trained_vit.before[name],
                                              _weights(model, find))), name


def test_e2e_fit_with_state_and_a_nested_frozen_layer_equals_plain_keras():
  # Adapted Normalization, BN statistics, a user's non-trainable variable
  # and a conv frozen inside a nested Sequential: e2e equals Keras's fit.
  x, y = keras_vit.images(seed=2)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def frozen_cnn():
    model = keras_vit.small_cnn()
    model.get_layer("block").layers[0].trainable = False
    return model

  plain = frozen_cnn()
  plain.compile(keras.optimizers.Adam(1e-2), loss)
  want = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                   verbose=0)
  source = frozen_cnn()
  frozen_name = source.get_layer("block").layers[0].name
  model = split(source, "e2e")
  model.compile(keras.optimizers.Adam(1e-2), loss)
  got = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
  np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                             rtol=1e-5)
  np.testing.assert_allclose(model.predict(x, verbose=0),
                             plain.predict(x, verbose=0), atol=1e-5)
  # from_keras looks into the nested block: the conv is found by its name.
  frozen = model.get_layer(frozen_name)
  assert not frozen.trainable
  np.testing.assert_array_equal(
      frozen.get_weights()[0],
      frozen_cnn().get_layer("block").layers[0].get_weights()[0])


@pytest.mark.parametrize("name", ["vit", "cnn"])
def test_random_augmentation_exports_and_serves_predicts_values(name,
                                                                tmp_path,
                                                                request):
  # Both have RandomFlip and RandomRotation (the ViT's in a nested
  # Sequential): inactive at inference, their seed state still exports.
  x, _ = keras_vit.images()
  if name == "vit":
    model = request.getfixturevalue("trained_vit")[0]
  else:
    model = request.getfixturevalue("trained_cnn")
  path = model.export_saved_model(str(tmp_path / "export"))
  loaded = tf.saved_model.load(path)
  for signature, k in (("serving_default", None), ("exit_1", 1),
                       ("exit_2", 2)):
    served = loaded.signatures[signature](inputs=tf.constant(x))["logits"]
    np.testing.assert_allclose(served, model.predict(x, verbose=0, exit=k),
                               atol=1e-5)


def test_callbacks_find_every_metrics_direction_without_mode(trained_vit):
  model, history, callbacks, folder = trained_vit[:4]
  # Keras chose max for the accuracies and min for the loss: the best
  # value each kept is the extreme of its epochs.
  for key, callback in callbacks.items():
    extreme = min if key.endswith("loss") else max
    assert callback.best == extreme(history[key]), key
  assert (folder / "best.keras").exists()
  # The list Keras's callbacks read is not a logged value.
  assert "monitor_directions" not in model.metrics_names
  x, y = keras_vit.images()
  assert len(model.train_on_batch(x[:BATCH], y[:BATCH])) == len(
      model.metrics_names)


def test_model_export_writes_export_saved_models_savedmodel(trained_cnn,
                                                            tmp_path):
  x, _ = keras_vit.images()
  model = trained_cnn
  path = model.export(str(tmp_path / "export"), verbose=False)
  loaded = ti.export.load_exported(path)
  assert ti.export.exit_names(loaded) == ["exit_1", "exit_2"]
  served = loaded.signatures["serving_default"](inputs=tf.constant(x))
  np.testing.assert_allclose(served["logits"], model.predict(x, verbose=0),
                             atol=1e-5)
  with pytest.raises(ValueError) as refused:
    model.export(str(tmp_path / "other"), format="onnx")
  assert "export_saved_model" in str(refused.value)
  assert "Received: format='onnx'" in str(refused.value)
  assert "\n" not in str(refused.value)
  assert not (tmp_path / "other").exists()


def test_get_layer_by_original_name_and_model_strategy():
  source = keras_vit.vit(blocks=2)
  model = split(source)
  assert model.strategy.name == "2wise"
  with pytest.raises(ValueError, match="is in module 1, which is built"):
    model.get_layer("attention_0")
  model.build((None,) + keras_vit.images()[0].shape[1:])
  for name in ("attention_0", "head", "patch_encoder"):
    layer = model.get_layer(name)
    assert layer is not source.get_layer(name)
    for a, b in zip(layer.get_weights(), source.get_layer(name).get_weights()):
      np.testing.assert_array_equal(a, b)
  assert model.get_layer("aux_head1") is model.modules[0].aux_head
  assert model.get_layer(index=0) is model.modules[0]
  with pytest.raises(ValueError, match="No such layer: nope.*'logits'"):
    model.get_layer("nope")
