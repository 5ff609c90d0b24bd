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

`weighted_metrics=` are weighted by `fit`'s and `evaluate`'s sample
weights as Keras weighs them: over an epoch, sum(w * value) / sum(w), per
token for a weight per token (a padding mask). That is a ratio of two
sums, not a mean of per-example values, so each exit's step gives both:
"module_k/<name>" (the numerator) and "module_k/<name>" + `WEIGHTS` (the
weights), which `split_weights` pairs again before the logs are written.
"""

import keras
import tensorflow as tf

from tf_interlock import keras_private
from tf_interlock import losses as losses_lib
from tf_interlock.keras import sample_weights

# Names Keras resolves to an accuracy; logged as "accuracy", as before.
_SPARSE_ACCURACY = ("accuracy", "acc", "sparse_categorical_accuracy")

# The key of a weighted metric's sum of weights: its own key plus this.
WEIGHTS = "/sum_of_weights"


def as_list(metrics):
  """`compile`'s `metrics=` (None, one metric or a list) as a list."""
  if metrics is None:
    return []
  return list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]


def _categorical_accuracy(labels, logits):
  return tf.cast(tf.equal(tf.argmax(labels, -1), tf.argmax(logits, -1)),
                 tf.float32)


def _one(metric, argument):
  """(name, per-example function) of one entry of `metrics=` or
  `weighted_metrics=` (`argument`, for messages)."""
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
      raise ValueError(
          f"Unknown metric name. Received: {argument}={metric!r}")
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
          f"{argument}={metric!r}")
    return metric.name, lambda y, p: fn(y, p, **kwargs)
  if callable(metric):
    return getattr(metric, "__name__", "metric"), metric
  raise ValueError(
      f"{argument} must be names, keras.metrics.Metric objects or "
      f"per-example callables (y_true, y_pred) -> [batch]. Received: "
      f"{argument}={metric!r}")


def weighted_names(names, weighted):
  """The names Keras 3.15 logs weighted metrics under.

  As `CompileMetrics.result`: a weighted metric keeps its name unless a
  metric before it has that name; then it is "weighted_<name>" (and
  "weighted_<name>_1", ... for more of them).

  Args:
    names: the unweighted metrics' names.
    weighted: the weighted metrics' own names, in order.

  Returns:
    The weighted metrics' logged names.
  """
  counters = dict.fromkeys(names, 1)
  logged = []
  for name in weighted:
    if name not in counters:
      counters[name] = 1
    else:
      name = f"weighted_{name}"
      if name not in counters:
        counters[name] = 1
      else:
        counters[name] += 1
        name = f"{name}_{counters[name] - 1}"
    logged.append(name)
  return logged


def _weighted(values, weights, name):
  """One batch of a weighted metric, per example: (numerator, weights).

  Keras's `Mean` with sample weights (`reduce_to_samplewise_values`): a
  trailing axis of size 1 is squeezed or added to match ranks, values
  with more axes than the weights are first averaged over the extra ones
  (a weight per example weighs the example's mean), then the weights are
  broadcast to the values. Returns mean(w * value) and mean(w) over each
  example's positions, [batch] each: their sums over an epoch have the
  ratio Keras reports, sum(w * value) / sum(w). Without weights, w = 1.
  """
  values = tf.cast(values, tf.float32)
  if weights is None:
    mean = losses_lib.mean_over_non_batch_axes(values)
    return mean, tf.ones_like(mean)
  weights = tf.cast(weights, tf.float32)
  v_rank, w_rank = values.shape.rank, weights.shape.rank
  if v_rank is not None and w_rank is not None:
    if v_rank == w_rank + 1 and values.shape[-1] == 1:
      if w_rank == 1:
        weights = weights[:, None]
      else:
        values = tf.squeeze(values, -1)
    elif w_rank == v_rank + 1 and weights.shape[-1] == 1:
      if v_rank == 1:
        values = values[:, None]
      else:
        weights = tf.squeeze(weights, -1)
    v_rank, w_rank = values.shape.rank, weights.shape.rank
    if v_rank > w_rank:
      values = tf.reduce_mean(values, axis=list(range(w_rank, v_rank)))
    if not sample_weights.broadcasts(weights.shape, values.shape):
      raise ValueError(
          f"sample_weight of shape "
          f"{sample_weights.example_shape(weights.shape)} cannot weigh the "
          f"weighted metric {name!r}, whose values have shape "
          f"{sample_weights.example_shape(values.shape)}: pass one weight "
          f"per example (batch,) or one per label position. Received: "
          f"sample_weight.shape="
          f"{sample_weights.example_shape(weights.shape)}")
  weights = tf.broadcast_to(weights, tf.shape(values))
  return (losses_lib.mean_over_non_batch_axes(values * weights),
          losses_lib.mean_over_non_batch_axes(weights))


def _unique(names, argument):
  """`names`, unless one is there twice: an exit logs each metric as
  module_k/<name>, so two of one name would share one log."""
  if len(set(names)) != len(names):
    raise ValueError(f"Each metric needs its own name (an exit logs each as "
                     f"module_k/<name>). Received: {argument} names={names}")
  return names


def per_example_metrics(metrics, weighted_metrics=None):
  """`compile`'s metrics as one function returning every metric by name.

  Args:
    metrics: None, one metric, or a list of metrics (names, Keras metric
      objects, per-example callables); unweighted, as Keras's `metrics=`.
    weighted_metrics: the same forms, weighted by the sample weights as
      Keras's `weighted_metrics=`.

  Returns:
    `(metric_fn, names)`: `metric_fn(labels, logits) -> {name: [batch]}`
    (None without metrics), where labels are `y` or `(y, sample_weight)`,
    and the names in order (the weighted ones as Keras logs them,
    `weighted_names`). A weighted metric's key holds its numerator, and
    the key plus `WEIGHTS` its weights (`_weighted`).
  """
  plain = [_one(m, "metrics") for m in as_list(metrics)]
  names = _unique([name for name, _ in plain], "metrics")
  # A weighted metric given by name is logged by that name, as Keras logs
  # it ("sparse_categorical_accuracy"; `metrics=` keeps logging its
  # accuracies as "accuracy").
  weighted = [(m if isinstance(m, str) else name, fn) for m, (name, fn) in (
      (m, _one(m, "weighted_metrics")) for m in as_list(weighted_metrics))]
  # Keras weighs the values before any mean over positions: a metric's
  # per-position values where it has them (`sparse_accuracy.per_position`).
  weighted = [(name, getattr(fn, "per_position", fn))
              for name, (_, fn) in zip(
                  weighted_names(names, [n for n, _ in weighted]), weighted)]
  names = _unique(names + [name for name, _ in weighted], "weighted_metrics")
  if not names:
    return None, []

  def metric_fn(labels, logits):
    y, weights = labels if isinstance(labels, tuple) else (labels, None)
    values = {name: losses_lib.mean_over_non_batch_axes(
        tf.cast(fn(y, logits), tf.float32)) for name, fn in plain}
    for name, fn in weighted:
      values[name], values[name + WEIGHTS] = _weighted(
          fn(y, logits), weights, name)
    return values
  return metric_fn, names


def split_weights(values):
  """`values` without the weighted metrics' weights, and those weights.

  Args:
    values: {key: value} with, for each weighted metric, its numerator
      under its key and its weights under the key plus `WEIGHTS` (a
      step's means, or one batch's per-example values).

  Returns:
    `(values, weights)`: `values` without the `WEIGHTS` keys, and {key:
    weights} of the weighted metrics' keys. A tracker given
    `numerator / weights` with `sample_weight=weights` (times the steps
    counted) holds Keras's weighted mean.
  """
  weights = {key[:-len(WEIGHTS)]: value for key, value in values.items()
             if key.endswith(WEIGHTS)}
  return ({key: value for key, value in values.items()
           if not key.endswith(WEIGHTS)}, weights)


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
    metrics: `compile`'s metrics, then its weighted metrics, as one list.
    names: the names `per_example_metrics` gave them (the same order).

  Returns:
    A metric for `model.metrics` (`keras_private.monitorable`).
  """
  ways = {"loss": "down"}
  ways.update({name: direction(m) for name, m in zip(names, as_list(metrics))})
  directed = []
  for tracker in trackers:
    name = tracker.name.rsplit("/", 1)[-1]
    if ways.get(name) is not None:
      directed.append((tracker, ways[name]))
  return keras_private.monitorable(directed)
