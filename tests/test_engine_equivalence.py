"""The routed step against independent references: one big tape, plain
Keras end to end, and K separately trained local networks."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tf_interlock import strategy as strategy_lib
from tf_interlock.trainer import InterlockTrainer

K = 4


def _reference_grads(modules, x, y, strategy):
  """tape.gradient(L_j, theta_k) on the un-cut network, summed per rule."""
  with tf.GradientTape(persistent=True) as tape:
    h, losses = tf.constant(x), []
    for k, module in enumerate(modules):
      h = module.body(h, training=True)
      logits = h if k == K - 1 else module.aux_head(h, training=True)
      losses.append(tf.reduce_mean(helpers.cross_entropy(y, logits)))
  n = strategy.effective_window(K)
  grads = []
  for k, module in enumerate(modules):
    target = min(k + n - 1, K - 1)
    sources = ([target] if strategy.variant == "only" or n >= K
               else range(k, target + 1))
    theta = module.body.trainable_variables
    total = [tf.zeros_like(v) for v in theta]
    for j in sources:
      total = [t + g for t, g in zip(total, tape.gradient(losses[j], theta))]
    if module.has_aux_head:
      total += tape.gradient(losses[k], module.aux_head.trainable_variables)
    grads.append([g.numpy() for g in total])
  return grads


@pytest.mark.parametrize("window", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("variant", ["only", "sum"])
def test_each_update_matches_big_tape(window, variant):
  strategy = strategy_lib.InterlockStrategy(window, variant)
  x, y = helpers.batch()
  modules = helpers.mlp_modules(K, seed=window)
  trainer = InterlockTrainer(modules, lambda k: keras.optimizers.SGD(1.0),
                             strategy, loss_fn=helpers.cross_entropy,
                             metric_fn=None)
  trainer.build(x)
  before = [[v.numpy() for v in trainer.variables(k)] for k in range(K)]
  expected = _reference_grads(modules, x, y, strategy)
  trainer.train_loop(iter(trainer.distribute_dataset(
      helpers.repeat_dataset(x, y))))
  for k in range(K):
    after = [v.numpy() for v in trainer.variables(k)]
    for b, a, g in zip(before[k], after, expected[k]):
      np.testing.assert_allclose(b - a, g, atol=1e-6)
    # Routing off by one module would use another loss: make sure the
    # reference itself is not degenerate.
    assert any(np.abs(g).max() > 1e-4 for g in expected[k])


@pytest.mark.parametrize("with_heads", [True, False])
def test_e2e_equals_plain_keras(with_heads):
  x, y = helpers.batch(size=16)
  eval_x, _ = helpers.batch(size=4, seed=1)
  bodies, heads = helpers.mlp_layers(K, seed=3)
  modules = helpers.mlp_modules(K, seed=3)
  if not with_heads:
    modules = [type(m)(m.body) for m in modules]
  trainer = InterlockTrainer(
      modules, lambda k: keras.optimizers.Adam(0.01), "e2e",
      loss_fn=helpers.cross_entropy, metric_fn=None)
  trainer.build(x)
  plain = keras.Sequential([l for body in bodies for l in body])
  plain.build((None, x.shape[1]))
  plain.set_weights([w for m in modules for w in m.body.get_weights()])
  plain.compile(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  iterator = iter(trainer.distribute_dataset(helpers.repeat_dataset(x, y)))

  def ours(inputs):
    for m in modules:
      inputs = m.body(inputs, training=False)
    return inputs.numpy()

  initial = ours(eval_x)
  for _ in range(10):
    trainer.train_loop(iterator)
    plain.train_on_batch(x, y)
    np.testing.assert_allclose(ours(eval_x), plain(eval_x).numpy(),
                               atol=1e-5)
  assert np.abs(ours(eval_x) - initial).max() > 1e-2


def test_local_equals_separately_trained_networks():
  x, y = helpers.batch(size=16)
  modules = helpers.mlp_modules(K, seed=5)
  trainer = InterlockTrainer(
      modules, lambda k: keras.optimizers.Adam(0.01), "local",
      loss_fn=helpers.cross_entropy, metric_fn=None)
  trainer.build(x)
  # K independent Keras networks: body_k followed by its aux head (the last
  # one ends with the output layer), each with its own optimizer and loss.
  bodies, heads = helpers.mlp_layers(K, seed=5)
  nets = []
  for k in range(K):
    net = keras.Sequential(bodies[k] + ([heads[k]] if heads[k] else []))
    net.build((None, x.shape[1] if k == 0 else 16))
    net.set_weights(modules[k].body.get_weights() + (
        modules[k].aux_head.get_weights() if heads[k] else []))
    net.compile(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
    nets.append(net)
  iterator = iter(trainer.distribute_dataset(helpers.repeat_dataset(x, y)))
  for _ in range(5):
    inputs, h = [], x
    for k in range(K):  # every network's input, from pre-update weights
      inputs.append(h)
      h = keras.Sequential(bodies[k])(h).numpy()
    for k in range(K):
      nets[k].train_on_batch(inputs[k], y)
    trainer.train_loop(iterator)
  for k in range(K):
    ours = modules[k].body.get_weights() + (
        modules[k].aux_head.get_weights() if heads[k] else [])
    for a, b in zip(ours, nets[k].get_weights()):
      np.testing.assert_allclose(a, b, atol=1e-5)
