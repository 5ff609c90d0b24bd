"""mixed_float16 trains: per-module loss scaling against float32.

The loss is multiplied by 1e-6, so that its gradients (about 1e-8) fall
below float16's normal range: without loss scaling they lose most of their
digits or become 0, and the float16 updates differ from float32's; with each
module's own dynamic scale S_k they match. Modules get different scales, so
the rescaling of cotangents between modules is exercised too.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tf_interlock.trainer import InterlockTrainer

K = 3
LR = 1e5  # SGD step: with the 1e-6 loss factor, updates of order 1e-2.


def tiny_loss(labels, logits):
  return 1e-6 * helpers.cross_entropy(labels, logits)


def scaled_sgd(scales):
  return lambda k: keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(LR), initial_scale=scales[k])


def _run(policy, strategy, optimizers, steps=2, distribute=None):
  """Trains a K-module MLP under `policy`: (weight deltas, metrics, trainer)."""
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(policy)
  try:
    distribute = distribute or tf.distribute.get_strategy()
    x, y = helpers.batch(size=8)
    with distribute.scope():
      modules = helpers.mlp_modules(K, seed=2)
    trainer = InterlockTrainer(modules, optimizers, strategy,
                               loss_fn=tiny_loss, metric_fn=None,
                               distribute=distribute)
    trainer.build(x)
    before = helpers.weights(modules)
    iterator = iter(trainer.distribute_dataset(helpers.repeat_dataset(x, y)))
    metrics = [trainer.train_loop(iterator) for _ in range(steps)]
    deltas = [a - b for a, b in zip(helpers.weights(modules), before)]
    return deltas, metrics, trainer
  finally:
    keras.mixed_precision.set_global_policy(previous)


def _max_relative_error(deltas, reference):
  return max(float(np.abs(d - r).max() / np.abs(r).max())
             for d, r in zip(deltas, reference))


@pytest.mark.parametrize("strategy", ["e2e", "2wise"])
def test_float16_updates_match_float32(strategy):
  reference, _, _ = _run("float32", strategy,
                         lambda k: keras.optimizers.SGD(LR))
  assert min(np.abs(r).max() for r in reference) > 1e-3
  scales = [2.0**15, 2.0**18, 2.0**16]
  deltas, metrics, trainer = _run("mixed_float16", strategy,
                                  scaled_sgd(scales))
  assert trainer.modules[0].body.compute_dtype == "float16"
  assert _max_relative_error(deltas, reference) < 0.01
  for k in range(K):
    assert metrics[-1][f"module_{k + 1}/loss_scale"] == scales[k]
    assert metrics[-1][f"module_{k + 1}/skipped"] == 0.0
  # The test can fail: with S = 1 (no scaling) the same float16 run is far
  # from float32, since the gradients underflow.
  unscaled, _, _ = _run("mixed_float16", strategy, scaled_sgd([1.0] * K))
  assert _max_relative_error(unscaled, reference) > 0.5


def test_plain_optimizers_are_wrapped_under_float16():
  reference, m32, _ = _run("float32", "local", keras.optimizers.SGD(LR))
  deltas, m16, trainer = _run("mixed_float16", "local",
                              keras.optimizers.SGD(LR))
  assert all(isinstance(o, keras.optimizers.LossScaleOptimizer)
             for o in trainer.optimizers)
  assert m16[0]["module_1/loss_scale"] == 2.0**15
  assert _max_relative_error(deltas, reference) < 0.01
  # grad_norm is reported unscaled.
  np.testing.assert_allclose(m16[0]["module_2/grad_norm"],
                             m32[0]["module_2/grad_norm"], rtol=0.02)


def test_non_finite_step_is_skipped_and_scale_lowered():
  # S_2 = 2^44 overflows float16 in module 2: module 2 skips its step and
  # halves S_2; module 1, whose 2-wise gradient comes through module 2,
  # receives the overflow and skips too; module 3 trains normally.
  scales = [2.0**12, 2.0**44, 2.0**12]
  deltas, metrics, trainer = _run("mixed_float16", "2wise", scaled_sgd(scales),
                                  steps=1)
  sizes = [len(m.weights) for m in trainer.modules]
  per_module = [deltas[sum(sizes[:k]):sum(sizes[:k + 1])] for k in range(K)]
  assert all(np.all(d == 0) for d in per_module[0] + per_module[1])
  assert all(np.abs(d).max() > 1e-3 for d in per_module[2])
  assert [metrics[0][f"module_{k}/skipped"] for k in (1, 2, 3)] == [1, 1, 0]
  assert metrics[0]["module_2/loss_scale"] == 2.0**44
  assert float(trainer.optimizers[1].dynamic_scale.numpy()) == 2.0**43
  assert [int(o.iterations.numpy()) for o in trainer.optimizers] == [0, 0, 1]
  assert all(np.isfinite(w).all() for w in helpers.weights(trainer.modules))


def test_float16_two_replicas_equal_one(mirrored):
  one, _, _ = _run("mixed_float16", "2wise", scaled_sgd([2.0**12] * K))
  two, metrics, trainer = _run("mixed_float16", "2wise",
                               scaled_sgd([2.0**12] * K), distribute=mirrored)
  assert trainer.distribute.num_replicas_in_sync == 2
  assert metrics[0]["module_1/loss_scale"] == 2.0**12
  assert _max_relative_error(two, one) < 1e-2


def test_bfloat16_is_not_scaled():
  _, metrics, trainer = _run("mixed_bfloat16", "2wise",
                             lambda k: keras.optimizers.SGD(LR), steps=1)
  assert not any(isinstance(o, keras.optimizers.LossScaleOptimizer)
                 for o in trainer.optimizers)
  assert not any(key.endswith("loss_scale") for key in metrics[0])
