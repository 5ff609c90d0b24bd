"""`InterlockTrainer`: the distributed interlocking training loop.

The loop follows TF Model Garden's orbit: one `tf.function` call runs
`steps_per_loop` steps and the per-module metrics come back to the host once
per call. The steps are Python-unrolled into one dataflow graph: the only
ordering between step t and t + 1 is then the real one (module k's forward at
t + 1 reads the weights its update at t wrote; TF orders reads and writes per
variable), so module k can run step t + 1 while later modules finish step t.
More unrolled steps per call give the runtime more room to overlap (the
README's benchmark table measures it). Where the window covers every module
there is no such slack, nor any measured on CPUs where a tied weight couples
module 1 to module K; there `loop="auto"` traces one step and loops it
instead (`step_loop`), which cuts the first call's tracing and graph
optimisation to one step's. Local learning on CPUs runs as a pipeline in a
graph loop instead (`pipelined_loop`: module k on step t - k, each
iteration's modules side by side, one iteration traced; its stages are
`_pipeline_stages`). `graph_optimization` gives the training call a
lighter graph optimisation on CPU (`tf_private`). Both, the per-module
functions' cut-off and `fit`'s data autotuning are `ExecutionOptions`, fixed
when the trainer is made. Nothing in the step may
serialize the graph: no shared metric variables, no host callbacks, no
variable shared by two modules (loss scales are per module, see `engine`);
metrics are returned tensors.

The same code runs under the default strategy, `MirroredStrategy` and
`TPUStrategy`: each replica computes routed gradients for its share of the
batch (`engine.InterlockStep`), and each module's Keras optimizer sums them
across replicas before it updates that module (`module_step.ModuleStep.update`,
after the microbatches' and tied copies' sums here).

`build` verifies the placement: every variable of module k (body, aux head,
optimizer slots, step counter, learning rate, loss scale) must sit on module
k's device, or it raises naming the variable.

A layer called in two modules (tied weights, e.g. an embedding reused as
the output head) is a copy in each; before the updates, each copy's
gradient is replaced by the sum over the copies (`tied_gradients`), so
every copy takes the same step.

Under `mixed_float16` every module's optimizer is a
`keras.optimizers.LossScaleOptimizer` (plain optimizers are wrapped, as
`keras.Model.compile` does): module k scales its losses by its own dynamic
scale S_k and its optimizer unscales its gradients and skips a non-finite
step, lowering S_k, by Keras's rules.

With `jit_compile` (XLA, docs/xla.md) placement "single" compiles each
whole replica step (forward, routed backward and the K updates of every
microbatch) as one XLA program; the depthwise placements compile each
module's body, update and gradient norm on its own device
(`module_functions`), so the modules still overlap; "tpu" is compiled by
`TPUStrategy.run`.
"""

import keras
import tensorflow as tf

from tf_interlock import call_guard
from tf_interlock import engine
from tf_interlock import exits as exits_lib
from tf_interlock import losses as losses_lib
from tf_interlock import metric_names
from tf_interlock import module_functions
from tf_interlock import pipelined_loop
from tf_interlock import placement as placement_lib
from tf_interlock import step_loop
from tf_interlock import tf_private
from tf_interlock import tied_gradients
from tf_interlock import training_options

_OPTIMIZERS_ALLOWED = ("one keras.optimizers.Optimizer (cloned for every "
                       "module), an optimizer name such as 'adam', a list "
                       "of one optimizer per module, or a callable "
                       "k -> optimizer")


def _add(a, b):
  """a + b for two microbatches' gradients of one variable. An embedding's
  gradient is an IndexedSlices, which has no +: the rows of both are kept
  (indices may repeat; converting to a tensor, as optimizers do, sums
  them)."""
  if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
    return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                            tf.concat([a.indices, b.indices], 0),
                            a.dense_shape)
  return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def _module_of(key):
  """The index of the module a logged value belongs to (0 if none)."""
  try:
    return metric_names.parse_metric_name(key)[0]
  except ValueError:
    return 0


def _split(structure, num):
  """Splits every tensor of `structure` into `num` equal parts on axis 0."""
  if num == 1:
    return [structure]
  flat = [tf.split(t, num, axis=0) for t in tf.nest.flatten(structure)]
  return [tf.nest.pack_sequence_as(structure, [parts[i] for parts in flat])
          for i in range(num)]


class DatasetEndedError(tf.errors.OutOfRangeError, ValueError):
  """The input ended inside a `train_loop` call.

  A `ValueError` with a message for people, and still the
  `tf.errors.OutOfRangeError` that Keras's epoch loop takes as the end of an
  epoch.
  """


class InterlockTrainer:
  """Trains K interlocking modules with one optimizer each.

  Args:
    modules: the K `layers.InterlockModule`s, in depth order, unbuilt (a
      layer built before the placement keeps its device: `build` raises).
    optimizers: one Keras optimizer per module (module k's also trains its
      aux head), given as one optimizer instance (cloned per module with
      `from_config(get_config())`; the instance itself is not used), a
      name for `keras.optimizers.get`, a list of K instances (created inside
      `distribute.scope()`), or a callable `k -> optimizer` (0-based k),
      called inside `distribute.scope()` and module k's placement scope.
      Under `mixed_float16` each is wrapped in a `LossScaleOptimizer`
      unless it is one already.
    strategy: the window: "e2e", "local", "pairwise", "Nwise", an int, or an
      `InterlockStrategy` (`TrainingOptions.strategy`).
    variant: "only" or "sum"; refused when `strategy` names another
      (e.g. "2wise-sum" with variant="only").
    loss_fn: a `keras.losses.Loss` (any reduction; it is applied per
      example) or `loss_fn(labels, logits) -> per-example loss [batch]`.
      Defaults to sparse softmax cross-entropy.
    metric_fn: `metric_fn(labels, logits) -> per-example score [batch]`,
      reported as "accuracy". Defaults to sparse accuracy; None disables.
    distribute: a `tf.distribute.Strategy`; defaults to the current one.
    placement: None ("single"), a registered name ("simulated", "gpu",
      ...) or a `placement.Placement`: module k's device, as
      `InterlockModel(placement=)` takes it.
    replicas: a `replicas.CollectiveReplicas` when this process is one of
      R processes that each hold all K modules (replicas x modules across
      hosts, see `tf_interlock.replicas`): module k's gradients and metrics
      are summed over the R processes on module k's device before its
      update, and `distribute_dataset` gives this process its rows of each
      global batch. None: this process alone.
    steps_per_loop, num_microbatches, jit_compile, recompute, memory_lean:
      the `TrainingOptions` fields of these names (training steps per
      `tf.function` call; M microbatches per replica batch; XLA; module k
      re-runs its forward inside its backward; one module's activations
      alive at a time, local learning only); None: the value of `options`.
    options: a `TrainingOptions` (every setting in one frozen value), or an
      `ExecutionOptions` (the defaults with that execution); None: the
      defaults. The arguments above, when given, replace its fields. Read
      back as `trainer.options`; never changed after construction.
  """

  def __init__(self, modules, optimizers, strategy=None, *, variant=None,
               loss_fn=losses_lib.sparse_softmax_cross_entropy,
               metric_fn=losses_lib.sparse_accuracy, distribute=None,
               placement=None, steps_per_loop=None, num_microbatches=None,
               replicas=None, jit_compile=None, recompute=None,
               memory_lean=None, options=None):
    # Every setting in one frozen value, checked here (types too); the
    # keyword arguments only build it.
    self.options = training_options.make(
        options, strategy=strategy, variant=variant,
        steps_per_loop=steps_per_loop, num_microbatches=num_microbatches,
        jit_compile=jit_compile, recompute=recompute,
        memory_lean=memory_lean)
    # Two threads in `train_loop` would share the optimizers' counters and
    # the iterator: the second is refused (`call_guard`).
    self._call_guard = call_guard.CallGuard("InterlockTrainer")
    self.modules = list(modules)
    self.replicas = replicas
    if not self.modules:
      raise ValueError("InterlockTrainer needs at least one module. "
                       "Received: modules=[]")
    self.plan = engine.make_plan_for(self.modules, self.strategy)
    self.distribute = distribute or tf.distribute.get_strategy()
    self.placement = placement_lib.resolve(placement, len(self.modules),
                                           self.distribute)
    self.placement.check_modules(len(self.modules))
    self.float16 = _uses_float16(self.modules)
    self.placement.check_trainer(self.distribute, self.float16)
    if self.replicas is not None:
      self.replicas.check_trainer(self.distribute, self.float16)
    # The resolved bool (the options keep what was asked: "auto").
    self.jit_compile = module_functions.resolve_jit_compile(
        self.options.jit_compile, self.placement, self.distribute)
    self.optimizers = self._make_optimizers(optimizers)
    self.step = engine.InterlockStep(
        self.modules, self.plan, losses_lib.per_example_loss(loss_fn),
        metric_fn, self.placement, recompute=self.options.recompute,
        memory_lean=self.options.memory_lean,
        min_traced_calls=self.options.execution.min_traced_calls,
        optimizers=self.optimizers, replicas=self.replicas)
    self._loop_fns = {}
    self._built = False
    # The ties between modules (a layer called in two of them), found by
    # `build` once the variables exist; None when there are none.
    self._tied = None
    # What one XLA program holds (`jit_compile`): each module's functions
    # on its own device, or one whole replica step on the one device (its
    # per-module functions then inline: XLA sees the whole step anyway).
    self._compile_step = False
    if self.jit_compile and self.placement.xla_unit == "module":
      self.step.functions.compile_each()
    elif (self.jit_compile and self.placement.xla_unit == "replica_step"
          and not self.placement.compiles_step(self.distribute)):
      self._compile_step = True
      self.step.functions.traced = False

  @property
  def num_modules(self):
    return len(self.modules)

  @property
  def strategy(self):
    """The `InterlockStrategy` (`options.strategy`)."""
    return self.options.strategy

  @property
  def steps_per_loop(self):
    """Steps per `train_loop` call (`options.steps_per_loop`)."""
    return self.options.steps_per_loop

  @property
  def num_microbatches(self):
    """M (`options.num_microbatches`)."""
    return self.options.num_microbatches

  def _make_optimizers(self, optimizers):
    """K distinct optimizers, each made in its module's scopes."""
    num = len(self.modules)
    factory = optimizer_factory(optimizers, num)
    made = []
    for k in range(num):
      # Step counter and learning rate live with the module they update.
      with self.distribute.scope(), self.placement.scope(k):
        opt = factory(k)
        if not isinstance(opt, keras.optimizers.Optimizer):
          raise ValueError(
              f"optimizers must be {_OPTIMIZERS_ALLOWED}; the one for "
              f"module {k + 1} is not a Keras optimizer. "
              f"Received: optimizer={opt!r}")
        made.append(opt)
        if self.float16 and not isinstance(
            opt, keras.optimizers.LossScaleOptimizer):
          made[-1] = keras.optimizers.LossScaleOptimizer(opt)
    if len({id(o.inner_optimizer if self.float16 else o)
            for o in made}) != num:
      raise ValueError("Each module needs its own optimizer instance. "
                       "Received: the same optimizer several times")
    for k, opt in enumerate(made):
      if not self.distribute.extended.variable_created_in_scope(
          opt.iterations.value):
        raise ValueError(
            f"The optimizer of module {k + 1} was created outside "
            f"distribute.scope(): it would count steps once per replica. "
            f"Create it inside the scope, or pass one optimizer, a name or "
            f"a callable. Received: optimizers[{k}]={opt.name}")
    return made

  def variables(self, k):
    """theta_k then phi_k: the order of `InterlockStep` gradients."""
    return self.step.module_steps[k].variables()

  @call_guard.guarded
  def build(self, sample_features):
    """Creates every weight and optimizer slot, eagerly, in scope.

    Then checks that each module's variables are on its device.

    Args:
      sample_features: one batch (any size) of network inputs; only its
        shapes and dtypes matter.

    Raises:
      ValueError: naming a variable that is not on its module's device.
    """
    with self.distribute.scope():
      h = tf.nest.map_structure(lambda t: tf.convert_to_tensor(t)[:1],
                                sample_features)
      exits_lib.build(self.modules, h, scope=self.placement.scope)
      for k, opt in enumerate(self.optimizers):
        with self.placement.scope(k):
          opt.build(self.variables(k))
    for k, (module, opt) in enumerate(zip(self.modules, self.optimizers)):
      self.placement.check_variables(
          k, [(f"weight {v.path!r}", v) for v in module.weights],
          " A layer keeps the device it was built on: pass the modules "
          "unbuilt (no keras.Input, not called yet), e.g. via from_keras.")
      self.placement.check_variables(
          k, [(f"optimizer variable {v.path!r}", v) for v in opt.variables],
          " An optimizer's step counter is created with the optimizer: pass "
          "a callable k -> optimizer, one optimizer to clone, or a name, "
          "and the trainer creates it in the module's scope.")
    tied = tied_gradients.TiedGradients(
        self.modules, [self.variables(k) for k in range(self.num_modules)],
        self.optimizers, self.float16)
    self._tied = tied if tied.groups else None
    self._built = True

  def checkpoint(self, **extra):
    """A `tf.train.Checkpoint` of every module, head and optimizer.

    Each object is tracked as a named attribute: Keras 3 layers held only in
    a Python list are silently left out of TF checkpoints.

    Args:
      **extra: further trackables to save alongside (e.g. a step counter).

    Returns:
      The checkpoint.
    """
    objects = dict(extra)
    for k, (module, opt) in enumerate(zip(self.modules, self.optimizers)):
      objects[f"module_{k + 1}"] = module
      objects[f"optimizer_{k + 1}"] = opt
    return tf.train.Checkpoint(**objects)

  def _loss_scale(self, k):
    """Module k's LossScaleOptimizer's scale S_k, or None."""
    opt = self.optimizers[k]
    if not isinstance(opt, keras.optimizers.LossScaleOptimizer):
      return None
    with self.placement.scope(k):
      return tf.convert_to_tensor(opt.dynamic_scale)

  def _loss_scales(self):
    """Per module, its LossScaleOptimizer's scale S_k (else None); or None."""
    scales = [self._loss_scale(k) for k in range(self.num_modules)]
    return None if all(s is None for s in scales) else scales

  def _replicas(self):
    """The replicas a step's batch is split over: the strategy's, times
    the processes' of `replicas`."""
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    if self.replicas is not None:  # R processes, each with this batch
      replicas *= self.replicas.num_replicas
    return replicas

  def _global_batch(self, features):
    """The examples a step's losses are averaged over (this replica's
    static batch times the replicas), after checking the batch."""
    m = self.num_microbatches
    batch = tf.nest.flatten(features)[0].shape[0]
    if batch is None:
      raise ValueError("The per-replica batch size must be static (use "
                       "drop_remainder=True). Received: batch_size=None")
    if batch % m:
      raise ValueError(
          f"The per-replica batch ({batch}) must divide into "
          f"num_microbatches. Received: num_microbatches={m}")
    return batch * self._replicas()

  def _replica_step(self, features, labels):
    """One step on one replica: routed gradients, then K updates."""
    m = self.num_microbatches
    global_batch = self._global_batch(features)
    context = tf.distribute.get_replica_context()
    replicas = self._replicas()
    scales = self._loss_scales()
    # Losses are averaged over the whole global batch, so summing the
    # microbatches' gradients gives the full batch's gradient.
    grads, metrics = None, None
    for f_i, l_i in zip(_split(features, m), _split(labels, m)):
      if self.step.memory_lean and grads is not None:
        f_i = engine.after(grads, f_i)
      g, mets = self.step.gradients(f_i, l_i, global_batch, scales)
      if grads is None:
        grads, metrics = g, mets
      else:
        grads, metrics = self._accumulate(grads, metrics, g, mets)
    if self._tied is not None:
      # Each copy of a tied weight applies the sum of every copy's
      # gradient (`tied_gradients`); the norms below include it.
      grads = self._tied.sum(grads, self.placement.scope)
    # Module k's update (`ModuleStep.update`: its gradient norm, one skip
    # decision under loss scaling, the sum over processes, its optimizer).
    for k, module_step in enumerate(self.step.module_steps):
      module_step.update(grads[k], None if scales is None else scales[k],
                         replicas, context, metrics)
    return metrics

  def _module_stage(self, k, microbatches, global_batch):
    """Module k's whole step under local learning (`pipelined_loop`): its
    forward, own loss and backward per microbatch, then its update.

    Args:
      k: the module (0-based).
      microbatches: `(inputs, labels)`, tuples of the M microbatches'
        h_{k-1} (the features for k = 0) and targets.
      global_batch: the examples the losses are averaged over.

    Returns:
      `((h_k per microbatch, labels), metrics)`: what module k + 1 takes,
      and module k's metrics of this step.
    """
    module_step = self.step.module_steps[k]
    scale = self._loss_scale(k)
    # Only S_k is read: no stream arrives from module k + 1.
    scales = None if scale is None else [None] * k + [scale]
    grads, metrics, outputs = None, None, []
    for x_i, l_i in zip(*microbatches):
      mets = {}
      record = module_step.forward(x_i, l_i, global_batch, mets, scale)
      g, _ = module_step.backward(record, {}, scales)
      g = engine.after_reads(record, {}, mets, k, g)
      outputs.append(record.h)
      if grads is None:
        grads, metrics = g, mets
      else:  # The microbatches' sums, on module k's device.
        with self.placement.scope(k):
          grads = [_add(a, b) for a, b in zip(grads, g)]
          metrics = {key: metrics[key] + mets[key] for key in metrics}
    module_step.update(grads, scale, self._replicas(),
                       tf.distribute.get_replica_context(), metrics)
    return (tuple(outputs), microbatches[1]), metrics

  def _pipeline_stages(self, inputs, active):
    """One iteration of `pipelined_loop`: module k's step on `inputs[k]`
    for each k in `active`, on the one replica; metrics reduced as
    `_step_metrics` does."""
    m = self.num_microbatches

    def replica_fn(inputs):
      outputs, metrics = {}, {}
      for k in active:
        if k == 0:
          features, labels = inputs[0]
          global_batch = self._global_batch(features)
          staged = (tuple(_split(features, m)), tuple(_split(labels, m)))
        else:  # h_{k-1} and the labels, M microbatches of one batch.
          staged = inputs[k]
          leaves = tf.nest.flatten(staged[1]) or tf.nest.flatten(staged[0])
          global_batch = m * leaves[0].shape[0] * self._replicas()
        outputs[k], mets = self._module_stage(k, staged, global_batch)
        metrics.update(mets)
      return outputs, metrics

    outputs, metrics = self.distribute.run(replica_fn, args=(inputs,))
    outputs = tf.nest.map_structure(
        lambda v: self.distribute.experimental_local_results(v)[0], outputs)
    return outputs, {
        key: self.distribute.reduce(tf.distribute.ReduceOp.SUM, value,
                                    axis=None)
        for key, value in metrics.items()}

  def _accumulate(self, grads, metrics, more_grads, more_metrics):
    """The sums of two microbatches' gradients and metrics, each module's
    on its own device: unplaced, every sum of every module would run on
    the default device, one more queue for module 1's device to serve
    M - 1 times a step."""
    summed = []
    for k, (ga, gb) in enumerate(zip(grads, more_grads)):
      with self.placement.scope(k):
        summed.append([_add(a, b) for a, b in zip(ga, gb)])
    totals = {}
    for key in metrics:
      with self.placement.scope(_module_of(key)):
        totals[key] = metrics[key] + more_metrics[key]
    return summed, totals

  def _step_metrics(self, features, labels):
    """One step on every replica; its metrics summed over replicas."""
    per_replica = self.distribute.run(self._replica_step,
                                      args=(features, labels))
    return {key: self.distribute.reduce(tf.distribute.ReduceOp.SUM, value,
                                        axis=None)
            for key, value in per_replica.items()}

  @property
  def resolved_loop(self):
    """How a `train_loop` call of `steps_per_loop` steps runs them:
    "unrolled", "while" or "pipelined" (`loop_plan`)."""
    return self.loop_plan()[0]

  def loop_plan(self, num_steps=None):
    """How a `train_loop` call of `num_steps` (default `steps_per_loop`)
    steps runs them: (loop, U), `options.execution` as
    `step_loop.resolve_call` settles it for this trainer (its ties and
    weights are known once it is built); U is the steps of one traced
    block ("pipelined": iterations a trip; "unrolled": 1)."""
    execution = self.options.execution
    replicas = self.distribute.num_replicas_in_sync * (
        1 if self.replicas is None else self.replicas.num_replicas)
    weights = sum(len(module.trainable_weights) for module in self.modules)
    return step_loop.resolve_call(
        execution.loop, execution.loop_block, self.plan,
        self.placement.one_process, replicas,
        () if self._tied is None else self._tied.modules,
        self.placement.on_accelerator(), self.step.memory_lean,
        self._compile_step, block_weights=weights * self.num_microbatches,
        num_steps=num_steps or self.steps_per_loop,
        max_block_weights=execution.max_block_weights)

  def _make_loop(self, num_steps):
    step = self._step_metrics
    if self._compile_step:
      # One XLA program per step, traced once and called by every unrolled
      # step (the input iterator stays outside: it is a host op).
      step = tf.function(step, autograph=False, jit_compile=True)
    kind, block = self.loop_plan(num_steps)

    def run_steps(iterator, n):
      # The sums of n steps' metrics, the steps written out one after
      # another: module k of step t + 1 can run while later modules still
      # work on step t.
      totals = None
      for _ in range(n):
        features, labels = next(iterator)
        if self.step.memory_lean and totals is not None:
          # The step before is done (its metrics hold every module's
          # gradient norm) before this one starts.
          features = engine.after(totals, features)
        metrics = step(features, labels)
        totals = metrics if totals is None else {
            key: totals[key] + metrics[key] for key in totals}
      return totals

    if kind == "pipelined":
      # Module k on step t - k, one iteration traced (`pipelined_loop`).
      return pipelined_loop.make_pipelined_loop(
          self._pipeline_stages, self.num_modules, num_steps,
          lambda copies: self.step.functions.tracing_loop(
              copies * self.num_microbatches), block)
    if kind == "while":
      # U steps traced, looped (`step_loop`).
      return step_loop.make_while_loop(
          run_steps, num_steps, lambda steps: self.step.functions.tracing_loop(
              steps * self.num_microbatches), block)

    def loop(iterator):
      # Runs while tracing: per-module functions only where this loop calls
      # each one often enough to pay for tracing it (`module_functions`).
      self.step.functions.tracing_loop(num_steps * self.num_microbatches)
      totals = run_steps(iterator, num_steps)
      return {key: value / num_steps for key, value in totals.items()}
    # autograph=False: the Python loops over steps and modules are meant to
    # unroll into one dataflow graph.
    return tf.function(loop, autograph=False)

  def loop_function(self, num_steps):
    """The `tf.function` that `train_loop` calls for `num_steps` steps.

    Made once per `num_steps`; it takes the iterator and returns the
    metrics as tensors. Exposed to time or inspect its tracing (e.g.
    `get_concrete_function(iterator)`).
    """
    if num_steps not in self._loop_fns:
      self._loop_fns[num_steps] = self._make_loop(num_steps)
    return self._loop_fns[num_steps]

  @call_guard.guarded
  def train_loop(self, iterator, num_steps=None):
    """Runs `num_steps` (default `steps_per_loop`) steps in one call.

    Args:
      iterator: an iterator over a `distribute_dataset` of
        `(features, labels)` batches. It must hold `num_steps` more
        batches (repeat the dataset, or pass a smaller `num_steps`).
      num_steps: steps in this call; each distinct value traces once.

    Returns:
      Per-module metrics (mean over the steps) as Python floats, keys from
      `metric_names.metric_name`: "module_{k}/loss", "module_{k}/accuracy"
      (with a metric_fn) and "module_{k}/grad_norm", k = 1..K; with loss
      scaling also "module_{k}/loss_scale" and "module_{k}/skipped" (the
      fraction of steps skipped for non-finite gradients; their grad_norm
      counts as 0).

    Raises:
      RuntimeError: before `build`, or while another thread is in
        `train_loop` or `build` of this trainer.
      DatasetEndedError: when the iterator ends inside the loop.
    """
    if not self._built:
      raise RuntimeError(
          "InterlockTrainer.train_loop before build: call "
          "trainer.build(sample_features) first, with one batch of inputs, "
          "so that every weight and optimizer slot is created on its "
          "module's device.")
    num_steps = num_steps or self.steps_per_loop
    try:
      optimization = self.options.execution.graph_optimization
      if optimization == "light" or (
          optimization == "auto"
          and self.placement.one_process
          and not self.placement.on_accelerator()):
        with tf_private.light_graph_optimization():
          metrics = self.loop_function(num_steps)(iterator)
      else:
        metrics = self.loop_function(num_steps)(iterator)
    except tf.errors.OutOfRangeError:
      counters = [int(opt.iterations.numpy()) for opt in self.optimizers]
      raise DatasetEndedError(
          None, None,
          f"The dataset ended inside a loop of {num_steps} steps; updates "
          f"that ran before the end are kept (modules' step counters now "
          f"{counters}). Repeat the dataset, or pass num_steps <= the "
          f"batches left. Received: num_steps={num_steps}") from None
    return {key: float(value) for key, value in metrics.items()}

  def distribute_dataset(self, dataset):
    """`dataset` of global batches, split across this trainer's replicas."""
    if self.replicas is not None:
      dataset = self.replicas.shard(dataset)
    return self.distribute.experimental_distribute_dataset(dataset)


def optimizer_factory(optimizers, num_modules, name="optimizers",
                      clone=False):
  """`k -> module k's optimizer` (0-based k) from any accepted form.

  The trainer calls it inside module k's scopes, so each optimizer's step
  counter and slots are created on its module's device.

  Args:
    optimizers: one Keras optimizer (a fresh clone per module, from its
      config; the instance itself is never updated), an optimizer name, a
      list of `num_modules` optimizers, or a callable `k -> optimizer`.
    num_modules: K.
    name: the argument's name in error messages (`compile` says
      "optimizer").
    clone: also clone a list's optimizers (Keras's `compile` takes
      instances made anywhere); the trainer itself uses them as given.

  Returns:
    The callable.

  Raises:
    ValueError: naming `name`, for anything else or a list of the wrong
      length.
  """
  if isinstance(optimizers, keras.optimizers.Optimizer):
    return lambda k: _clone(optimizers, name)
  if isinstance(optimizers, str):
    return lambda k: _optimizer_by_name(optimizers, name)
  if callable(optimizers):
    return optimizers
  if isinstance(optimizers, (list, tuple)):
    if len(optimizers) != num_modules:
      raise ValueError(
          f"Need one optimizer per module ({num_modules} modules). "
          f"Received: len({name})={len(optimizers)}")
    if clone:
      return lambda k: _clone(optimizers[k], f"{name}[{k}]")
    return lambda k: optimizers[k]
  raise ValueError(f"{name} must be {_OPTIMIZERS_ALLOWED}. "
                   f"Received: {name}={optimizers!r}")


def _clone(optimizer, name):
  """A fresh optimizer with `optimizer`'s config (made in the caller's
  scopes)."""
  if not isinstance(optimizer, keras.optimizers.Optimizer):
    raise ValueError(f"{name} must be a Keras optimizer. "
                     f"Received: {name}={optimizer!r}")
  return optimizer.__class__.from_config(dict(optimizer.get_config()))


def _optimizer_by_name(optimizer, name):
  try:
    return keras.optimizers.get(optimizer)
  except ValueError as e:
    raise ValueError(f"{name} must be {_OPTIMIZERS_ALLOWED}; {optimizer!r} "
                     f"is no Keras optimizer name. "
                     f"Received: {name}={optimizer!r}") from e


def _uses_float16(modules):
  """Whether any module computes in float16 (e.g. under mixed_float16)."""
  return any(layer.compute_dtype == "float16"
             for module in modules for layer in (module, module.body))
