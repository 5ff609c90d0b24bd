"""Small models and losses shared by the engine tests."""

import keras
import numpy as np
import tensorflow as tf

from layers.interlock_module import InterlockModule

NUM_CLASSES = 5


def cross_entropy(labels, logits):
  return tf.nn.sparse_softmax_cross_entropy_with_logits(
      tf.cast(labels, tf.int32), tf.cast(logits, tf.float32))


def mlp_layers(num_modules, width=16, seed=0, batch_norm=False):
  """Per-module layer lists and aux heads of a random MLP, K modules."""
  init = lambda i: keras.initializers.GlorotUniform(seed=seed * 100 + i)  # noqa
  bodies, heads = [], []
  for k in range(num_modules):
    body = [keras.layers.Dense(width, activation="relu",
                               kernel_initializer=init(2 * k))]
    if batch_norm:
      body.append(keras.layers.BatchNormalization(synchronized=True))
    if k == num_modules - 1:
      body.append(keras.layers.Dense(NUM_CLASSES,
                                     kernel_initializer=init(2 * k + 1)))
      heads.append(None)
    else:
      heads.append(keras.layers.Dense(NUM_CLASSES,
                                      kernel_initializer=init(2 * k + 1)))
    bodies.append(body)
  return bodies, heads


def mlp_modules(num_modules, **kwargs):
  bodies, heads = mlp_layers(num_modules, **kwargs)
  return [InterlockModule(b, aux_head=h) for b, h in zip(bodies, heads)]


def batch(size=8, dim=6, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(size, dim)).astype("float32")
  y = rng.integers(0, NUM_CLASSES, size=(size,)).astype("int32")
  return x, y


def repeat_dataset(x, y):
  return tf.data.Dataset.from_tensors((x, y)).repeat()


def weights(modules):
  return [v.numpy().copy() for m in modules for v in m.weights]


def stacked_forward(modules, x, training=False):
  """Stacked forward pass: (final output, [aux logits of modules 1..K-1])."""
  aux = []
  for module in modules:
    h = module.forward(x, training=training)
    if module.has_aux_head:
      aux.append(module.aux_logits(h, training=training))
    x = h
  return x, aux


def assert_keras_round_trip(model, inputs, path):
  """Saves `model` as a .keras file, reloads it, compares every output.

  Returns:
    The reloaded model.
  """
  expected = model(inputs)
  model.save(path)
  restored = keras.saving.load_model(path)
  for a, b in zip(tf.nest.flatten(restored(inputs)),
                  tf.nest.flatten(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  return restored


def assert_aux_head_reloaded(restored, module, inputs):
  """The reloaded copy of `module` (found by name) gives the same aux
  logits on `inputs` as `module`."""
  copy = restored.get_layer(module.name)
  np.testing.assert_allclose(copy.aux_logits(copy(inputs)),
                             module.aux_logits(module(inputs)),
                             rtol=1e-5, atol=1e-6)
