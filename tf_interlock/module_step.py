"""Module k's step: its forward and own loss, its backward, its update.

Keras's `train_step` is one method: forward, loss, gradient, update. Module
k's step in interlocking backpropagation (Gomez et al., 2022,
arXiv:2010.04116, Alg. 1) is the same three parts, here in one class,
`ModuleStep`, read in order:

1. `forward`: x_k = stop_gradient(h_{k-1}) (`boundary.cut`), h_k = M_k(x_k)
   under module k's own tape (persistent where it takes several VJPs),
   and module k's own loss L_k: its
   aux head's (phi_k's gradient, and the cotangent dL_k/dh_k when L_k trains
   some theta), or the true loss for the last module.
2. `backward`: the streams module k + 1 sent across h_k, plus L_k's own;
   theta_k's gradient is one weight VJP of the sum of those that train it
   (`routing.RoutingPlan.weight_keys`), and each stream that trains a
   module below k crosses into module k - 1 as one input VJP
   (`vjp_keys`).
3. `update`: module k's gradient norm, under loss scaling one skip decision
   for every replica, the sum over processes (replicas x modules), and its
   optimizer's `apply_gradients` (theta_k then phi_k).

The only thing between the parts that is not module k's own is the order:
`engine.InterlockStep` runs every module's forward (0 up to K - 1), then
every backward (K - 1 down to 0), handing module k + 1's outgoing streams
to module k; the trainer sums microbatches (and tied copies, see
`tied_gradients`) before the updates. Loss scaling (S_k) is described in
`engine`'s docstring.
"""

import dataclasses
from typing import List, Optional

import tensorflow as tf

from layers import boundary
from tf_interlock import metric_names
from tf_interlock import no_gradient


def _zeros_like_none(grads, variables):
  return [tf.zeros_like(v) if g is None else g
          for g, v in zip(grads, variables)]


def _poison_unless_finite(grads, sent):
  """NaN in grads[0] unless every gradient and every sent cotangent is finite.

  A `LossScaleOptimizer` checks only the gradients it applies; folding the
  cotangents module k sends back into that check makes an overflow inside
  module k lower module k's own scale (see the module docstring).
  """
  sent = [t for cotangents in sent for t in cotangents]
  checks = [tf.reduce_all(tf.math.is_finite(t)) for t in grads + sent]
  finite = tf.reduce_all(tf.stack(checks))
  first = grads[0]
  grads[0] = tf.where(finite, first, tf.constant(float("nan"), first.dtype))
  return grads


@dataclasses.dataclass
class _Forward:
  """What module k's forward pass keeps for its backward pass.

  Attributes:
    tape: the tape that watched theta_k (and x_k) while the body ran;
      every VJP of module k is taken on it (persistent only where module k
      takes more than one: `ModuleStep.tape_calls`).
    x: x_k = stop_gradient(h_{k-1}), the cut input (the features for k = 0);
      one tensor or a nest (`layers.boundary`).
    h: h_k = M_k(x_k), one tensor or a nest.
    reg: the body's regularization loss, scaled to this replica's share, or
      None when it has none.
    own_cot: S_k dL_k/dh_k when L_k trains some theta (always so for the
      true loss L_{K-1}), else None: a list aligned with
      `boundary.differentiable(h)` (zero but at the aux head's input), as
      every cotangent in the engine is.
    phi_grads: S_k dL_k/dphi_k, aligned with the aux head's trainable
      variables ([] without an aux head).
    state: with `recompute`, the body's non-trainable variables (BatchNorm
      statistics, random seeds) as they were before the forward, so that
      the re-run forward sees what the first one saw; else None (and the
      tape holds the activations).
  """
  tape: tf.GradientTape
  x: tf.Tensor
  h: tf.Tensor
  reg: Optional[tf.Tensor]
  own_cot: Optional[tf.Tensor]
  phi_grads: List[tf.Tensor]
  state: Optional[List[tf.Tensor]] = None


class ModuleStep:
  """Module k's forward, backward and update (one per module).

  Args:
    k: the module's index (0-based).
    modules: the K `InterlockModule`s, in depth order.
    plan: the `routing.RoutingPlan` of the strategy over them.
    loss_fn: `loss_fn(labels, logits) -> per-example loss [batch]`.
    metric_fn: optional `metric_fn(labels, logits) -> per-example score`.
    placement: the `placement.Placement`.
    functions: the `module_functions.ModuleFunctions` (module k's body is
      traced there; its update and gradient norm are added here).
    recompute: whether module k re-runs its forward inside its backward.
    optimizer: module k's Keras optimizer (None: `update` is not used).
    replicas: a `replicas.CollectiveReplicas`, or None (this process
      alone).
  """

  def __init__(self, k, modules, plan, loss_fn, metric_fn, placement,
               functions, recompute=False, optimizer=None, replicas=None):
    self.k = k
    self.module = modules[k]
    self.last = k == len(modules) - 1
    self.plan = plan
    self.loss_fn = loss_fn
    self.metric_fn = metric_fn
    self.placement = placement
    self.functions = functions
    self.recompute = recompute
    self.optimizer = optimizer
    self.replicas = replicas
    self._warned_no_gradient = False
    # One gradient call per VJP module k takes on its forward tape: the
    # weight VJP (fused with the input VJP of the stream that also trains
    # theta_k) and one input VJP per other stream it sends down.
    # When the one stream that trains theta_k also goes on to module k - 1
    # (always so end to end), one backward pass gives both the weight and
    # the input VJP and shares the work through the body.
    weight_keys, vjp_keys = plan.weight_keys[k], plan.vjp_keys[k]
    self._fused = len(weight_keys) == 1 and weight_keys[0] in vjp_keys
    self.tape_calls = 1 + len(vjp_keys) - self._fused
    # Module k's update and gradient norm, traced once and called by every
    # unrolled step (see `module_functions`).
    self._apply_traced = functions.add(self._apply, ("update", k))
    self._norm_traced = functions.add(tf.linalg.global_norm,
                                      ("grad_norm", k))

  def variables(self):
    """theta_k then phi_k: the order of module k's gradients."""
    module = self.module
    head = module.aux_head.trainable_variables if module.has_aux_head else []
    return module.body.trainable_variables + head

  def _average(self, per_example, global_batch_size, what):
    per_example = tf.cast(per_example, tf.float32)
    if per_example.shape.rank == 0:
      raise ValueError(
          f"{what} must return one value per example (shape [batch]), not a "
          f"batch mean: the engine averages over the global batch itself. "
          f"Received: {what} output shape=()")
    return tf.nn.compute_average_loss(
        per_example, global_batch_size=global_batch_size)

  def own_loss(self, logits, labels, global_batch_size, metrics):
    """Module k's own loss L_k, as the step trains it.

    Public for tools that time or inspect one module's ops
    (`step_model.module_ops.module_loss`); the step itself calls it for
    every loss.

    Args:
      logits: the aux head's output A_k(h_k), or h_{K-1} for the last module.
      labels: the targets, passed to `loss_fn`.
      global_batch_size: the examples the loss is averaged over.
      metrics: a dict that gets "module_{k+1}/loss" (and "/accuracy" with a
        `metric_fn`), this batch's contribution.

    Returns:
      L_k, a float32 scalar: the sum of the per-example losses over
      `global_batch_size`.
    """
    loss = self._average(self.loss_fn(labels, logits), global_batch_size,
                         "loss_fn")
    metrics[metric_names.metric_name(self.k, "loss")] = loss
    if self.metric_fn is not None:
      # One per-example score, logged as "accuracy", or {name: scores}
      # (`keras_metrics`: compile's list of metrics).
      for name, value in metric_names.named_scores(
          self.metric_fn(labels, logits)).items():
        metrics[metric_names.metric_name(self.k, name)] = self._average(
            value, global_batch_size, "metric_fn")
    return loss

  def _body_forward(self, x):
    """h_k and its scaled regularization loss (under the caller's tape)."""
    # One traced function per module (`module_functions`): the unrolled
    # steps call it instead of re-tracing the body.
    h, reg = self.functions.body(self.k, x)
    h = tf.nest.map_structure(
        lambda t: self.placement.annotate(t, self.k), h)
    return h, None if reg is None else tf.nn.scale_regularization_loss(reg)

  def forward(self, h_prev, labels, global_batch_size, metrics, scale):
    """1. Module k's forward pass and its own loss: its `_Forward`.

    Args:
      h_prev: h_{k-1} (the features for k = 0), not yet cut.
      labels: the targets.
      global_batch_size: the examples the losses are averaged over.
      metrics: a dict that gets module k's loss and metrics.
      scale: S_k (a float32 scalar), or None.
    """
    module, place, k, last = self.module, self.placement, self.k, self.last
    with place.scope(k):
      x = boundary.cut(h_prev)
      state = None
      if self.recompute:
        # Run without a tape: nothing is kept for the backward, which runs
        # the body again (`_recomputed`) from what it read here.
        state = [tf.identity(v) for v in
                 module.body.non_trainable_variables]
        h, reg = self._body_forward(x)
      # The tape watches the variables the body reads (theta_k) and, to
      # produce input VJPs, the cut input x_k (its floating-point leaves:
      # masks and ids get no cotangent).
      with self._tape() as tape:
        if state is None:
          if k > 0:
            tape.watch(boundary.differentiable(x))
          h, reg = self._body_forward(x)
      own_cot, phi_grads = None, []
      if last:
        # M_{K-1} ends with the model's own head: L_{K-1} = loss(h, y) is
        # the true loss; its cotangent at h starts module K-1's streams.
        with tf.GradientTape() as loss_tape:
          loss_tape.watch(h)
          loss = _scaled(self.own_loss(h, labels, global_batch_size, metrics),
                         scale)
        own_cot = [loss_tape.gradient(loss, h)]
      elif module.has_aux_head:
        # L_k = loss(A_k(h_k), y): phi_k's gradient, and dL_k/dh_k when L_k
        # trains some theta.
        own_cot, phi_grads = self._aux_backward(h, labels, global_batch_size,
                                                metrics, scale)
    return _Forward(tape, x, h, reg, own_cot, phi_grads, state)

  def _recomputed(self, record, cotangents):
    """`record` with module k's forward run again under a new tape, once the
    `cotangents` it is differentiated with exist (before, the dataflow could
    run it at once and keep its activations as long as without
    recomputation). The body's non-trainable variables are first put back
    to what the first forward read, so it computes the same h_k and leaves
    them as one forward would."""
    variables = self.module.body.non_trainable_variables
    with tf.control_dependencies(cotangents):
      # (TF orders the body's reads of these variables after the writes.)
      for v, value in zip(variables, record.state):
        v.assign(value)
      x = tf.nest.map_structure(tf.identity, record.x)
    with self._tape() as tape:
      if self.k > 0:
        tape.watch(boundary.differentiable(x))
      h, reg = self._body_forward(x)
    return dataclasses.replace(record, tape=tape, x=x, h=h, reg=reg,
                               state=None)

  def _tape(self):
    """The tape the body's forward runs under: persistent only where
    module k takes more than one VJP on it.

    A persistent tape could also differentiate the gradients it computes,
    so TF differentiates a traced body (`module_functions`) recorded on it
    as for higher orders: the forward function returns its intermediates
    and the backward function adds a zero gradient to each of them (a
    zeros tensor and an AddN per intermediate, every step). One VJP needs
    neither: on the benchmark MLP (K = 4, width 1,024) that was 9% of a
    local step's work (docs/results/speed_held/README.md).
    """
    return tf.GradientTape(persistent=self.tape_calls > 1)

  def backward(self, record, incoming, scales):
    """2. Module k's gradients and the streams it sends to module k-1.

    Args:
      record: its `_Forward`.
      incoming: {lo: cotangent at h_k} of the streams module k+1 sent, at
        module k+1's scale; {} for the last module.
      scales: the per-module loss scales, or None.

    Returns:
      `(grads, outgoing)`: theta_k's then phi_k's gradients (times S_k), and
      {lo: S_k dL/dx_k} of each stream that trains a module below k.
    """
    module, plan, place, k = self.module, self.plan, self.placement, self.k
    scale = None if scales is None else scales[k]
    with place.scope(k):
      streams = dict(incoming)
      if scales is not None and not self.last:
        streams = {key: _rescale(value, scales[k], scales[k + 1])
                   for key, value in streams.items()}
      # L_k joins the stream of lo_k, the lowest module it trains: under
      # "only" the module whose window ends here (target(lo_k) = k), under
      # "sum" every module from lo_k to k; the true loss trains every module
      # whose window reaches K-1.
      lo = plan.loss_low[k]
      if lo is not None:
        streams[lo] = (record.own_cot if lo not in streams else
                       [a + b for a, b in zip(streams[lo], record.own_cot)])
      # theta_k's gradient is taken of the losses of the streams that train
      # it (window n, Gomez et al. 2022, Sec. 3): "only", dL_target(k)/dtheta_k;
      # "sum", d(L_k + ... + L_target(k))/dtheta_k. VJPs are linear, so one
      # weight VJP of the summed cotangent gives it; the body's
      # regularization loss adds its own gradient (cotangent S_k).
      if record.state is not None:
        record = self._recomputed(record,
                                  tf.nest.flatten(list(streams.values())))
      body_vars = module.body.trainable_variables
      weight_keys = plan.weight_keys[k]
      outputs, inputs = (boundary.differentiable(record.h),
                         boundary.differentiable(record.x))
      targets = list(outputs)
      target_cots = _add([streams[key] for key in weight_keys])
      if record.reg is not None:
        targets.append(record.reg)
        target_cots.append(_scaled(tf.ones_like(record.reg), scale))
      fused = self._fused  # one pass for the weight and input VJP
      sources = body_vars + (inputs if fused else [])
      got = record.tape.gradient(targets, sources,
                                 output_gradients=target_cots)
      theta_grads = _zeros_like_none(got[:len(body_vars)], body_vars)
      outgoing = ({weight_keys[0]: got[len(body_vars):]} if fused else {})
      # Each other stream that trains a module below k crosses the boundary
      # as its input VJP, dL/dx_k = (dh_k/dx_k)^T dL/dh_k.
      for key in plan.vjp_keys[k]:
        if key not in outgoing:
          outgoing[key] = record.tape.gradient(
              outputs, inputs, output_gradients=streams[key])
      outgoing = {key: [place.annotate(self._cotangent(record, x, v), k)
                        for x, v in zip(inputs, value)]
                  for key, value in outgoing.items()}
      grads = theta_grads + record.phi_grads
      if scale is not None:
        grads = _poison_unless_finite(grads, list(outgoing.values()))
    return grads, outgoing

  def _cotangent(self, record, x, value):
    """dL/dx for one leaf x of x_k, or zero when a layer without a gradient
    cuts it (warned once per module, naming the layer: `no_gradient`)."""
    if value is not None:
      return value
    if not self._warned_no_gradient:
      self._warned_no_gradient = True
      no_gradient.warn(self.k, self.module, record.x)
    return tf.zeros_like(x)

  def _aux_backward(self, h, labels, global_batch_size, metrics, scale):
    """S_k dL_k/dphi_k, plus the cotangent S_k dL_k/dh_k when L_k trains
    theta."""
    module = self.module
    phi = module.aux_head.trainable_variables
    starts_stream = self.plan.loss_low[self.k] is not None
    # The head reads the boundary's primary tensor (the hidden state).
    read = boundary.primary(h)
    with tf.GradientTape() as tape:
      if starts_stream:
        tape.watch(read)
      # Without a stream (e.g. every head in end-to-end training) the head
      # reads a detached h_k: a probe that can never reach theta.
      logits = module.aux_head(
          read if starts_stream else tf.stop_gradient(read), training=True)
      loss = _scaled(self.own_loss(logits, labels, global_batch_size,
                                   metrics), scale)
    if starts_stream:
      grads = tape.gradient(loss, phi + [read])
      # Zero for every other differentiable leaf: only the primary one
      # reaches L_k.
      own_cot = [grads[-1] if t is read else tf.zeros_like(t)
                 for t in boundary.differentiable(h)]
      return own_cot, _zeros_like_none(grads[:-1], phi)
    return None, _zeros_like_none(tape.gradient(loss, phi), phi)



  def update(self, grads, scale, num_replicas, context, metrics):
    """3. Module k's update, on module k's device.

    Args:
      grads: theta_k's then phi_k's gradients (times S_k), summed over the
        microbatches (and over tied copies).
      scale: S_k (its `LossScaleOptimizer`'s dynamic scale), or None.
      num_replicas: the replicas the global batch is split over (the
        strategy's times the processes').
      context: the replica context.
      metrics: gets "module_{k}/grad_norm" (and with a scale "skipped" and
        "loss_scale"), this replica's share.
    """
    k = self.k
    with self.placement.scope(k):
      norm = self._norm_traced(grads)
      if scale is not None:
        grads, norm = self._agree_on_skip(grads, norm, scale, num_replicas,
                                          context, metrics)
      # This replica's gradient norm (mean over replicas after the SUM
      # reduction): NaN/Inf in any gradient of module k shows up here.
      metrics[metric_names.metric_name(k, "grad_norm")] = norm / num_replicas
      if self.replicas is not None:
        grads = self.replicas.sum_module(k, grads, metrics)
      self._apply_traced(grads)

  def _apply(self, grads):
    """Module k's optimizer applies `grads` (theta_k then phi_k).

    A frozen module (`trainable = False`) has no trainable variables and is
    not updated; cotangents still cross it (see `engine`).
    """
    variables = self.variables()
    if variables:
      self.optimizer.apply_gradients(zip(grads, variables))

  def _agree_on_skip(self, grads, norm, scale, num_replicas, context,
                     metrics):
    """Loss-scaled module k: one skip decision for all replicas.

    The `LossScaleOptimizer` checks this replica's gradients before the
    all-reduce; a non-finite gradient on any replica is made visible on all
    of them, so every replica skips the same steps. Reports the unscaled
    norm (0 on a skipped step), "skipped" (1 on a skipped step) and the
    scale S_k.
    """
    finite = tf.reduce_all(tf.stack(
        [tf.reduce_all(tf.math.is_finite(g)) for g in grads]))
    if num_replicas > 1:
      bad = context.all_reduce(tf.distribute.ReduceOp.SUM,
                               1.0 - tf.cast(finite, tf.float32))
      finite = tf.equal(bad, 0.0)
      grads = [tf.where(finite, g, tf.constant(float("nan"), g.dtype))
               for g in grads]
    skipped = 1.0 - tf.cast(finite, tf.float32)
    k = self.k
    metrics[metric_names.metric_name(k, "skipped")] = skipped / num_replicas
    metrics[metric_names.metric_name(k, "loss_scale")] = scale / num_replicas
    return grads, tf.where(finite, norm / scale, 0.0)


def _scaled(value, scale):
  """S * value (float32 S), or value itself when there is no scale."""
  if scale is None:
    return value
  return value * tf.cast(scale, value.dtype)


def _add(cotangents):
  """The sum of several cotangents, leaf by leaf (lists aligned with one
  boundary's differentiable leaves)."""
  return [tf.add_n(list(leaves)) for leaves in zip(*cotangents)]


def _rescale(cotangents, to_scale, from_scale):
  """Cotangents at scale `from_scale` re-expressed at scale `to_scale`.

  The ratio is applied in float32: S_k / S_{k+1} may exceed float16's range
  although the rescaled cotangent does not.
  """
  ratio = tf.cast(1.0 if to_scale is None else to_scale, tf.float32) / (
      tf.cast(1.0 if from_scale is None else from_scale, tf.float32))
  return [tf.cast(tf.cast(c, tf.float32) * ratio, c.dtype)
          for c in cotangents]

