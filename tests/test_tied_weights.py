"""Tied weights: one layer called in two modules (docs/method.md, "Tied
weights"). Each module holds a copy; the copies' gradients are summed and
every copy takes the same step, so they stay bit-equal, and e2e training
equals plain Keras on the unsplit model."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_interlock.execution_options import ExecutionOptions
from tf_interlock.keras import split as keras_split
from tf_interlock.keras.model import InterlockModel

VOCAB, LENGTH, DIM = 16, 6, 8


def tiny_tied(seed=0):
  """Tokens -> embedding -> two tanh layers -> logits = h E^T (the same
  embedding, reverse=True): a tie between the first and the last layer."""
  keras.utils.set_random_seed(seed)
  embedding = keras.layers.ReversibleEmbedding(VOCAB, DIM, name="emb")
  tokens = keras.Input((LENGTH,), dtype="int32", name="tokens")
  h = embedding(tokens)
  h = keras.layers.Dense(DIM, activation="tanh", name="d1")(h)
  h = keras.layers.Dense(DIM, activation="tanh", name="d2")(h)
  return keras.Model(tokens, embedding(h, reverse=True))


def lm_data(num=16, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, VOCAB, size=(num, LENGTH + 1)).astype("int32")
  return tokens[:, :-1], tokens[:, 1:]


def copies(model, name="emb"):
  """The embedding matrix of every module that holds a copy of the tie."""
  found = []
  for module in model.modules:
    for layer_name, key in module.body.tied_layers.items():
      if key == name:
        found.append(module.body.model.get_layer(layer_name).embeddings
                     .numpy())
  return found


def sce():
  return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.mark.parametrize("strategy, want", [
    # L = 0.1 (logit_0 + logit_1) with logits = w e_0 (e_0, e_1), e = (2, 3),
    # w = 4, token 0. Head copy: dL/de_j = 0.1 w h_1 = 0.8 for both rows.
    # Lookup copy, row 0: e2e dL/dh_1 = 0.1 w (e_0 + e_1) = 2.0; local
    # dL_1/dh_1 through the head A_1(h) = (h, h): 0.2. Summed, SGD(1):
    ("e2e", [2.0 - 2.8, 3.0 - 0.8]),
    ("local", [2.0 - 1.0, 3.0 - 0.8]),
])
def test_one_step_of_a_tied_embedding_is_the_hand_worked_sum(strategy, want):
  embedding = keras.layers.ReversibleEmbedding(2, 1, name="emb")
  tokens = keras.Input((1,), dtype="int32")
  h = keras.layers.Dense(1, use_bias=False, name="w",
                         kernel_initializer=keras.initializers.Constant(4.0))(
                             embedding(tokens))
  model = keras.Model(tokens, embedding(h, reverse=True))
  embedding.set_weights([np.array([[2.0], [3.0]], "float32")])
  modules = keras_split.from_keras(
      model, 2, split=["emb"], aux_head=lambda k, shape: keras.layers.Dense(
          2, use_bias=False, kernel_initializer="ones"))
  assert [m.layer_names for m in modules] == [["emb"], ["w", "emb_call2"]]
  interlock = InterlockModel(modules, strategy=strategy,
                             placement="simulated")
  interlock.compile(keras.optimizers.SGD(1.0),
                    lambda y, z: 0.1 * tf.reduce_sum(z, axis=[1, 2]))
  interlock.train_on_batch(np.zeros((1, 1), "int32"),
                           np.zeros((1, 1), "int32"))
  first, last = copies(interlock)
  np.testing.assert_allclose(first.ravel(), want, atol=1e-6)
  np.testing.assert_array_equal(first, last)
  np.testing.assert_allclose(interlock.get_layer("w").kernel.numpy(),
                             [[4.0 - 1.0]], atol=1e-6)


def test_e2e_with_a_tie_equals_plain_keras_fit():
  x, y = lm_data()
  plain = tiny_tied()
  interlock = InterlockModel(keras_split.from_keras(plain, 3, split=[1, 1, 2]),
                             strategy="e2e", placement="simulated")
  interlock.compile(keras.optimizers.SGD(0.5), sce())
  plain.compile(keras.optimizers.SGD(0.5), sce())
  for model in (interlock, plain):
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
  want = plain.get_layer("emb").embeddings.numpy()
  first, last = copies(interlock)
  np.testing.assert_allclose(first, want, atol=1e-5)
  np.testing.assert_array_equal(first, last)
  np.testing.assert_allclose(interlock.get_layer("d2").kernel.numpy(),
                             plain.get_layer("d2").kernel.numpy(), atol=1e-5)


@pytest.mark.parametrize("optimizer", [
    keras.optimizers.SGD(0.5, momentum=0.9),
    keras.optimizers.Adam(1e-2),
])
def test_the_copies_stay_bit_equal_under_2wise(optimizer):
  x, y = lm_data(num=32)
  source = tiny_tied()
  before = source.get_layer("emb").embeddings.numpy()
  interlock = InterlockModel(keras_split.from_keras(source, 3, split=[1, 1, 2]),
                             strategy="2wise", placement="simulated")
  interlock.compile(optimizer, sce())
  interlock.fit(x, y, batch_size=8, epochs=2, verbose=0)
  first, last = copies(interlock)
  assert not np.allclose(first, before)
  np.testing.assert_array_equal(first, last)


def test_local_with_a_tie_of_the_first_and_last_module_loops():
  # Module 1's update waits for module 3's gradient of the head copy, so
  # on CPUs "auto" loops one traced step (`step_loop.resolve_loop`): the
  # same weights, bit for bit, as the steps written out.
  x, y = lm_data(num=32)
  weights, graphs = {}, {}
  for loop in ("auto", "unrolled"):
    interlock = InterlockModel(
        keras_split.from_keras(tiny_tied(), 3, split=[1, 1, 2]),
        strategy="local", placement="simulated")
    interlock.compile(keras.optimizers.Adam(1e-2), sce(),
                      steps_per_execution=4,
                      execution_options=ExecutionOptions(loop=loop))
    interlock.fit(x, y, batch_size=8, epochs=2, verbose=0)
    weights[loop] = [w.numpy() for w in interlock.weights]
    graphs[loop] = [op.type for op in interlock.trainer.loop_function(4)
                    .get_concrete_function(
                        iter(interlock.trainer.distribute_dataset(
                            tf.data.Dataset.from_tensor_slices((x, y))
                            .batch(8, drop_remainder=True).repeat()))).graph
                    .get_operations()]
  assert "While" in graphs["auto"] and "While" not in graphs["unrolled"]
  first, last = copies(interlock)
  assert not np.allclose(first, tiny_tied().get_layer("emb").embeddings)
  np.testing.assert_array_equal(first, last)
  for a, b in zip(weights["auto"], weights["unrolled"]):
    np.testing.assert_array_equal(a, b)


def test_a_tie_inside_one_module_is_one_layer_as_in_keras():
  keras.utils.set_random_seed(1)
  shared = keras.layers.Dense(4, activation="tanh", name="shared")
  inputs = keras.Input((4,))
  h = keras.layers.Dense(4, activation="relu", name="d0")(inputs)
  plain = keras.Model(inputs, keras.layers.Dense(3, name="out")(
      shared(shared(h))))
  modules = keras_split.from_keras(plain, 2, split=[1, 3])
  assert [m.layer_names for m in modules] == [["d0"], ["shared", "out"]]
  assert [m.body.tied_layers for m in modules] == [{}, {}]
  x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
  y = np.random.default_rng(1).integers(0, 3, size=16)
  interlock = InterlockModel(modules, strategy="e2e", placement="simulated")
  for model in (interlock, plain):
    model.compile(keras.optimizers.SGD(0.5), sce())
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
  np.testing.assert_allclose(interlock.get_layer("shared").kernel.numpy(),
                             plain.get_layer("shared").kernel.numpy(),
                             atol=1e-6)
  np.testing.assert_allclose(interlock.predict(x, verbose=0),
                             plain.predict(x, verbose=0), atol=1e-5)


def test_a_layer_called_twice_across_a_cut_is_tied():
  shared = keras.layers.Dense(4, name="shared")
  inputs = keras.Input((4,))
  plain = keras.Model(inputs, shared(shared(inputs)))
  modules = keras_split.from_keras(plain, 2, split=[1, 1])
  assert [m.body.tied_layers for m in modules] == [
      {"shared": "shared"}, {"shared_call2": "shared"}]
  x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
  h = modules[1](modules[0](x))
  np.testing.assert_allclose(h.numpy(), plain(x).numpy(), atol=1e-6)


def test_save_and_reload_keeps_the_tie(tmp_path):
  x, y = lm_data()
  interlock = InterlockModel(
      keras_split.from_keras(tiny_tied(), 3, split=[1, 1, 2]),
      strategy="local", placement="simulated")
  interlock.compile(keras.optimizers.Adam(1e-2), sce())
  interlock.fit(x, y, batch_size=8, epochs=1, verbose=0)
  interlock.save(tmp_path / "tied.keras")
  again = keras.models.load_model(tmp_path / "tied.keras")
  np.testing.assert_array_equal(again.predict(x, verbose=0),
                                interlock.predict(x, verbose=0))
  # Still one weight: training the reloaded model keeps the copies equal
  # (untied, local learning would move them apart at once).
  again.fit(x, y, batch_size=8, epochs=1, verbose=0)
  first, last = copies(again)
  assert not np.array_equal(first, copies(interlock)[0])
  np.testing.assert_array_equal(first, last)


@pytest.mark.parametrize("optimizer, frozen, match", [
    ([keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1),
      keras.optimizers.SGD(0.2)], None, "optimizers with one configuration"),
    (keras.optimizers.SGD(0.1, global_clipnorm=1.0), None,
     "global_clipnorm=1.0"),
    ("sgd", 2, r"trained in modules \[1\] and frozen"),
])
def test_a_tie_the_modules_cannot_keep_equal_is_refused(optimizer, frozen,
                                                        match):
  x, y = lm_data()
  interlock = InterlockModel(
      keras_split.from_keras(tiny_tied(), 3, split=[1, 1, 2]),
      strategy="2wise", placement="simulated")
  if frozen is not None:
    interlock.modules[frozen].trainable = False
  interlock.compile(optimizer, sce())
  with pytest.raises(ValueError, match=match):
    interlock.fit(x, y, batch_size=8, epochs=1, verbose=0)


@pytest.mark.slow
def test_gpt2_causal_lm_trains_2wise_with_its_tied_head():
  import keras_hub  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=64, num_layers=4, num_heads=2, hidden_dim=32,
      intermediate_dim=64, max_sequence_length=32, dropout=0.0)
  causal_lm = keras_hub.models.GPT2CausalLM(backbone=backbone,
                                            preprocessor=None)
  modules = keras_split.from_keras(causal_lm, 4)
  # The embedding's lookup in module 1, its reverse (the LM head) in 4.
  assert [bool(m.body.tied_layers) for m in modules] == [True, False, False,
                                                         True]
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 64, size=(16, 33)).astype("int32")
  mask = np.ones((16, 32), "int32")
  mask[:, 24:] = 0
  x = {"token_ids": tokens[:, :-1] * mask, "padding_mask": mask}
  interlock = InterlockModel(modules, strategy="2wise", placement="simulated")
  interlock.compile(keras.optimizers.Adam(1e-2), sce())
  history = interlock.fit(x, tokens[:, 1:] * mask,
                          sample_weight=mask.astype("float32"), batch_size=8,
                          epochs=3, shuffle=False, verbose=0).history
  assert np.all(np.isfinite(history["loss"]))
  assert history["loss"][-1] < history["loss"][0]
  key = next(iter(modules[0].body.tied_layers.values()))
  first, last = copies(interlock, key)
  np.testing.assert_array_equal(first, last)
