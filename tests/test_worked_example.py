"""The shared doc's worked example, every row, through the real trainer.

K = 3 scalar modules h_k = w_k h_{k-1}, w = (2, 3, 4); scalar aux heads
A_k(h) = a_k h, a = (1, 1); x = 1; every loss is 0.1 * logit. With SGD at
learning rate 1 each parameter moves by minus its hand-worked gradient.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers.interlock_module import InterlockModule
from tf_interlock.trainer import InterlockTrainer

W = (2.0, 3.0, 4.0)
A = (1.0, 1.0)

# strategy: (dtheta_1, dtheta_2, dtheta_3, dphi_1, dphi_2), by hand.
ROWS = {
    "e2e": (1.2, 0.8, 0.6, 0.2, 0.6),
    "local": (0.1, 0.2, 0.6, 0.2, 0.6),
    "2wise": (0.3, 0.8, 0.6, 0.2, 0.6),
    "2wise-sum": (0.4, 1.0, 0.6, 0.2, 0.6),
    "3wise": (1.2, 0.8, 0.6, 0.2, 0.6),
    "3wise-sum": (1.2, 0.8, 0.6, 0.2, 0.6),  # n >= K: end-to-end.
}


def _scalar(value, name):
  return keras.layers.Dense(1, use_bias=False, name=name,
                            kernel_initializer=keras.initializers.Constant(value))


def scalar_modules():
  return [
      InterlockModule(_scalar(W[0], "w1"), aux_head=_scalar(A[0], "a1")),
      InterlockModule(_scalar(W[1], "w2"), aux_head=_scalar(A[1], "a2")),
      InterlockModule(_scalar(W[2], "w3")),
  ]


def tenth_of_logit(labels, logits):
  del labels
  return 0.1 * tf.reshape(logits, [-1])


def one_sgd_step(strategy, **kwargs):
  modules = scalar_modules()
  trainer = InterlockTrainer(
      modules, lambda k: keras.optimizers.SGD(1.0), strategy,
      loss_fn=tenth_of_logit, metric_fn=None, **kwargs)
  x = tf.ones([1, 1])
  trainer.build(x)
  dataset = tf.data.Dataset.from_tensors((x, tf.zeros([1]))).repeat()
  metrics = trainer.train_loop(iter(trainer.distribute_dataset(dataset)))
  values = [m.body.kernel for m in modules] + [
      m.aux_head.kernel for m in modules[:2]]
  return np.array([float(tf.reshape(v, [])) for v in values]), metrics


@pytest.mark.parametrize("strategy", sorted(ROWS))
def test_worked_example(strategy):
  after, metrics = one_sgd_step(strategy)
  before = np.array(W + A)
  np.testing.assert_allclose(before - after, ROWS[strategy], atol=1e-6)
  # Losses at the initial weights: 0.1 * (h_1, h_2, h_3) = 0.2, 0.6, 2.4.
  np.testing.assert_allclose(
      [metrics[f"module_{k}/loss"] for k in (1, 2, 3)], [0.2, 0.6, 2.4],
      rtol=1e-6)


def test_microbatches_match_full_batch_on_worked_example():
  full, _ = one_sgd_step("2wise-sum")
  modules = scalar_modules()
  trainer = InterlockTrainer(
      modules, lambda k: keras.optimizers.SGD(1.0), "2wise-sum",
      loss_fn=tenth_of_logit, metric_fn=None, num_microbatches=4)
  x = tf.ones([4, 1])
  trainer.build(x)
  dataset = tf.data.Dataset.from_tensors((x, tf.zeros([4]))).repeat()
  trainer.train_loop(iter(trainer.distribute_dataset(dataset)))
  micro = [float(tf.reshape(m.body.kernel, [])) for m in modules]
  np.testing.assert_allclose(micro, full[:3], atol=1e-6)
