"""The interlocking training step: explicit gradient routing between modules.

One step of interlocking backpropagation (Gomez et al., 2022,
arXiv:2010.04116, Alg. 1) over modules M_0..M_{K-1}:

1. Forward. Module k sees x_k = stop_gradient(h_{k-1}) and computes
   h_k = M_k(x_k) under its own `tf.GradientTape` (persistent where module
   k takes more than one VJP on it). Module k < K-1
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

Module k's part of each (its forward and own loss, its backward, its update)
is one class, `module_step.ModuleStep`; this file runs them in the order
above over the K modules.

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


import tensorflow as tf

from tf_interlock import metric_names
from tf_interlock import module_functions
from tf_interlock import module_step
from tf_interlock import placement as placement_lib
from tf_interlock import routing


class InterlockStep:
  """One replica's interlocking gradients for one (micro)batch, over the
  K `module_step.ModuleStep`s (`module_steps[k]`: module k's forward,
  backward and update).

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
    optimizers: module k's optimizer for `module_steps[k].update`, or None
      (gradients only).
    replicas: a `replicas.CollectiveReplicas` that each update sums over,
      or None.
  """

  def __init__(self, modules, plan, loss_fn, metric_fn=None, placement=None,
               recompute=False, memory_lean=False,
               min_traced_calls=module_functions.MIN_CALLS, optimizers=None,
               replicas=None):
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
    self.module_steps = [
        module_step.ModuleStep(
            k, self.modules, plan, loss_fn, metric_fn, self.placement,
            self.functions, recompute=self.recompute[k],
            optimizer=None if optimizers is None else optimizers[k],
            replicas=replicas)
        for k in range(len(self.modules))]

  def own_loss(self, k, logits, labels, global_batch_size, metrics):
    """Module k's own loss L_k, as the step trains it
    (`ModuleStep.own_loss`).

    Public for tools that time or inspect one module's ops
    (`step_model.module_ops.module_loss`).

    Args:
      k: the module (0-based): its aux head's loss, or the true loss for
        the last module.
      logits: the aux head's output A_k(h_k), or h_{K-1} for the last module.
      labels: the targets, passed to `loss_fn`.
      global_batch_size: the examples the loss is averaged over.
      metrics: a dict that gets "module_{k+1}/loss" (and "/accuracy" with a
        `metric_fn`), this batch's contribution.

    Returns:
      L_k, a float32 scalar.
    """
    return self.module_steps[k].own_loss(logits, labels, global_batch_size,
                                         metrics)

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
      records.append(self.module_steps[k].forward(
          h, labels, global_batch_size, metrics,
          None if scales is None else scales[k]))
      h = records[k].h
    # Backward, module K-1 down to 0: module k takes the streams that
    # module k+1 sent across h_k and sends on those that train modules
    # below it. The records (and their tapes) go on return.
    grads, incoming = [None] * num_modules, {}
    for k in reversed(range(num_modules)):
      grads[k], incoming = self.module_steps[k].backward(records[k],
                                                         incoming, scales)
      grads[k] = after_reads(records[k], incoming, metrics, k, grads[k])
    return grads, metrics

  def _lean_gradients(self, features, labels, global_batch_size, scales):
    """`gradients` in the memory-lean order: module k's forward, then its
    backward (no stream crosses a module), and only then module k + 1's
    forward, which waits for module k's gradients."""
    grads, metrics, h = [], {}, features
    for k in range(len(self.modules)):
      step = self.module_steps[k]
      record = step.forward(h, labels, global_batch_size, metrics,
                            None if scales is None else scales[k])
      grads.append(after_reads(record, {}, metrics, k,
                                step.backward(record, {}, scales)[0]))
      h = after(grads[k], record.h)
    return grads, metrics


def after_reads(record, sent, metrics, k, grads):
  """Module k's gradients, handed to its update only once the ops that read
  theta_k and phi_k exist: h_k, the cotangents it sends down (`sent`), its
  own loss's cotangent at h_k and its loss (the aux head's, or the final).

  TF orders a read of a variable before a later write of it with a control
  edge, and TF 2.21's graph optimiser may drop it (its dependency pass:
  with that pass off, the edges stay). Where nothing the update needs was
  computed from the read (the worked example: a loss linear in its logit,
  linear modules), reads were left unordered against writes of the same
  variable: end to end theta_1's and theta_2's, and local's aux heads' over
  3 unrolled steps; one CI run's e2e step read the new theta_2 (theta_1
  moved by 0.88 instead of 1.2). These edges start at the ops that consume
  the reads, and the optimiser keeps them (tests/test_worked_example.py
  checks the optimised graphs).
  """
  loss = metrics.get(metric_names.metric_name(k, "loss"))
  return after([record.h, record.own_cot, sent, loss], grads)


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
  shown = list(value) if isinstance(value, tuple) else value
  raise ValueError(f"{name} must be a bool or a list of {num_modules} bools "
                   f"(one per module). Received: {name}={shown!r}")


def make_plan_for(modules, strategy):
  """The routing plan of `strategy` over these `InterlockModule`s."""
  return routing.make_plan(strategy, len(modules),
                           [m.has_aux_head for m in modules])
