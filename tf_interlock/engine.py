"""The interlocking training step: explicit gradient routing between modules.

One step of interlocking backpropagation (Gomez et al., 2022,
arXiv:2010.04116, Alg. 1) over modules M_0..M_{K-1}:

1. Forward. Module k sees x_k = stop_gradient(h_{k-1}) and computes
   h_k = M_k(x_k) under its own persistent `tf.GradientTape`. Module k < K-1
   with an aux head computes L_k = loss(A_k(h_k), y); the last module computes
   the true loss L_{K-1} = loss(h_{K-1}, y).
2. Aux heads. phi_k always gets dL_k/dphi_k alone. When L_k trains some main
   weights (see `routing.RoutingPlan`), the same backward pass through A_k
   also yields the cotangent dL_k/dh_k, which starts a gradient stream.
3. Backward, module K-1 down to 0. Streams arriving at h_k from module k+1
   are keyed by the lowest module they train. theta_k gets one weight VJP with
   the sum of the cotangents of the streams that train it; each stream that
   goes further gets one input VJP, dL/dx_k = (dh_k/dx_k)^T dL/dh_k, handed to
   module k-1. Nothing else crosses a module boundary.
4. Update. Module k's optimizer applies theta_k's and phi_k's gradients.

Module k's update at step t needs only modules 0..target(k) of step t, so
with one module per device the runtime's dataflow lets early modules start
step t+1 while later ones still work on step t. Losses are averaged over the
global batch (`tf.nn.compute_average_loss`) so that the optimizers' sum
all-reduce across replicas gives the global-batch gradient.
"""

import contextlib

import tensorflow as tf

from tf_interlock import routing


def _zeros_like_none(grads, variables):
  return [tf.zeros_like(v) if g is None else g
          for g, v in zip(grads, variables)]


class InterlockStep:
  """Computes one replica's interlocking gradients for one (micro)batch.

  Args:
    modules: the K `InterlockModule`s, in depth order.
    plan: the `routing.RoutingPlan` of the strategy over these modules.
    loss_fn: `loss_fn(labels, logits) -> per-example loss [batch]`.
    metric_fn: optional `metric_fn(labels, logits) -> per-example score
      [batch]` (e.g. 0/1 correctness), averaged like the loss.
    placement: optional object with `scope(k)`, the device context of module
      k's ops (see `tf_interlock.placement`).
  """

  def __init__(self, modules, plan, loss_fn, metric_fn=None, placement=None):
    self.modules = list(modules)
    self.plan = plan
    self.loss_fn = loss_fn
    self.metric_fn = metric_fn
    self.placement = placement

  def scope(self, k):
    if self.placement is None:
      return contextlib.nullcontext()
    return self.placement.scope(k)

  def annotate(self, tensor, k):
    """Pins a tensor to module k's core where the placement needs it."""
    if self.placement is None:
      return tensor
    return self.placement.annotate(tensor, k)

  def _average(self, per_example, global_batch_size):
    per_example = tf.cast(per_example, tf.float32)
    return tf.nn.compute_average_loss(
        per_example, global_batch_size=global_batch_size)

  def _own_loss(self, k, logits, labels, global_batch_size, metrics):
    """L_k averaged over the global batch; records loss and metric."""
    loss = self._average(self.loss_fn(labels, logits), global_batch_size)
    metrics[f"module_{k + 1}/loss"] = loss
    if self.metric_fn is not None:
      metrics[f"module_{k + 1}/accuracy"] = self._average(
          self.metric_fn(labels, logits), global_batch_size)
    return loss

  def gradients(self, features, labels, global_batch_size):
    """Runs forward and routed backward for one batch on one replica.

    Args:
      features: the network input h_{-1}.
      labels: the targets, passed to `loss_fn`.
      global_batch_size: the batch size across all replicas (and
        microbatches) that losses are averaged over.

    Returns:
      `(grads, metrics)`: grads[k] is a list aligned with
      `modules[k].trainable_variables` (theta_k then phi_k); metrics maps
      "module_{k}/loss" (1-based) etc. to this replica's contribution.
    """
    num_modules = len(self.modules)
    plan = self.plan
    tapes, inputs, outputs, own_cot, aux_grads = [], [], [], [], []
    reg_losses, metrics = [], {}
    h = features
    for k, module in enumerate(self.modules):
      with self.scope(k):
        x = tf.stop_gradient(h)
        # The tape watches the variables the body reads (theta_k) and, to
        # produce input VJPs, the cut input x_k.
        with tf.GradientTape(persistent=True) as tape:
          if k > 0:
            tape.watch(x)
          h = self.annotate(module.body(x, training=True), k)
          reg = (tf.nn.scale_regularization_loss(tf.add_n(module.body.losses))
                 if module.body.losses else None)
          if k == num_modules - 1:
            tape.watch(h)
            loss = self._own_loss(k, h, labels, global_batch_size, metrics)
        cot, phi_grads = None, []
        if k == num_modules - 1:
          cot = tape.gradient(loss, h)
        elif module.has_aux_head:
          cot, phi_grads = self._aux_backward(k, module, h, labels,
                                              global_batch_size, metrics)
      tapes.append(tape)
      inputs.append(x)
      outputs.append(h)
      own_cot.append(cot)
      aux_grads.append(phi_grads)
      reg_losses.append(reg)

    grads = [None] * num_modules
    incoming = {}
    for k in reversed(range(num_modules)):
      module, tape, h = self.modules[k], tapes[k], outputs[k]
      with self.scope(k):
        streams = dict(incoming)
        lo = plan.loss_low[k]
        if lo is not None:
          streams[lo] = (own_cot[k] if lo not in streams
                         else streams[lo] + own_cot[k])
        body_vars = module.body.trainable_variables
        weight_keys = plan.weight_keys[k]
        cot = tf.add_n([streams[key] for key in weight_keys])
        targets, target_cots = [h], [cot]
        if reg_losses[k] is not None:
          targets.append(reg_losses[k])
          target_cots.append(tf.ones_like(reg_losses[k]))
        # When the one stream that trains theta_k also goes on to module
        # k - 1 (always so end to end), one backward pass gives both the
        # weight and the input VJP and shares the work through the body.
        fused = len(weight_keys) == 1 and weight_keys[0] in plan.vjp_keys[k]
        sources = body_vars + ([inputs[k]] if fused else [])
        got = tape.gradient(targets, sources, output_gradients=target_cots)
        theta_grads = _zeros_like_none(got[:len(body_vars)], body_vars)
        incoming = {weight_keys[0]: self.annotate(got[-1], k)} if fused else {}
        for key in plan.vjp_keys[k]:
          if key not in incoming:
            incoming[key] = self.annotate(tape.gradient(
                h, inputs[k], output_gradients=streams[key]), k)
      grads[k] = theta_grads + aux_grads[k]
    del tapes
    return grads, metrics

  def _aux_backward(self, k, module, h, labels, global_batch_size, metrics):
    """dL_k/dphi_k, plus the cotangent dL_k/dh_k when L_k trains theta."""
    phi = module.aux_head.trainable_variables
    starts_stream = self.plan.loss_low[k] is not None
    with tf.GradientTape() as tape:
      if starts_stream:
        tape.watch(h)
      # Without a stream (e.g. every head in end-to-end training) the head
      # reads a detached h_k: a probe that can never reach theta.
      logits = module.aux_head(h if starts_stream else tf.stop_gradient(h),
                               training=True)
      loss = self._own_loss(k, logits, labels, global_batch_size, metrics)
    if starts_stream:
      grads = tape.gradient(loss, phi + [h])
      return grads[-1], _zeros_like_none(grads[:-1], phi)
    return None, _zeros_like_none(tape.gradient(loss, phi), phi)


def make_plan_for(modules, strategy):
  """The routing plan of `strategy` over these `InterlockModule`s."""
  return routing.make_plan(strategy, len(modules),
                           [m.has_aux_head for m in modules])
