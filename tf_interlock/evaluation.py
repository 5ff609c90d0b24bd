"""The one evaluator of an interlocking network's exits.

Each aux head A_k of an interlocking network (Gomez et al., 2022,
arXiv:2010.04116) is a classifier in its own right, an early exit after
module k; module K's exit is the network's own output. `exit_values` runs
every exit on one batch and gives its per-example loss and metric; Keras's
evaluation (`InterlockModel.evaluate`, fit's "val_*") averages them with
its Mean trackers, and the two functions here sum them over a finite
dataset, in-memory or from an export:

    {"module_1": {...}, ..., "module_K": {...}}

named as every per-module number is (`metric_names`), each with "loss",
"num_examples", and "accuracy" (classification) or "perplexity" =
exp(mean token loss) (language modelling). Sums are kept in Python floats
(float64), so a long evaluation does not lose precision the way a float32
running mean would.
"""

import math

import tensorflow as tf

from tf_interlock import exits as exits_lib
from tf_interlock import export
from tf_interlock import losses as losses_lib
from tf_interlock import metric_names

TASKS = ("classification", "lm")


def _check_task(task):
  if task not in TASKS:
    raise ValueError(f"task must be one of {TASKS}. Received: task={task!r}")


def _check_finite(dataset):
  if (isinstance(dataset, tf.data.Dataset) and
      dataset.cardinality() == tf.data.INFINITE_CARDINALITY):
    raise ValueError(
        "Evaluation makes one pass over the dataset, which must be finite "
        "(drop the .repeat()). Received: dataset.cardinality()=infinite")


class InputMismatch(ValueError):
  """The dataset's features do not fit the export's serving signature."""

  def __init__(self, expected, received):
    self.expected, self.received = expected, received
    super().__init__(
        f"the export takes features of shape {describe_spec(expected)} "
        f"but the dataset gives {describe_spec(received)}")


def describe_spec(spec):
  """E.g. "(None, 32) float32"."""
  shape = spec.shape
  dims = "(unknown rank)" if shape.rank is None else str(tuple(
      shape.as_list()))
  return f"{dims} {spec.dtype.name}"


def check_inputs(dataset, spec):
  """Raises InputMismatch unless `dataset`'s features fit `spec`.

  The features are cast to the signature's dtype, so a float is taken for
  a float and an int for an int; the shape must match but for the batch.

  Args:
    dataset: a `tf.data.Dataset` of (features, labels); anything else (an
      iterable) is not checked.
    spec: the `tf.TensorSpec` of the serving signature's input.
  """
  if not isinstance(dataset, tf.data.Dataset):
    return
  element = dataset.element_spec
  features = element[0] if isinstance(element, tuple) else element
  if not isinstance(features, tf.TensorSpec):
    return
  shape = features.shape
  if shape.rank is not None and shape.rank > 0:
    shape = tf.TensorShape([None]).concatenate(shape[1:])  # any batch
  if (not shape.is_compatible_with(spec.shape) or
      features.dtype.is_integer != spec.dtype.is_integer):
    raise InputMismatch(spec, features)


def exit_values(modules, features, labels, loss_fn, metric_fn=None, *,
                scope=None):
  """Every exit's per-example loss (and metric) on one batch.

  One forward pass (training=False) serves all exits: exit k's head reads
  module k's output on the way to the network's output.

  Args:
    modules: the K built `InterlockModule`s, in depth order.
    features, labels: one batch.
    loss_fn: `loss_fn(labels, logits) -> per-example loss [batch]`.
    metric_fn: `metric_fn(labels, logits) -> per-example score [batch]`,
      or None.
    scope: None, or `index -> context manager` (as `exits.exits`).

  Returns:
    {"module_k": {"loss": [batch], "metric": [batch] (with a metric_fn)}}
    for every exit, in depth order.
  """
  values = {}
  for found in exits_lib.exits(modules, features, training=False,
                               scope=scope):
    if found.logits is not None:
      values[metric_names.module_name(found.index)] = _per_example(
          labels, found.logits, loss_fn, metric_fn)
  return values


def _per_example(labels, logits, loss_fn, metric_fn):
  values = {"loss": loss_fn(labels, logits)}
  if metric_fn is not None:
    values["metric"] = metric_fn(labels, logits)
  return values


def _batch_sums(values):
  """Sums over one batch of the per-example loss and metric, and its size."""
  sums = {"loss": tf.reduce_sum(values["loss"]),
          "num_examples": tf.size(values["loss"])}
  if "metric" in values:
    sums["metric"] = tf.reduce_sum(values["metric"])
  return sums


class _Totals:
  """Running per-head sums, turned into means at the end of the pass."""

  def __init__(self):
    self.sums = {}

  def add(self, head, batch_sums):
    totals = self.sums.setdefault(head, {})
    for key, value in batch_sums.items():
      totals[key] = totals.get(key, 0) + value.numpy().item()

  def results(self, task):
    """Per-head means, in depth order."""
    # Every head sees every example, so any head's count is the count.
    count = next(iter(self.sums.values()))["num_examples"] if self.sums else 0
    if not count:
      raise ValueError(f"The dataset has no examples to evaluate. Received: "
                       f"num_examples={count}")
    results = {}
    for head in sorted(self.sums, key=metric_names.head_index):
      totals = self.sums[head]
      loss = totals["loss"] / count
      results[head] = {"loss": loss, "num_examples": count}
      if "metric" in totals:
        results[head][metric_names.DEFAULT_METRIC] = totals["metric"] / count
      if task == "lm":
        results[head]["perplexity"] = math.exp(loss)
    return results


def _batch_sums_function(modules, loss_fn, metric_fn):
  """The traced evaluation step of these modules, made once and kept.

  A new tf.function per call would trace again at every evaluation, and
  from the fifth TF warns of "triggered tf.function retracing". It is kept
  on the first module (outside Keras's attribute tracking); its key holds
  ids of objects its closure keeps alive, so no other object can take them.
  reduce_retracing: a smaller last batch gives a batch-polymorphic trace
  instead of a second one.
  """
  cache = modules[0].__dict__.setdefault("_interlock_eval_functions", {})
  key = (tuple(id(m) for m in modules), id(loss_fn), id(metric_fn))
  if key not in cache:

    @tf.function(reduce_retracing=True)
    def batch_sums(features, labels):
      return {head: _batch_sums(values)
              for head, values in exit_values(modules, features, labels,
                                              loss_fn, metric_fn).items()}

    cache[key] = batch_sums
  return cache[key]


def evaluate_modules(modules, dataset,
                     loss_fn=losses_lib.sparse_softmax_cross_entropy,
                     metric_fn=losses_lib.sparse_accuracy, *,
                     task="classification"):
  """Evaluates in-memory modules: the final logits and every early exit.

  One forward pass per batch serves every exit (`exit_values`).

  Args:
    modules: the K built `InterlockModule`s, in depth order.
    dataset: a finite `tf.data.Dataset` (or iterable) of
      `(features, labels)` batches.
    loss_fn: `loss_fn(labels, logits) -> per-example loss [batch]`.
    metric_fn: `metric_fn(labels, logits) -> per-example score [batch]`,
      reported as "accuracy"; None leaves it out (as `evaluate_saved_model`
      does for task="lm").
    task: "classification", or "lm" to also report "perplexity" =
      exp(loss); the loss must then be each sequence's mean token loss and
      the sequences of equal length, so that its mean is the token mean.

  Returns:
    {"module_k": metrics} for every exit k, in depth order: each with "loss",
    "num_examples" and "accuracy" and/or "perplexity", as Python numbers.
  """
  _check_task(task)
  _check_finite(dataset)
  modules = list(modules)

  batch_sums = _batch_sums_function(modules, loss_fn, metric_fn)
  totals = _Totals()
  for features, labels in dataset:
    for head, sums in batch_sums(features, labels).items():
      totals.add(head, sums)
  return totals.results(task)


def evaluate_saved_model(export_dir, dataset, *, task="classification"):
  """Evaluates every signature of an `export.export_saved_model` export.

  Args:
    export_dir: the export's directory.
    dataset: a finite `tf.data.Dataset` (or iterable) of
      `(features, labels)` batches; features are cast to the signatures'
      input dtype (e.g. int64 token ids to int32).
    task: "classification" (loss and top-1 "accuracy") or "lm" (loss, the
      mean next-token cross-entropy, and "perplexity").

  Returns:
    {"module_k": metrics} for every exit k, as `evaluate_modules`.

  Raises:
    InputMismatch: the dataset's features do not fit the export's input
      (another data set, image size or sequence length).
  """
  _check_task(task)
  _check_finite(dataset)
  try:
    loaded = export.load_exported(export_dir)
  except AssertionError as e:  # TF's check that every object got a value
    raise ValueError(
        f"the export at {export_dir} does not load: its variables/ do not "
        f"match its saved_model.pb (files copied from another export?) "
        f"({str(e).splitlines()[0][:200]}); export the run again with "
        f"python -m train.export. Received: export_dir={export_dir!r}"
    ) from None
  heads = export.signature_heads(loaded)
  metric_fn = losses_lib.sparse_accuracy if task == "classification" else None

  @tf.function(reduce_retracing=True)
  def batch_sums(labels, logits):
    return _batch_sums(_per_example(
        labels, logits, losses_lib.sparse_softmax_cross_entropy, metric_fn))

  # Every signature has the same single input (see `export._signatures`).
  serving = loaded.signatures[export.SERVING_KEY]
  [(arg_name, spec)] = serving.structured_input_signature[1].items()
  check_inputs(dataset, spec)

  totals = _Totals()
  for features, labels in dataset:
    inputs = {arg_name: tf.cast(features, spec.dtype)}
    for head, signature in heads.items():
      logits = loaded.signatures[signature](**inputs)["logits"]
      totals.add(head, batch_sums(labels, logits))
  return totals.results(task)

