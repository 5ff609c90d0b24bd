"""MirroredStrategy equivalence, checkpoints and bad input for the trainer."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tf_interlock.trainer import InterlockTrainer

K = 3


def _train(distribute, strategy, steps=3, batch_norm=True, steps_per_loop=1):
  x, y = helpers.batch(size=8)
  with distribute.scope():
    modules = helpers.mlp_modules(K, seed=7, batch_norm=batch_norm)
  trainer = InterlockTrainer(
      modules, lambda k: keras.optimizers.SGD(0.1, momentum=0.9), strategy,
      loss_fn=helpers.cross_entropy, distribute=distribute,
      metric_fn=lambda y, l: tf.cast(tf.equal(
          tf.argmax(l, -1, output_type=tf.int32), y), tf.float32),
      steps_per_loop=steps_per_loop)
  trainer.build(x)
  iterator = iter(trainer.distribute_dataset(
      helpers.repeat_dataset(x, y)))
  metrics = [trainer.train_loop(iterator) for _ in range(steps)]
  return helpers.weights(modules), metrics, trainer


@pytest.mark.parametrize("strategy", ["2wise", "e2e", "local"])
def test_two_replicas_equal_one(strategy, mirrored):
  one, m_one, _ = _train(tf.distribute.get_strategy(), strategy)
  two, m_two, trainer = _train(mirrored, strategy)
  assert trainer.distribute.num_replicas_in_sync == 2
  # Weights, BN moving statistics (synchronized) and optimizer all agree.
  for a, b in zip(one, two):
    np.testing.assert_allclose(a, b, atol=2e-5)
  for a, b in zip(m_one, m_two):
    assert a.keys() == b.keys()
    for key in a:
      if not key.endswith("grad_norm"):  # replica-local by definition
        np.testing.assert_allclose(a[key], b[key], atol=2e-5)
  assert int(trainer.optimizers[0].iterations.numpy()) == 3


def test_steps_per_loop_equals_single_steps():
  one, m_one, _ = _train(tf.distribute.get_strategy(), "2wise", steps=4)
  loop, m_loop, trainer = _train(tf.distribute.get_strategy(), "2wise",
                                 steps=2, steps_per_loop=2)
  for a, b in zip(one, loop):
    np.testing.assert_allclose(a, b, atol=1e-5)
  assert int(trainer.optimizers[-1].iterations.numpy()) == 4
  # A loop reports the mean of its steps' metrics.
  np.testing.assert_allclose(
      m_loop[1]["module_3/loss"],
      (m_one[2]["module_3/loss"] + m_one[3]["module_3/loss"]) / 2, rtol=1e-5)


def test_checkpoint_restores_everything(tmp_path):
  x, y = helpers.batch(size=8)
  dataset = helpers.repeat_dataset(x, y)

  def make(seed):
    modules = helpers.mlp_modules(K, seed=seed, batch_norm=True)
    trainer = InterlockTrainer(modules, lambda k: keras.optimizers.Adam(0.01),
                               "2wise", loss_fn=helpers.cross_entropy)
    trainer.build(x)
    return trainer

  trained = make(seed=1)
  iterator = iter(trained.distribute_dataset(dataset))
  for _ in range(3):
    trained.train_loop(iterator)
  path = trained.checkpoint().save(str(tmp_path / "ckpt"))
  at_save = _state(trained)
  expected_next = trained.train_loop(iterator)

  fresh = make(seed=2)
  before = _state(fresh)
  fresh.checkpoint().restore(path).assert_consumed()
  after = _state(fresh)
  assert len(after) == len(at_save) > 6 * K
  for (name, b), (_, a), (_, s) in zip(before, after, at_save):
    np.testing.assert_array_equal(a, s)
    # Fresh weights, slots and step counters differ from the trained ones:
    # the restore really changed every one of them (the constant learning
    # rate aside).
    assert name.endswith("learning_rate") or not np.array_equal(b, s), name
  got = fresh.train_loop(iter(fresh.distribute_dataset(dataset)))
  for key, value in expected_next.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-5)
  assert int(fresh.optimizers[0].iterations.numpy()) == 4


def _state(trainer):
  """Every module weight (theta, phi, BN statistics) and optimizer variable."""
  return [(v.path, v.numpy().copy()) for m in trainer.modules
          for v in m.weights] + [(v.path, v.numpy().copy())
                                 for o in trainer.optimizers
                                 for v in o.variables]


def test_mismatched_optimizers():
  modules = helpers.mlp_modules(K)
  with pytest.raises(ValueError, match=r"Received: len\(optimizers\)=2"):
    InterlockTrainer(modules, [keras.optimizers.SGD(), keras.optimizers.SGD()])
  opt = keras.optimizers.SGD()
  with pytest.raises(ValueError, match="own optimizer"):
    InterlockTrainer(modules, [opt] * K)


def test_optimizer_outside_scope_rejected(mirrored):
  outside = [keras.optimizers.SGD() for _ in range(K)]
  with pytest.raises(ValueError, match="module 1 was created outside "
                     "distribute.scope"):
    InterlockTrainer(helpers.mlp_modules(K), outside, distribute=mirrored)


@pytest.mark.parametrize("kwargs,match", [
    ({"strategy": "0wise"}, "Received: strategy='0wise'"),
    ({"strategy": "2-wise"}, "did you mean '2wise'"),
    ({"strategy": 0}, "Received: window=0"),
    ({"strategy": "2wise", "variant": "avg"}, "Received: variant='avg'"),
    ({"steps_per_loop": 0}, "Received: steps_per_loop=0"),
    ({"num_microbatches": 1.5}, "Received: num_microbatches=1.5"),
])
def test_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    InterlockTrainer(helpers.mlp_modules(K),
                     lambda k: keras.optimizers.SGD(), **kwargs)


def test_microbatches_must_divide_batch():
  x, y = helpers.batch(size=6)
  trainer = InterlockTrainer(helpers.mlp_modules(K),
                             lambda k: keras.optimizers.SGD(),
                             loss_fn=helpers.cross_entropy, num_microbatches=4)
  trainer.build(x)
  with pytest.raises(ValueError, match="Received: num_microbatches=4"):
    trainer.train_loop(iter(trainer.distribute_dataset(
        helpers.repeat_dataset(x, y))))


@pytest.mark.parametrize("strategy", ["e2e", "2wise", "local"])
def test_microbatches_equal_full_batch(strategy):
  """M microbatches, gradients summed, one update: the full-batch step."""
  x, y = helpers.batch(size=16)
  results = []
  for m in (1, 4):
    modules = helpers.mlp_modules(K, seed=11)
    trainer = InterlockTrainer(modules, lambda k: keras.optimizers.Adam(0.01),
                               strategy, loss_fn=helpers.cross_entropy,
                               num_microbatches=m)
    trainer.build(x)
    iterator = iter(trainer.distribute_dataset(helpers.repeat_dataset(x, y)))
    metrics = [trainer.train_loop(iterator) for _ in range(3)]
    results.append((helpers.weights(modules), metrics))
  (full, m_full), (micro, m_micro) = results
  for a, b in zip(full, micro):
    np.testing.assert_allclose(a, b, atol=1e-5)
  for a, b in zip(m_full, m_micro):
    np.testing.assert_allclose(a["module_3/loss"], b["module_3/loss"],
                               rtol=1e-5)
