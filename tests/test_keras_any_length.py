"""from_keras on models that take any sequence length: an input dimension
of None never crashes the balance."""

import keras
import keras_hub
import numpy as np
import pytest

import tf_interlock as ti

VOCAB, LENGTH, BATCH, WIDTH = 32, 8, 4, 16


def any_length_mlp(seed=0):
  """Per-position Dense layers over sequences of any length."""
  keras.utils.set_random_seed(seed)
  return keras.Sequential([keras.Input((None, 4))] + [
      keras.layers.Dense(width, activation="relu")
      for width in (64, 8, 8, 8)] + [keras.layers.Dense(3)])


def test_an_unknown_length_counts_alike_in_every_layer():
  # The first Dense is 4 x 64 multiply-adds per position, the others
  # 64 x 8 and 8 x 8: with the length unknown, the balance still puts the
  # two costly layers in modules of their own.
  modules = ti.from_keras(any_length_mlp(), 3)
  names = [m.layer_names for m in modules]
  assert [len(n) for n in names] == [1, 1, 3], names
  x = np.random.default_rng(0).normal(size=(2, 5, 4)).astype("float32")
  h = x
  for module in modules:
    h = module.body(h)
  np.testing.assert_allclose(h, any_length_mlp()(x), atol=1e-6)


def test_time_balance_with_an_unknown_length_asks_for_a_sample():
  with pytest.raises(ValueError, match=r"unknown dimension needs sample= "
                     r".*Received: sample=None"):
    ti.from_keras(any_length_mlp(), 2, balance="time")
  x = np.zeros((2, 5, 4), "float32")
  assert len(ti.from_keras(any_length_mlp(), 2, balance="time",
                           sample=x)) == 2


class CountedDense(keras.layers.Dense):
  """A Dense whose own `flops` needs a known length."""

  def flops(self, input_shape):
    raise ValueError(f"length unknown in {input_shape}")


def test_a_layer_whose_cost_cannot_be_counted_names_the_balance_to_pass():
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((None, 4)),
                            CountedDense(8, activation="relu", name="own"),
                            keras.layers.Dense(8, activation="relu"),
                            keras.layers.Dense(3)])
  with pytest.raises(ValueError, match=r"layer 'own' .*pass "
                     r"balance='params'.*Received: balance='flops'"):
    ti.from_keras(model, 2)
  assert len(ti.from_keras(model, 2, balance="params")) == 2


def gpt2_any_length(seed=0):
  """keras_hub's GPT2Backbone on its own `(None,)` inputs, a Dense head."""
  keras.utils.set_random_seed(seed)
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=VOCAB, num_layers=4, num_heads=2, hidden_dim=WIDTH,
      intermediate_dim=32, max_sequence_length=LENGTH, dropout=0.0)
  assert backbone.input["token_ids"].shape == (None, None)
  return keras.Model(backbone.input,
                     keras.layers.Dense(VOCAB)(backbone.output))


def lm_data(num=2 * BATCH, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, VOCAB, size=(num, LENGTH + 1)).astype("int32")
  mask = np.ones((num, LENGTH), "int32")
  return ({"token_ids": tokens[:, :-1], "padding_mask": mask},
          tokens[:, 1:])


@pytest.mark.slow
def test_gpt2_backbone_of_any_length_splits_trains_and_reloads(tmp_path):
  x, y = lm_data()
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  plain = gpt2_any_length()
  plain.compile(keras.optimizers.Adam(1e-3), loss)
  want = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                   verbose=0)
  modules = ti.from_keras(gpt2_any_length(), 3)
  # The unknown length counts as 1 in every cost alike
  # (`keras.flops.known`): the four transformer layers are dealt 1, 1, 2,
  # modules 1 and 2 each also running a per-token aux head.
  assert [sum(n.startswith("transformer_layer") for n in m.layer_names)
          for m in modules] == [1, 1, 2], [m.layer_names for m in modules]
  model = ti.InterlockModel(modules, strategy="e2e", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-3), loss)
  got = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                  verbose=0)
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
  # Another length than the one it trained on.
  short = {key: value[:, :5] for key, value in x.items()}
  np.testing.assert_allclose(restored.predict(short, verbose=0),
                             plain.predict(short, verbose=0), atol=1e-5)
