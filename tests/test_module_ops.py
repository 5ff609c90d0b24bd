"""step_model.module_ops: one module's loss and VJPs equal the engine's.

On the shared doc's worked example (tests/test_worked_example.py: K = 3
scalar modules h_k = w_k h_{k-1}, w = (2, 3, 4), aux heads a = (1, 1), x = 1,
every loss 0.1 * logit), chaining the public ops by hand gives the
end-to-end row (1.2, 0.8, 0.6) and the step's own gradients and losses.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers.interlock_module import InterlockModule
from step_model import module_ops
from tf_interlock.trainer import InterlockTrainer


def _scalar(value, name):
  return keras.layers.Dense(
      1, use_bias=False, name=name,
      kernel_initializer=keras.initializers.Constant(value))


def scalar_modules():
  return [
      InterlockModule(_scalar(2.0, "w1"), aux_head=_scalar(1.0, "a1")),
      InterlockModule(_scalar(3.0, "w2"), aux_head=_scalar(1.0, "a2")),
      InterlockModule(_scalar(4.0, "w3")),
  ]


def tenth_of_logit(labels, logits):
  del labels
  return 0.1 * tf.reshape(logits, [-1])


def _trainer(strategy):
  trainer = InterlockTrainer(scalar_modules(),
                             lambda k: keras.optimizers.SGD(1.0), strategy,
                             loss_fn=tenth_of_logit, metric_fn=None)
  trainer.build(tf.ones([1, 1]))
  return trainer


def _number(t):
  return float(tf.reshape(t, []))


def test_chained_vjps_are_the_engine_end_to_end_gradients():
  trainer = _trainer("e2e")
  m = trainer.modules
  x, y = tf.ones([1, 1]), tf.zeros([1])
  h = [x]
  for module in m:
    h.append(module.body(h[-1], training=True))
  # dL_3/dh_3 = 0.1 from the last module's own loss.
  with tf.GradientTape() as tape:
    tape.watch(h[3])
    loss, metrics = module_ops.module_loss(trainer.step, 2, h[3], y)
  cot = tape.gradient(loss, h[3])
  assert _number(loss) == pytest.approx(2.4) and _number(cot) == (
      pytest.approx(0.1))
  assert list(metrics) == ["module_3/loss"]
  dw3, cot = module_ops.body_vjp(m[2], h[2], cot)  # h_2 = 6: 0.6; w_3 0.1
  dw2, cot = module_ops.body_vjp(m[1], h[1], cot)  # h_1 = 2: 0.8; w_2 0.4
  [dw1] = module_ops.body_vjp(m[0], h[0], cot, inputs=False)
  by_hand = [_number(g) for g in (dw1, dw2, dw3)]
  np.testing.assert_allclose(by_hand, (1.2, 0.8, 0.6), rtol=1e-6)
  grads, step_metrics = trainer.step.gradients(x, y, 1)
  np.testing.assert_allclose(by_hand, [_number(g[0]) for g in grads],
                             rtol=1e-6)
  assert _number(step_metrics["module_3/loss"]) == pytest.approx(2.4)


def test_aux_loss_and_separate_vjps():
  trainer = _trainer("local")
  m = trainer.modules
  h1 = m[0].body(tf.ones([1, 1]))
  loss, metrics = module_ops.module_loss(
      trainer.step, 0, m[0].aux_head(h1), tf.zeros([1]))
  assert _number(loss) == pytest.approx(0.2)  # 0.1 * a_1 * w_1 * x
  assert _number(metrics["module_1/loss"]) == pytest.approx(0.2)
  # At x = h_1 = 2 with c = 0.5: weight VJP x c = 1, input VJP w_2 c = 1.5,
  # and the fused pass gives the same pair.
  c = tf.fill([1, 1], 0.5)
  [dw] = module_ops.body_vjp(m[1], h1, c, inputs=False)
  [dx] = module_ops.body_vjp(m[1], h1, c, weights=False)
  fused = module_ops.body_vjp(m[1], h1, c)
  assert (_number(dw), _number(dx)) == (pytest.approx(1.0),
                                        pytest.approx(1.5))
  assert [_number(g) for g in fused] == [_number(dw), _number(dx)]


def test_a_vjp_of_nothing_is_refused():
  m = scalar_modules()
  with pytest.raises(ValueError, match=r"Received: weights=False, "
                     r"inputs=False$"):
    module_ops.body_vjp(m[0], tf.ones([1, 1]), tf.ones([1, 1]),
                        weights=False, inputs=False)
