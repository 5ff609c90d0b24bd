"""from_keras on models with several inputs: boundaries that carry a nest.

A mask input read by every block must reach every module (it rides along
each boundary without a cotangent); fit, predict, export and .keras saving
take the inputs as the model does (a dict by key, or a list)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_interlock import export as export_lib
from tf_interlock.keras import split as keras_split
from tf_interlock.keras.model import InterlockModel

BATCH, WIDTH = 4, 6


def masked_mlp(seed=0, as_list=False):
  """Dense blocks, each multiplied by a 0/1 integer mask input."""
  keras.utils.set_random_seed(seed)
  x_in = keras.Input((WIDTH,), name="x")
  m_in = keras.Input((WIDTH,), dtype="int32", name="mask")
  h = x_in
  for _ in range(3):
    h = keras.layers.Dense(WIDTH, activation="relu")(h)
    h = keras.layers.Multiply()([h, keras.ops.cast(m_in, "float32")])
  out = keras.layers.Dense(4)(h)
  inputs = [x_in, m_in] if as_list else {"x": x_in, "mask": m_in}
  return keras.Model(inputs, out)


def data(num=4 * BATCH, seed=0):
  rng = np.random.default_rng(seed)
  return ({"x": rng.normal(size=(num, WIDTH)).astype("float32"),
           "mask": rng.integers(0, 2, size=(num, WIDTH)).astype("int32")},
          rng.integers(0, 4, size=num).astype("int32"))


def test_the_mask_reaches_every_module_and_rides_without_gradient():
  model = masked_mlp()
  x, _ = data()
  modules = keras_split.from_keras(model, 3)
  h = x
  for k, module in enumerate(modules):
    h = module(h)
    if k < 2:
      # The hidden state first (the aux head reads it), then the mask.
      assert [t.dtype for t in h] == [tf.float32, tf.int32]
      np.testing.assert_array_equal(h[1], x["mask"])
      assert module.aux_logits(h).shape == (4 * BATCH, 4)
  np.testing.assert_allclose(h.numpy(), model(x).numpy(), atol=1e-6)


def test_two_input_e2e_fit_equals_plain_keras_fit():
  x, y = data(seed=1)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  plain = masked_mlp()
  plain.compile(keras.optimizers.Adam(1e-2), loss)
  want = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                   verbose=0)
  model = InterlockModel(keras_split.from_keras(masked_mlp(), 3),
                         strategy="e2e", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2), loss, steps_per_execution=2)
  got = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                  verbose=0)
  np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                             rtol=1e-5)
  np.testing.assert_allclose(model.predict(x, verbose=0),
                             plain.predict(x, verbose=0), atol=1e-6)


def test_two_input_2wise_exports_every_exit_and_reloads(tmp_path):
  x, y = data(seed=2)
  model = InterlockModel(keras_split.from_keras(masked_mlp(), 3),
                         strategy="2wise", placement="simulated")
  model.compile(keras.optimizers.SGD(0.1), metrics=["accuracy"])
  history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                      validation_split=0.25).history
  assert all(np.isfinite(history[f"module_{k}/loss"]).all()
             for k in (1, 2, 3))
  path = model.export_saved_model(str(tmp_path / "export"))
  loaded = export_lib.load_exported(path)
  feed = {key: tf.constant(value) for key, value in x.items()}
  for name, k in (("serving_default", None), ("exit_1", 1), ("exit_2", 2)):
    served = loaded.signatures[name](**feed)["logits"]
    np.testing.assert_allclose(served, model.predict(x, exit=k, verbose=0),
                               atol=1e-5)
  model.save(tmp_path / "model.keras")
  again = keras.models.load_model(tmp_path / "model.keras")
  np.testing.assert_array_equal(again.predict(x, verbose=0),
                                model.predict(x, verbose=0))


def test_list_inputs_are_taken_as_a_list():
  model = masked_mlp(as_list=True)
  x, y = data(seed=3)
  x = [x["x"], x["mask"]]
  interlock = InterlockModel(keras_split.from_keras(model, 2),
                             strategy="local", placement="simulated")
  interlock.compile(keras.optimizers.SGD(0.0))
  interlock.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
  np.testing.assert_allclose(interlock.predict(x, verbose=0),
                             model.predict(x, verbose=0), atol=1e-6)


def test_two_outputs_are_one_line():
  x_in = keras.Input((WIDTH,))
  two = keras.Model(x_in, [keras.layers.Dense(2)(x_in),
                           keras.layers.Dense(3)(x_in)])
  with pytest.raises(ValueError, match=r"one output .* has 2: \['\w+', "
                     r"'\w+'\]. Concatenate .*Received: model="):
    keras_split.from_keras(two, 2)


@pytest.mark.parametrize("how", ["microbatches", "replicas"])
def test_a_nest_boundary_splits_into_microbatches_and_replicas(how, mirrored):
  # Every leaf of the nest (features and the mask that rides along) is cut
  # the same way: 2 microbatches, or 2 replicas of a MirroredStrategy, train
  # the weights one whole batch does (the loss is averaged over the global
  # batch, so the parts' gradients sum to the batch's).
  x, y = data(seed=4)

  def trained(**options):
    model = InterlockModel(keras_split.from_keras(masked_mlp(), 3),
                           strategy="2wise", **options)
    model.compile(keras.optimizers.SGD(0.5))
    model.fit(x, y, batch_size=2 * BATCH, epochs=1, shuffle=False,
              verbose=0)
    return [w.numpy() for w in model.weights]

  whole = trained()
  parts = trained(**({"num_microbatches": 2} if how == "microbatches" else
                     {"distribute": mirrored}))
  first_kernel = masked_mlp().weights[0].numpy()
  assert len(whole) == len(parts)
  for a, b in zip(whole, parts):
    np.testing.assert_allclose(a, b, atol=1e-5)
  # The steps moved module 1's first kernel (not a comparison of untouched
  # weights).
  assert whole[0].shape == first_kernel.shape
  assert not np.allclose(whole[0], first_kernel)
