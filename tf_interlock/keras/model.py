"""`InterlockModel`: interlocking training through Keras's compile and fit.

A plain `keras.Model` over interlocking modules cannot train them: every
module's input is cut with `stop_gradient` (Gomez et al., 2022,
arXiv:2010.04116), so Keras's single tape gives every module but the last a
None gradient and `fit` quietly updates the last module alone.
`InterlockModel` keeps Keras's `fit` (epochs, callbacks, progress bar,
History, validation) and replaces the function `fit` calls once per
`steps_per_execution` batches with `InterlockTrainer.train_loop`: the same
unrolled routed steps, one optimizer per module, the same overlap between
modules as the trainer's own loop. Keras's own multi-step function (a
`tf.while_loop` over `train_step`) was measured slower on the benchmark MLP
(`keras_fit.FitLogs` has the numbers); the per-module logs are still
Keras `Mean` trackers, which Keras resets every epoch.

What Keras sees under interlocking:
* training logs: "loss" (and "accuracy") are the last module's, i.e. the
  network's; "module_{k}/loss", "module_{k}/accuracy", "module_{k}/grad_norm"
  are every module's (k = 1..K, the aux head's for k < K). Each is the mean
  over the epoch so far.
* evaluation (and "val_*" in fit): the same names, computed on the data with
  every exit: module k's aux head for k < K, the network for "loss".
* `predict(x, exit=k)` serves modules 1..k then aux head k; exit=None (the
  default) or K serves the whole network.
* `model.optimizer` (a `ModuleOptimizers`): its `learning_rate` reads module
  1's and sets every module's (or those `model.optimizer.modules` names),
  which is what `LearningRateScheduler`, `ReduceLROnPlateau` and
  `TensorBoard` use.
* `summary()` prints one row per module; `modules[k].layer_names` lists the
  layers of module k + 1.
"""

import contextlib
import dataclasses

import keras
import tensorflow as tf

from tf_interlock import call_guard
from tf_interlock import evaluation
from tf_interlock import execution_options as execution_options_lib
from tf_interlock import exits as exits_lib
from tf_interlock import export as export_lib
from tf_interlock.keras import fit_checks
from tf_interlock.keras import input_nest
from tf_interlock.keras import habits as keras_habits
from tf_interlock.keras import fit as keras_fit
from tf_interlock.keras import metrics as keras_metrics
from tf_interlock.keras import origins as keras_origins
from tf_interlock import keras_private
from tf_interlock.keras import summary as keras_summary
from tf_interlock import losses as losses_lib
from tf_interlock import op_errors
from tf_interlock import placement as placement_lib
from tf_interlock.keras import sample_weights
from tf_interlock.keras import task_defaults
from tf_interlock import trainer as trainer_lib
from tf_interlock import training_options
from tf_interlock.keras.module_optimizers import ModuleOptimizers


@keras.saving.register_keras_serializable(package="tf_interlock")
class InterlockModel(keras.Model):
  """K interlocking modules trained with `compile`/`fit`.

  Args:
    modules: the K `InterlockModule`s in depth order (e.g. from
      `keras_split.from_keras`), unbuilt so that each is created on its own
      device.
    strategy: "e2e", "local", "pairwise", "Nwise", an int window, or an
      `InterlockStrategy`.
    variant: "only" or "sum", as for `InterlockTrainer`.
    placement: None, "single", "simulated", "gpu", "tpu" or a
      `placement.Placement`: where module k's variables and ops live.
    num_microbatches: M >= 1 microbatches per replica batch.
    distribute: a `tf.distribute.Strategy`; defaults to the current one.
    recompute, memory_lean: as for `InterlockTrainer`.
    options: a `TrainingOptions` holding these settings (the arguments
      above, when given, replace its fields); read back as
      `model.interlock_options`, never changed: `compile` gives its
      trainer a copy with `steps_per_execution` and `jit_compile`.
    **kwargs: `keras.Model` arguments (`name`).
  """

  def __init__(self, modules, strategy=None, *, variant=None, placement=None,
               num_microbatches=None, distribute=None, recompute=None,
               memory_lean=None, options=None, **kwargs):
    distribute = distribute or tf.distribute.get_strategy()
    # Keras's contract: a model created under a strategy's scope trains
    # with that strategy (`model.distribute_strategy`).
    with distribute.scope():
      super().__init__(**kwargs)
    modules = list(modules)
    if not modules:
      raise ValueError("InterlockModel needs at least one module. "
                       "Received: modules=[]")
    for k, module in enumerate(modules):
      first = next(i for i, other in enumerate(modules) if other is module)
      if first < k:
        # One layer's weights in two modules would be trained by two
        # modules' rules as if they were two layers.
        raise ValueError(
            f"InterlockModel needs K distinct modules: module {first + 1} "
            f"is given again as module {k + 1}. "
            f"Received: modules[{k}]={module.name!r}")
    self.interlock_modules = modules
    # Every setting in one frozen value (`training_options`), never
    # changed after this line.
    self.interlock_options = training_options.make(
        options, strategy=strategy, variant=variant,
        num_microbatches=num_microbatches, recompute=recompute,
        memory_lean=memory_lean)
    self._distribute = distribute
    self.placement = placement_lib.resolve(placement, len(modules),
                                           distribute, default=None)
    self.trainer = None
    self._slots_built = False
    self._input_dtype = None
    # Our own record of the built input shape (`get_build_config`).
    self._input_shape = None
    # The exit `predict_step` serves during one `predict` call.
    self._predict_exit = None
    self._fit_logs = keras_fit.FitLogs()
    self._predict_functions = {}
    # fit, evaluate and predict from two threads at once would share the
    # optimizers' counters and the trackers: the second thread is refused.
    self._call_guard = call_guard.CallGuard("InterlockModel")

  @property
  def num_modules(self):
    return len(self.interlock_modules)

  @property
  def strategy(self):
    """The `InterlockStrategy` this model trains with (its window n)."""
    return self.interlock_options.strategy

  @property
  def interlock_strategy(self):
    return self.interlock_options.strategy

  @property
  def num_microbatches(self):
    return self.interlock_options.num_microbatches

  def get_layer(self, name=None, index=None):
    """Keras's `get_layer`; a name not at the top level (the modules) is
    looked up in every module's body and aux head, so the name of a layer
    of the model given to `from_keras` finds it in its module (once
    built). The name of a nested model of that model gives a
    `keras_origins.NestedModel`: its layers in every module, whose
    `trainable` sets them all."""
    if name is None or index is not None or name in [
        layer.name for layer in self.layers]:
      return super().get_layer(name, index)
    nested = keras_origins.nested_model(self.interlock_modules, name)
    if nested is not None:
      return nested
    return keras_habits.find_layer(self.interlock_modules, name)

  def to_keras(self):
    """The model given to `from_keras`, holding this model's trained state.

    Every layer's weights, BatchNormalization statistics and `trainable`
    flags (at every depth, nested models included) are written into the
    Keras (or keras_hub) model that was split, so its own methods serve
    the trained network: `generate()`, `save()`, keras_hub's tooling. After
    `load_model` or a clone, the original object is gone: a new one is
    built from its config (saved with the modules) and returned.

    Returns:
      That `keras.Model`. Its predictions equal this model's `predict`.
    """
    if not self.built:
      raise ValueError("Build or fit the model before to_keras. "
                       "Received: built=False")
    return keras_origins.give_back(self.interlock_modules)

  @property
  def modules(self):
    """The K `InterlockModule`s in depth order; `modules[k].layer_names`
    lists the layers module k + 1 holds (e.g. where `from_keras` cut)."""
    return list(self.interlock_modules)

  def summary(self, line_length=None, positions=None, print_fn=None,
              **kwargs):
    """Prints one row per module: its first and last layer, its
    parameters, its aux head (and the head's parameters) and its device.

    Args:
      line_length, positions: accepted for Keras compatibility; unused.
      print_fn: called with each line; defaults to `print`.
      **kwargs: other `keras.Model.summary` arguments; unused.
    """
    del line_length, positions, kwargs
    for line in keras_summary.summary_lines(self):
      (print_fn or print)(line)

  def as_functional(self):
    """The built modules as one functional `keras.Model`, for drawing.

    `keras.utils.plot_model(model, ...)` draws a subclassed model such as
    this one as a single box; `keras.utils.plot_model(model.as_functional(),
    expand_nested=True)` draws each module's layers and each aux head
    (`exits.functional_graph`: the same layers, outputs per exit, no
    cuts; not for training).
    """
    if not self.built:
      raise ValueError("Build or fit the model before drawing it. "
                       "Received: built=False")
    return exits_lib.functional_graph(
        self.interlock_modules, self._input_shape,
        self._input_dtype or "float32", name=self.name)

  def _scope(self, k):
    if self.placement is None:
      return contextlib.nullcontext()
    return self.placement.scope(k)

  # -- building -------------------------------------------------------------

  def build(self, input_shape):
    """Creates module k's weights under module k's device scope."""
    # One input, or a nest of them (input_nest): a shape per input.
    h = input_nest.zeros(input_shape, self._input_dtype)
    with self._distribute.scope():
      exits_lib.build(self.interlock_modules, h, scope=self._scope)
    self._input_shape = input_nest.as_tuples(input_shape)
    self._build_trainer_slots(input_shape)

  def _build_trainer_slots(self, input_shape):
    """Builds the optimizers (and checks placement) once both exist."""
    if self.trainer is not None and not self._slots_built:
      self.trainer.build(input_nest.zeros(input_shape, self._input_dtype))
      self._slots_built = True

  def get_build_config(self):
    if not self.built:
      return None
    return {"input_shape": self._input_shape,
            "input_dtype": self._input_dtype or "float32"}

  def build_from_config(self, config):
    self._input_dtype = config.get("input_dtype")
    self.build(config["input_shape"])

  def _num_classes(self, x):
    """The size of the network's class axis: one example of `x` through
    the built network (before the first step, so labels can be checked)."""
    first = tf.nest.map_structure(lambda a: a[:1], x)
    return int(self(first, training=False).shape[-1])

  def _ensure_built(self, features):
    self._input_dtype = input_nest.dtype_of(features)
    shape = input_nest.shape_of(features)
    if not self.built:
      self.build(shape)
    else:
      self._build_trainer_slots(shape)

  def call(self, inputs, training=False):
    return self._forward(inputs, None, training)

  def _forward(self, inputs, exit_k, training=False):
    """Modules 1..k, then aux head k (k < K) or the network's own output."""
    return exits_lib.exit_logits(self.interlock_modules, inputs, exit_k,
                                 training=training, scope=self._scope)

  # -- compile and fit ------------------------------------------------------

  def compile(self, optimizer="adam", loss=None, metrics="auto",
              steps_per_execution=None, jit_compile=None,
              execution_options=None, weighted_metrics="auto", **kwargs):
    """Configures interlocking training.

    "auto" means what the keras_hub task that `from_keras` split picks in
    its own `compile` (`task_defaults`; saved with the model), and for
    any other model our default: so `compile("adam")` on a split
    `GPT2CausalLM` logs its weighted `sparse_categorical_accuracy`, as the
    task's own `compile("adam")` does, and on a plain model no metrics.

    Args:
      optimizer: one Keras optimizer (cloned per module: the argument itself
        is never updated), a name such as "adam", a list of K optimizers
        (each cloned onto its module's device), or a callable
        `k -> optimizer` (k = 0..K-1); "auto": the task's (e.g. `Adam(2e-5)`
        for a causal LM), else "adam". Module k's optimizer also trains its
        aux head.
      loss: a loss name, a `keras.losses.Loss` (any reduction: its
        per-example values are used) or a callable `(y_true, y_pred) ->
        per-example loss [batch]`; None or "auto": the task's (e.g.
        `SparseCategoricalCrossentropy(from_logits=True)`), else sparse
        softmax cross-entropy on logits. Every module's loss L_k applies it
        to its own logits.
      metrics: None, one metric or a list, as for Keras: names ("accuracy",
        "sparse_top_k_categorical_accuracy", ...), `keras.metrics.Metric`
        objects that average per-example values (e.g.
        `SparseTopKCategoricalAccuracy(k=2)`), or per-example callables;
        unweighted. "auto": the task's, else none. Every exit gets its own
        copy, logged "module_k/<name>"; the network's also as "<name>"
        (see `keras_metrics`).
      steps_per_execution: training steps unrolled into one `tf.function`
        call (`InterlockTrainer.train_loop`'s `steps_per_loop`); None: the
        model's options' (default 1).
      jit_compile: True, False or "auto": compile the training step with
        XLA (`InterlockTrainer`'s argument; "auto" as Keras: on where the
        modules run on a GPU or TPU, off on CPU; always on for
        placement="tpu"); None: the model's options' (default "auto"). The
        resolved value is `model.trainer.jit_compile`.
      execution_options: a `tf_interlock.ExecutionOptions` (how each call
        runs its steps, and `fit`'s tf.data autotuning); None: the model's
        options'. Saved with the compile config.
      weighted_metrics: the forms `metrics` takes, weighted by `fit`'s and
        `evaluate`'s `sample_weight` as Keras weighs them: sum(w * value) /
        sum(w) (per token for a padding mask); without weights, equal to
        the unweighted. Logged by name, or "weighted_<name>" when a metric
        before it has that name (Keras's rule). "auto": the task's (e.g.
        `[SparseCategoricalAccuracy()]` for a causal LM), else none.
      **kwargs: other `keras.Model.compile` arguments are not supported and
        raise.
    """
    if steps_per_execution is not None:
      fit_checks.check_steps_per_execution(steps_per_execution)
    # The trainer's settings: a new value from the model's, which stays
    # as it was (checked here, before anything is compiled).
    options = training_options.make(
        self.interlock_options, steps_per_loop=steps_per_execution,
        jit_compile=jit_compile, execution=execution_options)
    steps_per_execution = options.steps_per_loop
    fit_checks.check_steps_per_execution(steps_per_execution)
    if kwargs:
      raise ValueError(
          f"InterlockModel.compile takes optimizer, loss, metrics, "
          f"weighted_metrics, steps_per_execution, jit_compile and "
          f"execution_options only. Received: {sorted(kwargs)}")
    # Saved as given: "auto" resolves again when a saved model is loaded.
    compile_config = _compile_config(optimizer, loss, metrics,
                                     weighted_metrics, options)
    # A split keras_hub task trains and logs with its own compile's
    # defaults.
    optimizer, loss, metrics, weighted_metrics = task_defaults.resolve(
        self.interlock_modules, optimizer, loss, metrics, weighted_metrics)
    # The trainer's own forms, named as compile's arguments; a list's
    # optimizers are cloned onto their modules' devices too.
    factory = trainer_lib.optimizer_factory(
        optimizer, self.num_modules, name="optimizer", clone=True)
    loss_fn = sample_weights.weighted(losses_lib.per_example_loss(
        losses_lib.sparse_softmax_cross_entropy if loss is None else loss,
        name="loss"), loss)
    metric_fn, metric_names = keras_metrics.per_example_metrics(
        metrics, weighted_metrics)
    # Keras's own jit_compile stays False: training runs the trainer's
    # loop, which compiles with XLA itself (`jit_compile` below).
    super().compile(optimizer=None, loss=None, metrics=None,
                    steps_per_execution=steps_per_execution,
                    jit_compile=False, run_eagerly=False)
    self.trainer = trainer_lib.InterlockTrainer(
        self.interlock_modules, factory, loss_fn=loss_fn,
        metric_fn=metric_fn, distribute=self._distribute,
        placement=self.placement, options=options)
    # Named attributes: Keras saves (and BackupAndRestore restores) each
    # module's optimizer state with the model's weights.
    for k, opt in enumerate(self.trainer.optimizers, start=1):
      setattr(self, f"module_optimizer_{k}", opt)
    # What Keras's callbacks read and set: the learning rate of every
    # module's optimizer (or of the modules `model.optimizer.modules` names).
    self.optimizer = ModuleOptimizers(self.trainer)
    self._loss_fn, self._metric_fn = loss_fn, metric_fn
    self._sparse_labels = fit_checks.sparse_loss(loss)
    self._metric_names = metric_names
    self._make_eval_trackers(
        keras_metrics.as_list(metrics) + keras_metrics.as_list(
            weighted_metrics), metric_names)
    # Not tracked: a Keras metric object in it would become the model's
    # state (and a locked, built model refuses new state).
    object.__setattr__(self, "_interlock_compile_config", compile_config)
    self._slots_built = False
    if self.built:
      self._build_trainer_slots(self._input_shape)

  def _make_eval_trackers(self, metrics, metric_names):
    """Every exit's evaluation trackers, and which way each value improves
    (what Keras's callbacks read for their mode="auto"); `metrics`: the
    metrics, then the weighted ones, in `metric_names`'s order."""
    # Keras locks a built layer's state; compiling a built (or loaded)
    # model adds the evaluation trackers, which hold no weights to save.
    with keras_private.unlocked_tracker(self):
      self._eval_trackers = keras_fit.eval_trackers(
          self.interlock_modules, metric_names)
    # Not tracked (it holds the trackers above).
    object.__setattr__(self, "_monitor_directions",
                       keras_metrics.monitor_directions(
                           self._eval_trackers, metrics, metric_names))

  def get_compile_config(self):
    if self.trainer is None or self._interlock_compile_config is None:
      return {}
    return keras.saving.serialize_keras_object(
        self._interlock_compile_config)

  def compile_from_config(self, config):
    config = keras.saving.deserialize_keras_object(config)
    if "execution_options" in config:
      config["execution_options"] = execution_options_lib.ExecutionOptions(
          **config["execution_options"])
    self.compile(**config)

  @property
  def metrics(self):
    """Keras `Mean` trackers of every logged value (reset each epoch), and
    after `compile` one list of those that go up or down
    (`keras_metrics.monitor_directions`), which Keras's callbacks read."""
    directions = getattr(self, "_monitor_directions", None)
    return self._trackers() + ([] if directions is None else [directions])

  @property
  def metrics_names(self):
    """The names of the logged values, in `model.metrics` order."""
    return [m.name for m in self._trackers()]

  def _trackers(self):
    return (list(getattr(self, "_eval_trackers", [])) +
            list(self._fit_logs.extra.values()))

  def make_train_function(self, force=False):
    if self.train_function is None or force:
      self.train_function = self._fit_logs.train_function(
          self, getattr(self, "_metric_names", []))
    return self.train_function

  @call_guard.guarded
  def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto",
          callbacks=None, validation_split=0.0, validation_data=None,
          shuffle=True, class_weight=None, sample_weight=None,
          initial_epoch=0, steps_per_epoch=None, **kwargs):
    """`keras.Model.fit`, each call running `steps_per_execution` steps.

    x, y may be arrays (batches of `batch_size`, default 32; the last
    `len(x) % batch_size` examples of each shuffled epoch are skipped, as
    every step needs a full batch) or a `tf.data.Dataset` of
    `(features, labels)` with fixed-size batches (`drop_remainder=True`).
    An infinite dataset needs `steps_per_epoch`. `sample_weight` (one
    weight per example or per label position, e.g. a padding mask, with
    arrays; or a dataset of `(features, labels, weights)`) weights every
    module's losses as Keras does: L_k = sum(w * loss_k) / number of loss
    values (`sample_weights`); `compile`'s `weighted_metrics` are weighted
    as Keras weighs them, its `metrics` stay unweighted. `class_weight`
    raises (pass the class's weight per example as `sample_weight`). Other
    arguments are Keras's.

    Returns:
      The `History`: the per-epoch logs described in the module docstring.
    """
    if self.trainer is None:
      raise ValueError("Call compile() before fit(). Received: "
                       "compiled=False")
    fit_checks.check_fit(x, y, batch_size, kwargs, epochs=epochs,
                            initial_epoch=initial_epoch,
                            example_shape=self._example_shape())
    if self.distribute_strategy is not self._distribute:
      raise ValueError(
          f"InterlockModel trains with the tf.distribute strategy it was "
          f"created under (or given as distribute=); fit runs under "
          f"another. Create the model under the strategy's scope. Received: "
          f"strategy={type(self.distribute_strategy).__name__}")
    if class_weight is not None:
      raise ValueError(
          "InterlockModel.fit does not support class_weight; pass "
          "sample_weight=np.take(weights, y) (one weight per example) "
          f"instead. Received: class_weight={type(class_weight).__name__}")
    dataset, steps, keras_steps, validation_data = (
        keras_fit.training_dataset(
            x, y, batch_size, shuffle, steps_per_epoch, validation_split,
            validation_data, sample_weight=sample_weight,
            input_shape=(input_nest.first_shape(self._input_shape)
                         if self.built else None),
            autotune=self.trainer.options.execution.data_autotune))
    if self.built and self._slots_built:
      # Built: only the input dtype is needed, and a batch read here would
      # cost an iterator per call.
      self._input_dtype = tf.nest.map_structure(
          lambda spec: spec.dtype.name, dataset.element_spec[0])
    else:
      features, _ = next(iter(dataset))
      self._ensure_built(features)
    if getattr(self, "_sparse_labels", False):
      fit_checks.check_labels(y, lambda: self._num_classes(x))
    self._fit_logs.steps_per_epoch = steps
    callbacks = fit_checks.with_guard(
        keras_fit.with_callback(callbacks, self._fit_logs.callback))
    kwargs.setdefault("validation_batch_size", batch_size)
    with op_errors.cause_first("InterlockModel.fit"):
      return super().fit(dataset, epochs=epochs, verbose=verbose,
                         callbacks=callbacks, shuffle=False,
                         validation_data=validation_data,
                         initial_epoch=initial_epoch,
                         steps_per_epoch=keras_steps, **kwargs)

  @call_guard.guarded
  def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None,
                     return_dict=False):
    """One interlocking training step on one batch, as Keras's.

    Runs the step `fit` runs (every module's routed gradients and update)
    on `(x, y)`, after resetting the metrics, as Keras does. This is the
    way to write your own loop: a `tf.GradientTape` over `model(x)` cannot
    train the modules, because each module's input is cut with
    `stop_gradient` (the interlocking cut), so every module but the last
    gets None gradients.

    Args:
      x: one batch of inputs (its size is the step's batch).
      y: its labels.
      sample_weight: optional weight per example, as for `fit`.
      class_weight: not supported (raises), as for `fit`.
      return_dict: return the logs as a dict.

    Returns:
      With return_dict, the logs `fit` reports for one step ("loss",
      metrics, "module_k/..."); otherwise their values as a list in
      `model.metrics_names` order (one float when there is only the loss).
    """
    if self.trainer is None:
      raise ValueError("Call compile() before train_on_batch(). Received: "
                       "compiled=False")
    if class_weight is not None or y is None:
      raise ValueError(
          f"train_on_batch needs labels y and takes no class_weight (pass "
          f"sample_weight). Received: y={'None' if y is None else 'given'}, "
          f"class_weight={type(class_weight).__name__}")
    fit_checks.check_not_empty(x)
    labels = y if sample_weight is None else (
        y, tf.cast(sample_weight, tf.float32))
    dataset = tf.data.Dataset.from_tensors((x, labels))
    self._ensure_built(next(iter(dataset))[0])
    if getattr(self, "_sparse_labels", False):
      fit_checks.check_labels(y, lambda: self._num_classes(x))
    self.reset_metrics()
    # FitLogs runs exactly the steps an epoch has left: here, one.
    fit_logs = self._fit_logs
    saved = fit_logs.steps_per_epoch, fit_logs.steps_done
    fit_logs.steps_per_epoch, fit_logs.steps_done = 1, 0
    try:
      with op_errors.cause_first("InterlockModel.train_on_batch"):
        logs = self.make_train_function()(
            iter(self.trainer.distribute_dataset(dataset)))
    finally:
      fit_logs.steps_per_epoch, fit_logs.steps_done = saved
    logs = {key: float(value) for key, value in logs.items()}
    return logs if return_dict else keras_fit.logs_in_order(self, logs)

  @call_guard.guarded
  def evaluate(self, x=None, y=None, *args, **kwargs):
    """Every exit's loss and metrics, as Keras's `evaluate`.

    Arrays x and y must hold the same number of examples, and x's examples
    the shape the model takes (refused in one line, not Keras's cardinality
    error). Arguments and return value are Keras's.
    """
    fit_checks.check_lengths(x, y)
    fit_checks.check_example_shape(x, self._example_shape())
    with op_errors.cause_first("InterlockModel.evaluate"):
      return super().evaluate(x, y, *args, **kwargs)

  def _example_shape(self):
    """The shape of one example the model takes, or None if not known.

    Built: the shape it was built for. Before that, a `from_keras` model's
    first piece declares its source model's input (its InputLayer's
    `batch_shape`).
    """
    if self.built and self._input_shape is not None:
      if input_nest.is_shape_nest(self._input_shape):
        return None  # Several inputs: Keras checks each against its own.
      return tuple(self._input_shape[1:])
    config = getattr(self.interlock_modules[0].body, "model_config", None)
    if config and config.get("layers"):
      first = config["layers"][0]
      if first.get("class_name") == "InputLayer":
        return tuple(first["config"]["batch_shape"][1:])
    return None

  @call_guard.guarded
  def test_on_batch(self, x, y=None, sample_weight=None, return_dict=False):
    """Every exit's loss and metrics on one batch, as Keras's.

    Returns:
      As `evaluate` for this batch alone (metrics are reset first): a
      dict with return_dict, else a list in `model.metrics_names` order.
    """
    if self.trainer is None:
      raise ValueError("Call compile() before test_on_batch(). Received: "
                       "compiled=False")
    self._ensure_built(x)
    return super().test_on_batch(x, y, sample_weight=sample_weight,
                                 return_dict=return_dict)

  def test_step(self, data):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    if sample_weight is not None:
      y = (y, sample_weight)
    values = evaluation.exit_values(self.interlock_modules, x, y,
                                    self._loss_fn, self._metric_fn,
                                    scope=self._scope)
    return keras_fit.update_eval_trackers(self._eval_trackers, values,
                                          self._metric_names)

  def predict_step(self, data):
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    return self._forward(x, self._predict_exit, training=False)

  @call_guard.guarded
  def predict(self, x, batch_size=None, verbose="auto", steps=None,
              callbacks=None, exit=None):  # pylint: disable=redefined-builtin
    """`keras.Model.predict` of the network, or of early exit `exit` = k.

    Args:
      x, batch_size, verbose, steps, callbacks: as for Keras.
      exit: None or K for the network's output; k < K for modules 1..k then
        aux head k.

    Returns:
      Numpy logits.
    """
    exit = keras_fit.check_exit(self.interlock_modules, exit)
    fit_checks.check_python_rows(x)
    fit_checks.check_example_shape(x, self._example_shape())
    if not self.built and hasattr(x, "shape"):
      # Built eagerly with x's dtype, as fit builds, not inside the traced
      # predict function with float32 zeros (a StringLookup takes strings).
      self._ensure_built(x[:1])
    self._predict_exit = exit
    self.predict_function = self._predict_functions.get(exit)
    try:
      with op_errors.cause_first("InterlockModel.predict"):
        out = super().predict(x, batch_size=batch_size, verbose=verbose,
                              steps=steps, callbacks=callbacks)
    finally:
      self._predict_functions[exit] = self.predict_function
      self._predict_exit = None
    return out

  def export_saved_model(self, export_dir):
    """Writes the device-free SavedModel with one signature per exit.

    Args:
      export_dir: the folder to write (local path or URL), missing or
        empty (`tf_interlock.export.export_saved_model`).

    Returns:
      The export's path.
    """
    if not self.built:
      raise ValueError("Build or fit the model before exporting it. "
                       "Received: built=False")
    spec = input_nest.specs(self._input_shape, self._input_dtype)
    return export_lib.export_saved_model(self.interlock_modules, spec,
                                         export_dir)

  def export(self, filepath, format="tf_saved_model", verbose=None,  # pylint: disable=redefined-builtin
             input_signature=None, **kwargs):
    """Keras's `model.export`: writes `export_saved_model(filepath)`.

    The SavedModel serves `serving_default` (the network) and `exit_k`
    (each early exit), each `{"logits": ...}` from `{"inputs": ...}`.
    Other formats, an `input_signature` or other arguments are refused in
    one line that names `export_saved_model`.

    Returns:
      The export's path.
    """
    keras_habits.check_export(format, input_signature, kwargs)
    path = self.export_saved_model(filepath)
    if verbose or verbose is None:
      print(f"Saved artifact at {path!r}: signatures 'serving_default' and "
            f"'exit_k', inputs 'inputs', output 'logits'.")
    return path

  def get_config(self):
    config = super().get_config()
    config.update(
        modules=[keras.saving.serialize_keras_object(m)
                 for m in self.interlock_modules],
        strategy=self.interlock_strategy.name,
        placement=None if self.placement is None else self.placement.kind,
        num_microbatches=self.num_microbatches)
    if self.interlock_options.recompute is not False:
      config["recompute"] = self.interlock_options.recompute
    if self.interlock_options.memory_lean:
      config["memory_lean"] = True
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    distribute = tf.distribute.get_strategy()
    placement = config.pop("placement")
    if placement is not None:
      placement = placement_lib.make_placement(
          placement, len(config["modules"]), distribute)
    modules = []
    # Keras builds a deserialized layer right away from its saved build
    # config: deserialize module k under module k's device scope.
    for k, module in enumerate(config.pop("modules")):
      with (contextlib.nullcontext() if placement is None
            else placement.scope(k)):
        modules.append(keras.saving.deserialize_keras_object(module))
    return cls(modules, placement=placement, distribute=distribute, **config)


def _compile_config(optimizer, loss, metrics, weighted_metrics, options):
  """What `get_compile_config` saves of a `compile` call (its arguments,
  the trainer's `jit_compile` and a non-default execution), or None when
  an argument cannot be saved (`keras_fit.compile_config`)."""
  config = keras_fit.compile_config(optimizer, loss, metrics,
                                    weighted_metrics, options.steps_per_loop)
  if config is not None:
    config["jit_compile"] = options.jit_compile
    if options.execution != execution_options_lib.ExecutionOptions():
      config["execution_options"] = dataclasses.asdict(options.execution)
  return config
