"""The one place our packages touch Keras's private names.

Keras 3 documents a public contract (`train_step`, `predict_step`,
callbacks, `get_build_config`/`build_from_config`, `compile_from_config`,
...). `InterlockModel` and `keras_split` use it wherever it serves. The jobs
below have no public hook in the Keras versions listed in
`CHECKED_KERAS_VERSIONS`, so each goes through one small function here,
whose docstring names the private attribute it reads and why. A Keras
release that renames one of them breaks this file alone, and
tests/test_keras_private.py fails first, naming the installed Keras and the
versions this file was checked on. tests/test_keras_private.py also checks
that no other file of tf_interlock/ or layers/ reads these names.
"""

import contextlib
import io

import keras

# The Keras versions whose private names below were read in the source and
# exercised by tests/test_keras_private.py.
CHECKED_KERAS_VERSIONS = ("3.15.1",)


@contextlib.contextmanager
def unlocked_tracker(layer):
  """Lets a built layer take new tracked attributes inside the block.

  Touches `layer._tracker` (`locked`, `unlock()`, `lock()`). Keras locks a
  built layer's state so that no weights appear after `build`; compiling a
  built or loaded `InterlockModel` adds evaluation trackers (weight-free
  `Mean` metrics). Keras has no public way to add state to a built layer.
  The lock is restored as it was.
  """
  tracker = getattr(layer, "_tracker", None)
  locked = tracker is not None and tracker.locked
  if locked:
    tracker.unlock()
  try:
    yield
  finally:
    if locked:
      tracker.lock()


def skip_optimizer_init(optimizer):
  """Lets an optimizer subclass that skips `super().__init__` set attributes.

  Touches `BaseOptimizer._lock`: Keras's `__setattr__` refuses any
  attribute until the base `__init__` has set it. `ModuleOptimizers` holds
  no variables of its own and must not run that `__init__` (it would make a
  step counter and a learning rate that nothing updates); Keras has no
  public way to make such a handle.
  """
  optimizer._lock = False  # pylint: disable=protected-access


def flatten_layers(model):
  """Every layer inside `model`, nested ones included (not `model`).

  Touches `model._flatten_layers`. The public `model.layers` lists the top
  level only; a custom layer's sublayers (e.g. a wrapper's inner layer,
  whose class deserialization must find) are reachable only this way.
  """
  return list(model._flatten_layers(include_self=False))  # pylint: disable=protected-access


def functional_graph(model):
  """The `Functional` holding a model's layer graph, or None.

  Touches `Sequential._functional` and `Functional._nodes`. A Sequential
  built from `keras.Input` keeps its graph in a private functional model;
  the public API has no accessor for it. Returns None for a subclassed
  model (no graph) or an unbuilt Sequential.
  """
  graph = (getattr(model, "_functional", None)
           if isinstance(model, keras.Sequential) else model)
  return graph if hasattr(graph, "_nodes") else None


def inbound_nodes(layer):
  """The layer's call nodes, in call order (`layer._inbound_nodes`).

  Each node's public `input_tensors`/`output_tensors` give the shapes of
  that call. Keras 3 exposes no public list of a layer's calls.
  """
  return list(layer._inbound_nodes)  # pylint: disable=protected-access


def node_in_graph(graph, layer, index):
  """Whether call `index` of `layer` is a node of `graph`.

  Touches `Functional._nodes`, the set of node keys the graph owns, keyed
  f"{id(layer)}_ib-{index}" as Keras makes them. A layer shared between
  models has nodes in each; only this check tells them apart.
  """
  return f"{id(layer)}_ib-{index}" in graph._nodes  # pylint: disable=protected-access


def keras_history(tensor):
  """(operation, node index, tensor index) that produced a KerasTensor.

  Touches `KerasTensor._keras_history`. `keras.KerasTensor` exposes shape,
  dtype and name only; the producing layer is needed to find a cut
  tensor's entry in the model's config.
  """
  operation, node_index, tensor_index = tensor._keras_history  # pylint: disable=protected-access
  return operation, node_index, tensor_index


def can_run_through_graph(graph):
  """Whether `run_through_graph` can walk `graph` (a `Functional`)."""
  return hasattr(graph, "_run_through_graph")


def run_through_graph(graph, inputs, operation_fn):
  """Runs a functional graph calling `operation_fn(op)` for each layer.

  Touches `Functional._run_through_graph`. It is how `Functional.call`
  runs; the public `model(x)` gives no way to wrap each layer's call,
  which `no_gradient` needs to ask the tape about each layer on its own.
  """
  return graph._run_through_graph(  # pylint: disable=protected-access
      inputs, operation_fn=operation_fn)


def metric_function(metric):
  """(fn, kwargs) of a `MeanMetricWrapper`, or (None, {}) for others.

  Touches `MeanMetricWrapper._fn` and `._fn_kwargs`: the per-example
  function and its arguments (e.g. k of a top-k accuracy). The public
  `get_config()` holds them serialized only, and a lambda does not
  serialize.
  """
  fn = getattr(metric, "_fn", None)
  kwargs = dict(getattr(metric, "_fn_kwargs", {}) or {}) if fn else {}
  return fn, kwargs


def save_layer_state(layer):
  """Everything `model.save` would write of `layer`, held in memory.

  Touches `keras.src.saving.saving_lib`: `_save_state` with an in-memory
  `H5IOStore`, and `_save_assets_to_dict`. Keras's saving walk is the only
  one that calls each nested layer's own `save_own_variables` and
  `save_assets` hooks: an adapted `Normalization` keeps its statistics in
  variables whose load hook recomputes the tensors `call` uses
  (`finalize_state`), and a `StringLookup`'s adapted vocabulary lives in a
  lookup table, not a variable, which only `save_assets` writes. The public
  `save_weights`/`load_weights` take a file path and a whole model; a
  `from_keras` piece holds one layer of the user's model.

  Returns:
    (weights, assets): the bytes of an H5 weights file, and Keras's nested
    dict of asset files (None without assets).
  """
  from keras.src.saving import saving_lib  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  buffer = io.BytesIO()
  store = saving_lib.H5IOStore(buffer, mode="w")
  try:
    saving_lib._save_state(  # pylint: disable=protected-access
        layer, weights_store=store, assets_store=None, inner_path="",
        visited_saveables=set())
  finally:
    store.close()
  assets = None
  if any(hasattr(inner, "save_assets")
         for inner in [layer] + flatten_layers(layer)):
    assets = saving_lib._save_assets_to_dict(layer)  # pylint: disable=protected-access
  return buffer.getvalue(), assets


def load_layer_state(layer, state):
  """Loads `save_layer_state`'s result into a layer of the same config.

  Touches `saving_lib._load_state` and `_load_assets_from_dict`, as
  `keras.models.load_model` loads each layer: every load hook runs.
  """
  from keras.src.saving import saving_lib  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  weights, assets = state
  store = saving_lib.H5IOStore(io.BytesIO(weights), mode="r")
  try:
    saving_lib._load_state(  # pylint: disable=protected-access
        layer, weights_store=store, assets_store=None, inner_path="",
        visited_saveables=set())
  finally:
    store.close()
  if assets:
    saving_lib._load_assets_from_dict(layer, assets)  # pylint: disable=protected-access


def metric_direction(metric):
  """"up", "down" or None: which way a Keras metric object improves.

  Touches `Metric._direction`, set by Keras's own metrics (the accuracies:
  "up"). Keras has no public accessor; its callbacks read it.
  """
  return getattr(metric, "_direction", None)


def monitorable(trackers):
  """A metric listing `trackers` where Keras's callbacks look for them.

  `MonitorCallback._set_monitor_op` (EarlyStopping, ModelCheckpoint,
  ReduceLROnPlateau with mode="auto") finds the direction of `monitor`
  only among the metrics of a `compile_utils.CompileMetrics` or
  `MetricsList` in `model.metrics`, by name, from their `_direction`
  (Keras 3.15's monitor_callback.py); it has no public hook.

  Args:
    trackers: [(a Keras `Mean` tracker, "up" or "down")]; each tracker's
      `_direction` is set.

  Returns:
    A `MetricsList` over the trackers whose `result()` is their results
    by name, as `model.get_metrics_result()` expects of a metric.
  """
  from keras.src.trainers import compile_utils  # pylint: disable=g-import-not-at-top,import-outside-toplevel

  class Directions(compile_utils.MetricsList):

    def result(self):
      return self.get_result()

  for tracker, direction in trackers:
    tracker._direction = direction  # pylint: disable=protected-access
  return Directions([tracker for tracker, _ in trackers],
                    name="monitor_directions")
