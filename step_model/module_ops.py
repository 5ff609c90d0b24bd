"""One module's ops as the engine runs them: its loss and its VJPs.

The interlocking step (`tf_interlock.engine.InterlockStep`) runs, per
module k, a forward h_k = M_k(x_k), its own loss L_k, and two
vector-Jacobian products of a cotangent c at h_k:

* the input VJP (dh_k/dx_k)^T c, which module k sends to module k-1;
* the weight VJP (dh_k/dtheta_k)^T c, theta_k's gradient;

or both from one backward pass through the body ("fused", when the stream
that trains theta_k also goes on below). These functions give each of them
on its own, on the module's public parts, so that a tool can time or check
one op at a time (the step-time model's profiler, `profiling`) without
reaching into the engine. They model the library from above it, so they
live here, not in `tf_interlock`.
"""

import tensorflow as tf


def module_loss(step, k, logits, labels, global_batch_size=None):
  """L_k of module k on one batch, as `step` computes it, with its metrics.

  Args:
    step: the `tf_interlock.engine.InterlockStep` (an
      `InterlockTrainer`'s `.step`).
    k: the module (0-based).
    logits: A_k(h_k) for a module with an aux head, h_{K-1} for the last.
    labels: the batch's targets.
    global_batch_size: the examples the loss is averaged over; None: this
      batch's.

  Returns:
    `(loss, metrics)`: L_k, and {"module_{k+1}/loss": L_k, ...} (its
    accuracy too when the step has a `metric_fn`).
  """
  if global_batch_size is None:
    global_batch_size = int(labels.shape[0])
  metrics = {}
  loss = step.own_loss(k, logits, labels, global_batch_size, metrics)
  return loss, metrics


def body_vjp(module, x, cotangent, weights=True, inputs=True):
  """VJPs of a module's body at x: one forward and one backward pass.

  With h = body(x) and c = `cotangent`, the weight VJP is
  (dh/dtheta)^T c and the input VJP is (dh/dx)^T c. Asked for both, one
  backward pass yields them (the engine's fused pass); the forward pass is
  always part of the cost, as the step's backward needs the activations.

  Args:
    module: an `InterlockModule`.
    x: the body's input x_k.
    cotangent: c, shaped like body(x).
    weights: whether to return theta's gradient.
    inputs: whether to return x's gradient.

  Returns:
    A list: theta_k's gradients (aligned with
    `module.body.trainable_variables`) when `weights`, then x's gradient
    when `inputs`.

  Raises:
    ValueError: when neither `weights` nor `inputs` is asked for.
  """
  if not (weights or inputs):
    raise ValueError("body_vjp needs weights=True or inputs=True (a VJP of "
                     "something). Received: weights=False, inputs=False")
  theta = list(module.body.trainable_variables) if weights else []
  with tf.GradientTape() as tape:
    if inputs:
      tape.watch(x)
    h = module.body(x, training=True)
  return tape.gradient(h, theta + ([x] if inputs else []),
                       output_gradients=cotangent)
