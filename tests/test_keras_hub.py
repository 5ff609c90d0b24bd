"""keras_hub models through from_keras, tiny random-weight configs (nothing
is downloaded): dict inputs, a padding mask that every block reads, per-token
sample weights that mask padding."""

import os
import subprocess
import sys

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from tests import keras_models
from tf_interlock import export as export_lib
from tf_interlock.keras import split as keras_split
from tf_interlock.keras.model import InterlockModel

# Tiny configurations (random weights, nothing downloaded), in make test;
# the fresh process that loads a saved one is make test-slow's.

VOCAB, LENGTH, BATCH = 32, 8, 4


def gpt2_backbone(seed=0):
  keras.utils.set_random_seed(seed)
  return keras_hub.models.GPT2Backbone(
      vocabulary_size=VOCAB, num_layers=4, num_heads=2, hidden_dim=16,
      intermediate_dim=32, max_sequence_length=LENGTH, dropout=0.0)


def gpt2_lm(seed=0):
  """The backbone as a nested model, a Dense head at every token."""
  backbone = gpt2_backbone(seed)
  inputs = {"token_ids": keras.Input((LENGTH,), dtype="int32",
                                     name="token_ids"),
            "padding_mask": keras.Input((LENGTH,), dtype="int32",
                                        name="padding_mask")}
  return keras.Model(inputs, keras.layers.Dense(VOCAB)(backbone(inputs)))


def gpt2_2wise():
  """gpt2_lm split in 4, compiled for 2-wise training with Adam."""
  model = InterlockModel(keras_split.from_keras(gpt2_lm(), 4),
                         strategy="2wise", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def lm_data(num=2 * BATCH, seed=0):
  return keras_models.lm_data(num, VOCAB, LENGTH, seed)


def test_gpt2_splits_inside_the_backbone_and_every_module_reads_the_mask():
  model = gpt2_lm()
  modules = keras_split.from_keras(model, 4)
  names = [m.layer_names for m in modules]
  # One transformer layer per module (the FLOP balance counts each
  # layer's projections and the aux heads): the embeddings ride with the
  # first, the final norm and head with the last.
  assert [n[-1] for n in names[:3]] == [
      "transformer_layer_0", "transformer_layer_1", "transformer_layer_2"]
  assert names[1] == ["transformer_layer_1"] and names[3][0] == (
      "transformer_layer_3"), names
  x, _, _ = lm_data()
  h = x
  for module in modules[:-1]:
    h = module(h)
    # The hidden state, then the padding mask, crosses every cut.
    assert [t.dtype for t in h] == [tf.float32, tf.int32]
    assert module.aux_logits(h).shape == (2 * BATCH, LENGTH, VOCAB)
  np.testing.assert_allclose(modules[-1](h).numpy(), model(x).numpy(),
                             atol=1e-5)


def test_gpt2_trains_2wise_exports_every_exit_and_reloads(tmp_path):
  x, y, weights = lm_data()
  model = gpt2_2wise()
  history = model.fit(x, y, sample_weight=weights, batch_size=BATCH,
                      epochs=2, shuffle=False, verbose=0).history
  for k in range(1, 5):
    assert np.all(np.isfinite(history[f"module_{k}/loss"])), k
  assert history["loss"][-1] < history["loss"][0]
  path = model.export_saved_model(str(tmp_path / "export"))
  served = export_lib.load_exported(path)
  feed = {key: tf.constant(value) for key, value in x.items()}
  for name, k in (("serving_default", None), ("exit_1", 1), ("exit_2", 2),
                  ("exit_3", 3)):
    want = model.predict(x, exit=k, verbose=0)
    # Each exit predicts every token.
    assert want.shape == (2 * BATCH, LENGTH, VOCAB)
    np.testing.assert_allclose(served.signatures[name](**feed)["logits"],
                               want, atol=1e-4)
  model.save(tmp_path / "lm.keras")
  # Loaded back (here; in a fresh process, as a serving job would, by the
  # slow test below): the same model, the same predictions to the bit.
  loaded = keras.models.load_model(tmp_path / "lm.keras")
  np.testing.assert_array_equal(loaded.predict(x, verbose=0),
                                model.predict(x, verbose=0))


@pytest.mark.slow
def test_gpt2_saved_split_loads_in_a_fresh_process(tmp_path):
  x, y, weights = lm_data()
  model = gpt2_2wise()
  model.fit(x, y, sample_weight=weights, batch_size=BATCH, verbose=0)
  model.save(tmp_path / "lm.keras")
  # Loaded in a fresh process, as a user's serving job would: `import
  # tf_interlock` registers every class the file names.
  np.savez(tmp_path / "x.npz", **x)
  subprocess.run([sys.executable, "-c", _RELOAD, str(tmp_path)], check=True,
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                 capture_output=True, timeout=300)
  np.testing.assert_array_equal(np.load(tmp_path / "predicted.npy"),
                                model.predict(x, verbose=0))


# Loads lm.keras from the folder argv[1] and writes its predictions. The
# model was saved with placement="simulated": its 4 devices come first
# (docs/keras.md).
_RELOAD = r"""
import sys, numpy as np, keras, keras_hub, tf_interlock
tf_interlock.placement.configure_simulated_devices(4)
folder = sys.argv[1]
x = dict(np.load(folder + "/x.npz"))
model = keras.models.load_model(folder + "/lm.keras")
np.save(folder + "/predicted.npy", model.predict(x, verbose=0))
"""


def test_padded_positions_count_in_no_loss():
  # The same batch with other labels at padded positions: every module's
  # weighted loss is the same.
  x, y, weights = lm_data(seed=1)
  other = np.where(weights > 0, y, (y + 5) % VOCAB)
  assert not np.array_equal(other, y)
  model = InterlockModel(keras_split.from_keras(gpt2_lm(), 4),
                         strategy="2wise", placement="simulated")
  model.compile(keras.optimizers.SGD(0.0),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  runs = [model.fit(x, labels, sample_weight=weights, batch_size=BATCH,
                    epochs=1, shuffle=False, verbose=0).history
          for labels in (y, other)]
  for k in range(1, 5):
    key = f"module_{k}/loss"
    np.testing.assert_allclose(runs[0][key], runs[1][key], rtol=1e-6)


def chained(modules, x):
  for module in modules:
    x = module(x)
  return x.numpy()


def test_gemma_rope_and_rms_norm_split_and_train_2wise():
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.GemmaBackbone(
      vocabulary_size=VOCAB, num_layers=2, num_query_heads=2,
      num_key_value_heads=1, hidden_dim=16, intermediate_dim=32, head_dim=8,
      dropout=0.0)
  inputs = {"token_ids": keras.Input((LENGTH,), dtype="int32",
                                     name="token_ids"),
            "padding_mask": keras.Input((LENGTH,), dtype="int32",
                                        name="padding_mask")}
  lm = keras.Model(inputs, keras.layers.Dense(VOCAB)(backbone(inputs)))
  x, y, weights = lm_data(seed=2)
  np.testing.assert_allclose(chained(keras_split.from_keras(lm, 2), x),
                             lm(x).numpy(), atol=1e-5)
  # Fresh modules: built ones keep the device they were built on.
  model = InterlockModel(keras_split.from_keras(lm, 2), strategy="2wise",
                         placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  history = model.fit(x, y, sample_weight=weights, batch_size=BATCH,
                      epochs=1, verbose=0).history
  assert all(np.isfinite(history[f"module_{k}/loss"][0]) for k in (1, 2))


def test_bert_classifier_with_segment_ids_and_padding_mask():
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.BertBackbone(
      vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
      intermediate_dim=32, max_sequence_length=LENGTH, num_segments=2,
      dropout=0.0)
  inputs = {key: keras.Input((LENGTH,), dtype="int32", name=key)
            for key in ("token_ids", "segment_ids", "padding_mask")}
  pooled = backbone(inputs)["pooled_output"]
  classifier = keras.Model(inputs, keras.layers.Dense(3)(pooled))
  rng = np.random.default_rng(3)
  x, _, mask = lm_data(seed=3)
  x["segment_ids"] = (np.arange(LENGTH) >= LENGTH // 2).astype(
      "int32") * x["padding_mask"]
  y = rng.integers(0, 3, size=len(mask)).astype("int32")
  np.testing.assert_allclose(
      chained(keras_split.from_keras(classifier, 3), x),
      classifier(x).numpy(), atol=1e-5)
  model = InterlockModel(keras_split.from_keras(classifier, 3),
                         strategy="2wise", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  history = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0).history
  assert all(np.isfinite(history[f"module_{k}/loss"][0]) for k in (1, 2, 3))
