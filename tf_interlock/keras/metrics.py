"""`InterlockModel.compile(metrics=...)`: Keras metrics, one copy per exit.

Keras takes a list of metrics, each a name ("accuracy"), a function
`(y_true, y_pred) -> per-example values` or a `keras.metrics.Metric` object.
Interlocking training (Gomez et al., 2022, arXiv:2010.04116) evaluates every
module's exit, so every metric is reported once per exit, as
"module_k/<name>" (and, for the network, module K, also as "<name>").

A stateful Metric object cannot be shared by the K modules: its variables
would be one more thing every module's step writes, which would serialize
steps the trainer runs in parallel. Instead each metric becomes its
per-example function, and each exit's values go into their own Keras `Mean`
tracker (made per name by `keras_fit`): the same numbers as a Keras metric
that averages over examples. That covers every `MeanMetricWrapper` (the
accuracies, top-k accuracies, and the losses as metrics); a metric that is
not a mean of per-example values (AUC, Precision, ...) is refused.
"""

import keras
import tensorflow as tf

from tf_interlock import keras_private
from tf_interlock import losses as losses_lib

# Names Keras resolves to an accuracy; logged as "accuracy", as before.
_SPARSE_ACCURACY = ("accuracy", "acc", "sparse_categorical_accuracy")


def _categorical_accuracy(labels, logits):
  return tf.cast(tf.equal(tf.argmax(labels, -1), tf.argmax(logits, -1)),
                 tf.float32)


def _one(metric):
  """(name, per-example function) of one entry of `metrics=`."""
  if isinstance(metric, str):
    if metric in _SPARSE_ACCURACY:
      return "accuracy", losses_lib.sparse_accuracy
    if metric == "categorical_accuracy":
      return "accuracy", _categorical_accuracy
    try:
      found = keras.metrics.get(metric)
    except ValueError:
      found = None
    if found is None:
      raise ValueError(f"Unknown metric name. Received: metrics={metric!r}")
    if isinstance(found, type):
      found = found()
    if not isinstance(found, keras.metrics.Metric):
      return metric, found
    metric = found
  if isinstance(metric, keras.metrics.Metric):
    # A MeanMetricWrapper keeps its per-example function and its arguments
    # (e.g. k of a top-k accuracy).
    fn, kwargs = keras_private.metric_function(metric)
    if fn is None:
      raise ValueError(
          f"InterlockModel reports each metric per exit as a mean of "
          f"per-example values; {type(metric).__name__} is not one (use a "
          f"MeanMetricWrapper metric such as SparseTopKCategoricalAccuracy, "
          f"a name, or a per-example callable). Received: "
          f"metrics={metric!r}")
    return metric.name, lambda y, p: fn(y, p, **kwargs)
  if callable(metric):
    return getattr(metric, "__name__", "metric"), metric
  raise ValueError(
      f"metrics must be names, keras.metrics.Metric objects or per-example "
      f"callables (y_true, y_pred) -> [batch]. Received: metrics={metric!r}")


def per_example_metrics(metrics):
  """`compile`'s metrics as one function returning every metric by name.

  Args:
    metrics: None, one metric, or a list of metrics (names, Keras metric
      objects, per-example callables).

  Returns:
    `(metric_fn, names)`: `metric_fn(labels, logits) -> {name: [batch]}`
    (None without metrics) and the names in order.
  """
  if metrics is None:
    return None, []
  items = list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
  named = [_one(m) for m in items]
  names = [name for name, _ in named]
  if len(set(names)) != len(names):
    raise ValueError(f"Each metric needs its own name (an exit logs each as "
                     f"module_k/<name>). Received: metrics names={names}")
  if not named:
    return None, []

  def metric_fn(labels, logits):
    return {name: losses_lib.mean_over_non_batch_axes(
        tf.cast(fn(labels, logits), tf.float32)) for name, fn in named}
  return metric_fn, names


def direction(metric):
  """"up", "down" or None: which way one entry of `metrics=` improves.

  As Keras's own metric objects say (`keras_private.metric_direction`):
  the accuracies go up. A per-example function has none, as in Keras.
  """
  if isinstance(metric, str):
    if metric in _SPARSE_ACCURACY + ("categorical_accuracy",):
      return "up"
    try:
      metric = keras.metrics.get(metric)
    except ValueError:
      return None
    if isinstance(metric, type):
      metric = metric()
  if isinstance(metric, keras.metrics.Metric):
    return keras_private.metric_direction(metric)
  return None


def monitor_directions(trackers, metrics, names):
  """Keras's callbacks' view of which way each logged value improves.

  With it, `EarlyStopping(monitor="val_accuracy")` or
  `ModelCheckpoint(monitor="val_module_2/accuracy")` need no `mode=`: every
  loss ("loss", "module_k/loss") goes down and every metric goes the way
  its Keras object says, at every exit.

  Args:
    trackers: the evaluation's `Mean` trackers ("loss", metrics,
      "module_k/<name>").
    metrics: `compile`'s `metrics=` argument.
    names: the names `per_example_metrics` gave them.

  Returns:
    A metric for `model.metrics` (`keras_private.monitorable`).
  """
  items = [] if metrics is None else (
      list(metrics) if isinstance(metrics, (list, tuple)) else [metrics])
  ways = {"loss": "down"}
  ways.update({name: direction(m) for name, m in zip(names, items)})
  directed = []
  for tracker in trackers:
    name = tracker.name.rsplit("/", 1)[-1]
    if ways.get(name) is not None:
      directed.append((tracker, ways[name]))
  return keras_private.monitorable(directed)
