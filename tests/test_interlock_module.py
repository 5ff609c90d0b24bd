"""`InterlockModule`: the gradient cut, serialization and mixed precision."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers.interlock_module import InterlockModule
from tests import helpers
from tf_interlock.trainer import InterlockTrainer


def _module():
  return InterlockModule(
      [keras.layers.Dense(4, activation="relu"), keras.layers.Dense(3)],
      aux_head=keras.layers.Dense(2), name="m1")


def test_outputs_and_cut():
  module = _module()
  x = tf.random.normal([5, 6])
  with tf.GradientTape() as tape:
    tape.watch(x)
    h = module(x)
    aux = module.aux_logits(h)
    loss = tf.reduce_sum(h) + tf.reduce_sum(aux)
  # One return type: h_k, with or without a head; the head reads h_k.
  assert h.shape == (5, 3) and aux.shape == (5, 2)
  # No gradient crosses the module's input boundary implicitly.
  assert tape.gradient(loss, x) is None
  assert module.compute_output_shape((None, 6)) == (None, 3)


def test_without_head_returns_output_only():
  module = InterlockModule(keras.layers.Dense(3))
  assert module(tf.ones([2, 4])).shape == (2, 3)
  with pytest.raises(ValueError, match="has no auxiliary head"):
    module.aux_logits(tf.ones([2, 3]))


def test_config_round_trip_and_keras_file(tmp_path):
  module = _module()
  x = tf.random.normal([2, 6])
  h = module(x)
  aux = module.aux_logits(h)
  clone = InterlockModule.from_config(module.get_config())
  clone.build((None, 6))
  clone.set_weights(module.get_weights())
  np.testing.assert_allclose(clone(x), h, atol=1e-6)
  np.testing.assert_allclose(clone.aux_logits(clone(x)), aux, atol=1e-6)
  assert clone.get_config()["name"] == "m1"
  # A full .keras save of a model made of modules reloads with equal
  # outputs, the aux head's included.
  inputs = keras.Input((6,))
  model = keras.Model(inputs, module(inputs))
  loaded = helpers.assert_keras_round_trip(model, x, tmp_path / "m.keras")
  helpers.assert_aux_head_reloaded(loaded, module, x)


@pytest.mark.parametrize("body,head,match", [
    ([], None, r"Received: body=\[\]"),
    ("dense", None, "Received: body='dense'"),
    (keras.layers.Dense(2), "head", "Received: aux_head='head'"),
])
def test_bad_construction(body, head, match):
  with pytest.raises((ValueError, TypeError), match=match):
    InterlockModule(body, aux_head=head)


def test_mixed_bfloat16_training():
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    modules = helpers.mlp_modules(3)
  finally:
    keras.mixed_precision.set_global_policy("float32")
  x, y = helpers.batch(size=8)
  trainer = InterlockTrainer(modules, lambda k: keras.optimizers.SGD(0.5),
                             "2wise", loss_fn=helpers.cross_entropy)
  trainer.build(x)
  assert modules[0](x).dtype == tf.bfloat16
  assert modules[0].weights[0].dtype == "float32"
  before = helpers.weights(modules)
  iterator = iter(trainer.distribute_dataset(helpers.repeat_dataset(x, y)))
  first = trainer.train_loop(iterator)
  for _ in range(5):
    last = trainer.train_loop(iterator)
  assert all(np.isfinite(v) for v in last.values())
  assert last["module_3/loss"] < first["module_3/loss"]
  assert all(not np.array_equal(a, b)
             for a, b in zip(before, helpers.weights(modules)))
