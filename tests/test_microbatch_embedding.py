"""Microbatches through an embedding: its IndexedSlices gradients are
accumulated, and M = 2 updates the weights as M = 1 does."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import transformer
from tf_interlock.trainer import InterlockTrainer


def _weights(strategy, microbatches, ids, labels, steps):
  """Every weight after `steps` (0 or 1) training steps from seed 0."""
  keras.utils.set_random_seed(0)
  modules = transformer.transformer_lm_modules(
      vocab_size=13, seq_len=4, num_layers=2, d_model=8, num_heads=2,
      mlp_dim=16, num_modules=2)
  trainer = InterlockTrainer(modules, lambda k: keras.optimizers.SGD(0.5),
                             strategy, num_microbatches=microbatches)
  trainer.build(ids)
  if steps:
    dataset = tf.data.Dataset.from_tensors((ids, labels)).repeat()
    trainer.train_loop(iter(trainer.distribute_dataset(dataset)))
  return [v.numpy() for m in trainer.modules for v in m.trainable_variables]


@pytest.mark.parametrize("strategy", ["e2e", "2wise"])
def test_two_microbatches_update_an_embedding_like_one(strategy):
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 13, size=(4, 4)).astype("int32")
  labels = rng.integers(0, 13, size=(4, 4)).astype("int32")
  start = _weights(strategy, 1, ids, labels, steps=0)
  one = _weights(strategy, 1, ids, labels, steps=1)
  two = _weights(strategy, 2, ids, labels, steps=1)
  # The token embedding (module 1's first weight) moved, the same way.
  assert np.abs(one[0] - start[0]).max() > 1e-4
  assert len(one) == len(two)
  for a, b in zip(one, two):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
