"""keras.io's transfer learning on a split model (issue 45): flags changed
after the split survive `.keras` save/load, a ModelCheckpoint resume and
`clone_model`; a nested model's name selects its layers in every module;
`to_keras` gives the trained model back.

The model (tests/keras_models.transfer_model): a nested functional base
"small_base" (conv1/bn1/relu1, conv2/bn2/relu2, then a nested Sequential
"block3" of conv3/bn3/relu3), frozen before the split as in phase 1, a
pooling layer and a Dense "head"; cut into 3 modules after relu1 and relu2.
"""

import os
import re

import keras
import numpy as np
import pytest

import tf_interlock as ti
from tf_interlock import keras_private
from tests import keras_models

BATCH = 16
# Phase 2, after the split: a sublayer of the nested base unfrozen, a whole
# nested model (inside the nested base) unfrozen, a top-level layer frozen.
TRAINS = {"conv1", "conv3", "bn3"}  # Their weights move in fit.
STILL = {"bn1", "conv2", "bn2", "head"}  # Their weights must not move.
# Trainable weights per module: module 1 conv1 and aux head 1; module 2
# aux head 2; module 3 conv3 and bn3's gamma and beta (head frozen).
PER_MODULE = [4, 2, 4]


def data(seed=0, num=2 * BATCH):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(num, 8, 8, 3)).astype("float32"),
          rng.integers(0, 5, size=num))


def split(source=None):
  source = source or keras_models.transfer_model()
  return ti.InterlockModel(ti.from_keras(source, 3, split=["relu1", "relu2"]),
                           "2wise", placement="simulated")


def phase_2(model):
  model.get_layer("conv1").trainable = True
  model.get_layer("block3").trainable = True
  model.get_layer("head").trainable = False
  model.compile(keras.optimizers.SGD(0.1))


def per_module(model):
  return [len(m.trainable_weights) for m in model.modules]


def flags(model):
  names = sorted(TRAINS | STILL | {"relu1", "relu2", "relu3", "pool"})
  return {n: [inner.trainable for inner in [model.get_layer(n)] +
              keras_private.flatten_layers(model.get_layer(n))]
          for n in names}


def values(model):
  return {n: [w.numpy().copy() for w in model.get_layer(n).weights]
          for n in TRAINS | STILL}


def assert_fit_moves_exactly_the_trainable(model, x, y):
  before = values(model)
  model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
  after = values(model)
  for name in TRAINS:
    assert any(np.any(a != b) for a, b in zip(before[name], after[name])), (
        name)
  for name in STILL:
    for a, b in zip(before[name], after[name]):
      np.testing.assert_array_equal(a, b, err_msg=name)


def test_flags_set_after_the_split_survive_a_checkpoint_and_a_reload(
    tmp_path):
  x, y = data()
  model = split()
  model.compile(keras.optimizers.SGD(0.1))
  model.fit(x, y, batch_size=BATCH, verbose=0)
  assert per_module(model) == [2, 2, 2]  # Phase 1: the aux heads, the head.
  phase_2(model)
  path = str(tmp_path / "ckpt.keras")
  model.fit(x, y, batch_size=BATCH, verbose=0,
            callbacks=[keras.callbacks.ModelCheckpoint(path)])
  assert per_module(model) == PER_MODULE
  for loaded in (keras.models.load_model(path),
                 keras.models.load_model(_saved(model, tmp_path))):
    assert per_module(loaded) == PER_MODULE
    assert flags(loaded) == flags(model)
    # The resumed run fine-tunes what the saved one did, and only that.
    assert_fit_moves_exactly_the_trainable(loaded, x, y)


def _saved(model, folder):
  path = str(folder / "model.keras")
  model.save(path)
  return path


def test_flags_survive_clone_model():
  x, y = data()
  model = split()
  model.build((None, 8, 8, 3))
  phase_2(model)
  clone = keras.models.clone_model(model)
  clone.compile(keras.optimizers.SGD(0.1))
  clone.build((None, 8, 8, 3))
  assert per_module(clone) == PER_MODULE
  assert flags(clone) == flags(model)
  assert_fit_moves_exactly_the_trainable(clone, x, y)


def test_a_nested_models_name_selects_its_layers_in_every_module(tmp_path):
  x, y = data()
  model = split()
  with pytest.raises(ValueError, match="build or fit the model first"):
    model.get_layer("small_base")
  model.build((None, 8, 8, 3))
  base = model.get_layer("small_base")
  assert [layer.name for layer in base.layers] == [
      "conv1", "bn1", "relu1", "conv2", "bn2", "relu2", "conv3", "bn3",
      "relu3"]
  assert base.modules == [1, 2, 3] and base.trainable is False
  assert not base.trainable_weights and len(base.weights) == 3 * 6
  # keras.io's phase 2: base_model.trainable = True, recompile, fit.
  base.trainable = True
  model.compile(keras.optimizers.SGD(0.1))
  assert len(base.trainable_weights) == 3 * 4
  lines = []
  model.summary(print_fn=lines.append)
  assert ('Nested model "small_base": 9 layers in modules 1-3, 9 of them '
          'trainable (get_layer("small_base"))') in lines
  assert any(line.startswith('Nested model "block3": 3 layers in module 3')
             for line in lines)
  before = [w.numpy().copy() for w in base.weights]
  model.fit(x, y, batch_size=BATCH, verbose=0)
  moved = [np.any(a != w.numpy()) for a, w in zip(before, base.weights)]
  # Every weight: as in Keras, an unfrozen BatchNormalization trains its
  # moving statistics too (the outer fit's training=True reaches it).
  assert all(moved), moved
  loaded = keras.models.load_model(_saved(model, tmp_path))
  assert loaded.get_layer("small_base").trainable is True
  assert len(loaded.get_layer("small_base").trainable_weights) == 3 * 4
  loaded.get_layer("small_base").trainable = False
  loaded.compile(keras.optimizers.SGD(0.1))
  assert per_module(loaded) == [2, 2, 2]
  with pytest.raises(ValueError, match="No such layer: small_bas"):
    loaded.get_layer("small_bas")


def test_to_keras_gives_the_trained_model_back(tmp_path):
  x, y = data()
  source = keras_models.transfer_model()
  model = split(source)
  model.build((None, 8, 8, 3))
  phase_2(model)
  model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
  want = model.predict(x, verbose=0)
  back = model.to_keras()
  assert back is source
  np.testing.assert_allclose(back.predict(x, verbose=0), want, atol=1e-5)
  # The flags too: what trained in the split trains in the model returned.
  base = back.get_layer("small_base")
  block3 = base.get_layer("block3")
  assert ({id(w) for w in back.trainable_weights} ==
          {id(w) for layer in (base.get_layer("conv1"),
                               block3.get_layer("conv3"),
                               block3.get_layer("bn3"))
           for w in layer.trainable_weights})
  assert len(back.trainable_weights) == 6
  assert not back.get_layer("head").trainable
  np.testing.assert_array_equal(
      back.get_layer("small_base").get_layer("bn1").moving_mean.numpy(),
      model.get_layer("bn1").moving_mean.numpy())
  # The user's model saves and reloads as any Keras model.
  path = str(tmp_path / "back.keras")
  back.save(path)
  np.testing.assert_allclose(
      keras.models.load_model(path).predict(x, verbose=0), want, atol=1e-5)
  # After a reload the original object is gone: a new one from its config.
  loaded = keras.models.load_model(_saved(model, tmp_path))
  again = loaded.to_keras()
  assert again is not source and again.name == source.name
  np.testing.assert_allclose(again.predict(x, verbose=0), want, atol=1e-5)
  assert len(again.trainable_weights) == 6


def test_to_keras_refuses_an_unbuilt_model_and_foreign_modules():
  with pytest.raises(ValueError, match="Build or fit the model before "
                     "to_keras. Received: built=False"):
    split().to_keras()
  module = ti.InterlockModule(keras.layers.Dense(5), name="own")
  model = ti.InterlockModel([module])
  model.build((None, 3))
  with pytest.raises(ValueError, match="not made by from_keras"):
    model.to_keras()


@pytest.mark.slow
def test_to_keras_gives_back_a_gpt2_causal_lm_that_generates(tmp_path):
  import keras_hub  # pylint: disable=import-outside-toplevel
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=32, num_layers=2, num_heads=2, hidden_dim=16,
      intermediate_dim=32, max_sequence_length=8, dropout=0.0)
  causal_lm = keras_hub.models.GPT2CausalLM(backbone=backbone,
                                            preprocessor=None)
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 32, size=(16, 9)).astype("int32")
  x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((16, 8),
                                                             "int32")}
  model = ti.InterlockModel(ti.from_keras(causal_lm, 3), "2wise",
                            placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2), keras.losses
                .SparseCategoricalCrossentropy(from_logits=True))
  before = causal_lm.predict(x, verbose=0)
  model.fit(x, tokens[:, 1:], batch_size=8, epochs=2, verbose=0)
  want = model.predict(x, verbose=0)
  assert np.abs(want - before).max() > 1e-3  # It trained.
  back = model.to_keras()
  assert back is causal_lm
  np.testing.assert_allclose(back.predict(x, verbose=0), want, atol=1e-5)
  prompt = np.zeros((2, 8), "int32")
  prompt[:, :2] = tokens[:2, :2]
  out = back.generate({"token_ids": prompt,
                       "padding_mask": np.arange(8)[None].repeat(2, 0) < 2},
                      stop_token_ids=None)
  assert out["token_ids"].shape == (2, 8)
  np.testing.assert_array_equal(out["token_ids"][:, :2], tokens[:2, :2])
  assert np.all(out["padding_mask"])  # Generated up to the length.
  # From a reloaded split model: a new GPT2CausalLM from the saved config.
  path = str(tmp_path / "gpt2.keras")
  model.save(path)
  again = keras.models.load_model(path).to_keras()
  assert isinstance(again, keras_hub.models.GPT2CausalLM)
  assert again is not causal_lm
  np.testing.assert_allclose(again.predict(x, verbose=0), want, atol=1e-5)


@pytest.mark.slow  # About 14 s on 2 cores; the tests above cover the same.
def test_keras_docs_fine_tuning_example_runs(tmp_path, capsys):
  """docs/keras.md's "Fine-tuning after the split" block, as written."""
  root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
  with open(os.path.join(root, "docs", "keras.md")) as f:
    blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
  block, = [b for b in blocks if "model.to_keras()" in b]
  saved = tmp_path / "fine_tuned.keras"
  exec(block.replace('"/tmp/fine_tuned.keras"', repr(str(saved))), {})  # pylint: disable=exec-used
  assert capsys.readouterr().out.splitlines()[-1] == "True"
  assert saved.exists()
