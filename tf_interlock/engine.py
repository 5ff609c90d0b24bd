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

Loss scaling (float16). Module k may carry a loss scale S_k (its
`LossScaleOptimizer`'s dynamic scale). Every quantity module k computes is
then S_k times the true one: its own loss is differentiated as S_k L_k, and a
stream arriving from module k+1, computed at scale S_{k+1}, is first
rescaled by S_k / S_{k+1} (in float32; dynamic scales are powers of two, so
this is exact unless it over- or underflows). By linearity of the VJPs,

  S_k dL/dtheta_k = VJP_theta_k(sum over streams s of S_k dL_s/dh_k),

so theta_k's and phi_k's gradients are exactly S_k times the unscaled ones
and module k's optimizer divides them by S_k; the input VJPs module k sends
to module k-1 are at scale S_k, and the stream keeps one scale per module
boundary. A non-finite value produced by module k (in its weight gradients
or in a cotangent it sends back) means S_k is too large: module k's
gradients are then made non-finite, so that its `LossScaleOptimizer` skips
the update and halves S_k, while every other module keeps its own scale and
its own step. No scale is shared between modules, so loss scaling adds no
dependency between them.
"""

import dataclasses
from typing import List, Optional

import tensorflow as tf

from layers import boundary
from tf_interlock import metric_names
from tf_interlock import module_functions
from tf_interlock import no_gradient
from tf_interlock import placement as placement_lib
from tf_interlock import routing


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
    tape: the persistent tape that watched theta_k (and x_k) while the body
      ran; every VJP of module k is taken on it.
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


class InterlockStep:
  """Computes one replica's interlocking gradients for one (micro)batch.

  Args:
    modules: the K `InterlockModule`s, in depth order.
    plan: the `routing.RoutingPlan` of the strategy over these modules.
    loss_fn: `loss_fn(labels, logits) -> per-example loss [batch]`.
    metric_fn: optional `metric_fn(labels, logits) -> per-example score
      [batch]` (e.g. 0/1 correctness), averaged like the loss.
    placement: a `placement.Placement`; defaults to "single" (no device
      scopes).
    recompute: a bool, or one per module: module k keeps only its input
      during the step and re-runs its forward inside its backward (GPipe's
      rematerialization): its activations are alive only while its VJPs
      run, for one more forward. The gradients are the same.
    memory_lean: run module k + 1's forward only after module k's backward,
      so that one module's activations are alive at a time (on one device
      the dataflow would start every forward first). Only where no gradient
      crosses a module (local learning, window 1).
    min_traced_calls: `module_functions.ModuleFunctions`'s cut-off (the
      trainer's `ExecutionOptions.min_traced_calls`).
  """

  def __init__(self, modules, plan, loss_fn, metric_fn=None, placement=None,
               recompute=False, memory_lean=False,
               min_traced_calls=module_functions.MIN_CALLS):
    self.modules = list(modules)
    self.plan = plan
    self.recompute = _per_module("recompute", recompute, len(self.modules))
    if not isinstance(memory_lean, bool):
      raise ValueError(f"memory_lean must be True or False. "
                       f"Received: memory_lean={memory_lean!r}")
    if memory_lean and any(plan.vjp_keys[k] for k in range(len(modules))):
      raise ValueError(
          "memory_lean=True needs a strategy where no gradient crosses a "
          "module (local): module k's backward would wait for module k + 1's"
          " forward. Received: memory_lean=True with a window that sends "
          "gradients back")
    self.memory_lean = memory_lean
    self.loss_fn = loss_fn
    self.metric_fn = metric_fn
    self.placement = placement or placement_lib.Placement("single")
    self.functions = module_functions.ModuleFunctions(
        self.modules, self.placement, min_calls=min_traced_calls)
    self._warned_no_gradient = set()

  def _average(self, per_example, global_batch_size, what):
    per_example = tf.cast(per_example, tf.float32)
    if per_example.shape.rank == 0:
      raise ValueError(
          f"{what} must return one value per example (shape [batch]), not a "
          f"batch mean: the engine averages over the global batch itself. "
          f"Received: {what} output shape=()")
    return tf.nn.compute_average_loss(
        per_example, global_batch_size=global_batch_size)

  def own_loss(self, k, logits, labels, global_batch_size, metrics):
    """Module k's own loss L_k, as the step trains it.

    Public for tools that time or inspect one module's ops
    (`step_model.module_ops.module_loss`); the step itself calls it for
    every loss.

    Args:
      k: the module (0-based): its aux head's loss, or the true loss for
        the last module.
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
    metrics[metric_names.metric_name(k, "loss")] = loss
    if self.metric_fn is not None:
      # One per-example score, logged as "accuracy", or {name: scores}
      # (`keras_metrics`: compile's list of metrics).
      for name, value in metric_names.named_scores(
          self.metric_fn(labels, logits)).items():
        metrics[metric_names.metric_name(k, name)] = self._average(
            value, global_batch_size, "metric_fn")
    return loss

  def gradients(self, features, labels, global_batch_size, scales=None):
    """Runs forward and routed backward for one batch on one replica.

    Args:
      features: the network input h_{-1}.
      labels: the targets, passed to `loss_fn`.
      global_batch_size: the batch size across all replicas (and
        microbatches) that losses are averaged over.
      scales: optional per-module loss scales S_k (float32 scalars, None
        for 1); None when no module scales its loss.

    Returns:
      `(grads, metrics)`: grads[k] is a list aligned with
      `modules[k].trainable_variables` (theta_k then phi_k), multiplied by
      S_k; metrics maps "module_{k}/loss" (1-based, `metric_names`) etc. to
      this replica's contribution (unscaled).
    """
    num_modules = len(self.modules)
    if self.memory_lean:
      return self._lean_gradients(features, labels, global_batch_size,
                                  scales)
    # Forward, module 0 up to K-1: module k's record keeps what its backward
    # pass needs (tape, x_k, h_k) and the start of its own loss's stream.
    records, metrics, h = [], {}, features
    for k in range(num_modules):
      records.append(self._forward(
          k, h, labels, global_batch_size, metrics,
          None if scales is None else scales[k]))
      h = records[k].h
    # Backward, module K-1 down to 0: module k takes the streams that
    # module k+1 sent across h_k and sends on those that train modules
    # below it. The records (and their persistent tapes) go on return.
    grads, incoming = [None] * num_modules, {}
    for k in reversed(range(num_modules)):
      grads[k], incoming = self._backward(k, records[k], incoming, scales)
    return grads, metrics

  def _lean_gradients(self, features, labels, global_batch_size, scales):
    """`gradients` in the memory-lean order: module k's forward, then its
    backward (no stream crosses a module), and only then module k + 1's
    forward, which waits for module k's gradients."""
    grads, metrics, h = [], {}, features
    for k in range(len(self.modules)):
      record = self._forward(k, h, labels, global_batch_size, metrics,
                             None if scales is None else scales[k])
      grads.append(self._backward(k, record, {}, scales)[0])
      h = after(grads[k], record.h)
    return grads, metrics

  def _body_forward(self, k, x):
    """h_k and its scaled regularization loss (under the caller's tape)."""
    # One traced function per module (`module_functions`): the unrolled
    # steps call it instead of re-tracing the body.
    h, reg = self.functions.body(k, x)
    h = tf.nest.map_structure(lambda t: self.placement.annotate(t, k), h)
    return h, None if reg is None else tf.nn.scale_regularization_loss(reg)

  def _forward(self, k, h_prev, labels, global_batch_size, metrics, scale):
    """Module k's forward pass and its own loss: the module's `_Forward`."""
    module, place = self.modules[k], self.placement
    last = k == len(self.modules) - 1
    with place.scope(k):
      x = boundary.cut(h_prev)
      state = None
      if self.recompute[k]:
        # Run without a tape: nothing is kept for the backward, which runs
        # the body again (`_recomputed`) from what it read here.
        state = [tf.identity(v) for v in
                 module.body.non_trainable_variables]
        h, reg = self._body_forward(k, x)
      # The tape watches the variables the body reads (theta_k) and, to
      # produce input VJPs, the cut input x_k (its floating-point leaves:
      # masks and ids get no cotangent).
      with tf.GradientTape(persistent=True) as tape:
        if state is None:
          if k > 0:
            tape.watch(boundary.differentiable(x))
          h, reg = self._body_forward(k, x)
        if last:
          # M_{K-1} ends with the model's own head: L_{K-1} = loss(h, y) is
          # the true loss, taken on this tape.
          tape.watch(h)
          loss = _scaled(self.own_loss(k, h, labels, global_batch_size,
                                       metrics), scale)
      own_cot, phi_grads = None, []
      if last:
        own_cot = [tape.gradient(loss, h)]
      elif module.has_aux_head:
        # L_k = loss(A_k(h_k), y): phi_k's gradient, and dL_k/dh_k when L_k
        # trains some theta.
        own_cot, phi_grads = self._aux_backward(k, module, h, labels,
                                                global_batch_size, metrics,
                                                scale)
    return _Forward(tape, x, h, reg, own_cot, phi_grads, state)

  def _recomputed(self, k, record, cotangents):
    """`record` with module k's forward run again under a new tape, once the
    `cotangents` it is differentiated with exist (before, the dataflow could
    run it at once and keep its activations as long as without
    recomputation). The body's non-trainable variables are first put back
    to what the first forward read, so it computes the same h_k and leaves
    them as one forward would."""
    variables = self.modules[k].body.non_trainable_variables
    with tf.control_dependencies(cotangents):
      # (TF orders the body's reads of these variables after the writes.)
      for v, value in zip(variables, record.state):
        v.assign(value)
      x = tf.nest.map_structure(tf.identity, record.x)
    with tf.GradientTape(persistent=True) as tape:
      if k > 0:
        tape.watch(boundary.differentiable(x))
      h, reg = self._body_forward(k, x)
    return dataclasses.replace(record, tape=tape, x=x, h=h, reg=reg,
                               state=None)

  def _backward(self, k, record, incoming, scales):
    """Module k's gradients and the streams it sends to module k-1.

    Args:
      k: the module (0-based).
      record: its `_Forward`.
      incoming: {lo: cotangent at h_k} of the streams module k+1 sent, at
        module k+1's scale; {} for the last module.
      scales: the per-module loss scales, or None.

    Returns:
      `(grads, outgoing)`: theta_k's then phi_k's gradients (times S_k), and
      {lo: S_k dL/dx_k} of each stream that trains a module below k.
    """
    module, plan, place = self.modules[k], self.plan, self.placement
    scale = None if scales is None else scales[k]
    with place.scope(k):
      streams = dict(incoming)
      if scales is not None and k + 1 < len(self.modules):
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
        record = self._recomputed(k, record,
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
      # When the one stream that trains theta_k also goes on to module
      # k - 1 (always so end to end), one backward pass gives both the
      # weight and the input VJP and shares the work through the body.
      fused = len(weight_keys) == 1 and weight_keys[0] in plan.vjp_keys[k]
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
      outgoing = {key: [place.annotate(self._cotangent(k, record, x, v), k)
                        for x, v in zip(inputs, value)]
                  for key, value in outgoing.items()}
      grads = theta_grads + record.phi_grads
      if scale is not None:
        grads = _poison_unless_finite(grads, list(outgoing.values()))
    return grads, outgoing

  def _cotangent(self, k, record, x, value):
    """dL/dx for one leaf x of x_k, or zero when a layer without a gradient
    cuts it (warned once per module, naming the layer: `no_gradient`)."""
    if value is not None:
      return value
    if k not in self._warned_no_gradient:
      self._warned_no_gradient.add(k)
      no_gradient.warn(k, self.modules[k], record.x)
    return tf.zeros_like(x)

  def _aux_backward(self, k, module, h, labels, global_batch_size, metrics,
                    scale):
    """S_k dL_k/dphi_k, plus the cotangent S_k dL_k/dh_k when L_k trains
    theta."""
    phi = module.aux_head.trainable_variables
    starts_stream = self.plan.loss_low[k] is not None
    # The head reads the boundary's primary tensor (the hidden state).
    read = boundary.primary(h)
    with tf.GradientTape() as tape:
      if starts_stream:
        tape.watch(read)
      # Without a stream (e.g. every head in end-to-end training) the head
      # reads a detached h_k: a probe that can never reach theta.
      logits = module.aux_head(
          read if starts_stream else tf.stop_gradient(read), training=True)
      loss = _scaled(self.own_loss(k, logits, labels, global_batch_size,
                                   metrics), scale)
    if starts_stream:
      grads = tape.gradient(loss, phi + [read])
      # Zero for every other differentiable leaf: only the primary one
      # reaches L_k.
      own_cot = [grads[-1] if t is read else tf.zeros_like(t)
                 for t in boundary.differentiable(h)]
      return own_cot, _zeros_like_none(grads[:-1], phi)
    return None, _zeros_like_none(tape.gradient(loss, phi), phi)


def after(tensors, structure):
  """`structure`'s tensors, each run only once every tensor in `tensors`
  (any nest) exists: the memory-lean order's edge."""
  deps = [t for t in tf.nest.flatten(tensors, expand_composites=True)
          if t is not None]
  with tf.control_dependencies(deps):
    return tf.nest.map_structure(tf.identity, structure)


def _per_module(name, value, num_modules):
  """A bool for every module from one bool or a list of K."""
  if isinstance(value, bool):
    return [value] * num_modules
  if (isinstance(value, (list, tuple)) and len(value) == num_modules
      and all(isinstance(v, bool) for v in value)):
    return list(value)
  raise ValueError(f"{name} must be a bool or a list of {num_modules} bools "
                   f"(one per module). Received: {name}={value!r}")


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


def make_plan_for(modules, strategy):
  """The routing plan of `strategy` over these `InterlockModule`s."""
  return routing.make_plan(strategy, len(modules),
                           [m.has_aux_head for m in modules])
