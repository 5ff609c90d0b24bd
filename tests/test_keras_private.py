"""keras_private: the one adapter over Keras's private names.

Each function is run on a tiny model; the version test names the installed
Keras and the versions the adapter was checked on; the scan fails when any
other file of tf_interlock/ or layers/ touches a Keras private name.
"""

import ast
import os

import keras
import numpy as np
import pytest

from tests import ast_scan
from tests.binaries import ROOT
from tf_interlock import keras_private

# Keras private names our packages have used: flagged anywhere but the
# adapter, even where a file assigns them (`self._tracker = ...`).
KNOWN_KERAS_PRIVATE = frozenset({
    "_tracker", "_build_shapes_dict", "_inbound_nodes", "_outbound_nodes",
    "_nodes", "_keras_history", "_distribute_strategy", "_functional",
    "_flatten_layers", "_run_through_graph", "_fn", "_fn_kwargs", "_lock",
    "_flatten_metrics_in_order", "_layers", "_compile_config",
    "_get_node_attribute_at_index"})
ADAPTER = os.path.join("tf_interlock", "keras_private.py")
SCANNED = ("tf_interlock", "layers")


def _keras_private_names():
  """Private names of Keras's own objects (dir() of a small built graph)."""
  inputs = keras.Input((3,))
  model = keras.Sequential([inputs, keras.layers.Dense(2)])
  dense = model.layers[0]
  objects = [model, keras_private.functional_graph(model), dense,
             keras_private.inbound_nodes(dense)[0], model.outputs[0],
             keras.optimizers.SGD(), keras.metrics.Mean(),
             keras.metrics.SparseTopKCategoricalAccuracy(),
             keras.callbacks.Callback()]
  return {name for obj in objects for name in dir(obj)
          if name.startswith("_") and not name.startswith("__")}


def _named(node):
  """(name, how) for `x.name` and getattr/hasattr/setattr(x, "name")."""
  if isinstance(node, ast.Attribute):
    return node.attr, "."
  if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
      node.func.id in ("getattr", "hasattr", "setattr", "delattr") and
      len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and
      isinstance(node.args[1].value, str)):
    return node.args[1].value, f"{node.func.id}()"
  return None, None


def keras_private_reads(root, keras_names):
  """'path:line: name' for each Keras private name used outside the
  adapter. A known name always counts; any other private name of Keras's
  objects counts unless our packages define it themselves."""
  files = [(path, tree) for path, tree in ast_scan.parsed_files(root, SCANNED)
           if path != ADAPTER]
  ours = set().union(*(ast_scan.defined_names(tree) for _, tree in files))
  flagged = set(KNOWN_KERAS_PRIVATE) | (set(keras_names) - ours)
  found = []
  for path, tree in files:
    for node in ast.walk(tree):
      name, how = _named(node)
      if name in flagged:
        found.append(f"{path}:{node.lineno}: {how} {name}")
  return sorted(found)


def test_the_installed_keras_is_one_the_adapter_was_checked_on():
  assert keras.__version__ in keras_private.CHECKED_KERAS_VERSIONS, (
      f"tf_interlock/keras_private.py reads Keras private names checked on "
      f"Keras {', '.join(keras_private.CHECKED_KERAS_VERSIONS)} only; the "
      f"installed Keras is {keras.__version__}. Check each function there "
      f"against this Keras, then add its version to CHECKED_KERAS_VERSIONS. "
      f"Received: keras.__version__={keras.__version__}")


def test_no_file_but_the_adapter_touches_keras_private_names():
  assert keras_private_reads(ROOT, _keras_private_names()) == []


@pytest.mark.parametrize("source,expected", [
    ("def f(model):\n  return model._tracker.locked\n",
     "tf_interlock/bad.py:2: . _tracker"),
    ("class M:\n  def f(self):\n    self._distribute_strategy = 1\n",
     "tf_interlock/bad.py:3: . _distribute_strategy"),
    ("def f(t):\n  return getattr(t, '_keras_history')\n",
     "tf_interlock/bad.py:2: getattr() _keras_history"),
    ("def f(layer):\n  return layer._outbound_nodes\n",
     "tf_interlock/bad.py:2: . _outbound_nodes"),
    ("def f(model):\n  return model._compile_metrics\n",
     "tf_interlock/bad.py:2: . _compile_metrics"),
])
def test_the_scan_sees_a_keras_private_name(tmp_path, source, expected):
  (tmp_path / "tf_interlock").mkdir()
  (tmp_path / "tf_interlock" / "bad.py").write_text(source)
  (tmp_path / "tf_interlock" / "keras_private.py").write_text(
      "def f(model):\n  return model._tracker\n")
  assert keras_private_reads(str(tmp_path), {"_compile_metrics"}) == [
      expected]


def test_the_scan_allows_our_own_private_names(tmp_path):
  (tmp_path / "layers").mkdir()
  (tmp_path / "layers" / "ok.py").write_text(
      "class M:\n  def __init__(self):\n    self._scope = None\n"
      "  def f(self, other):\n    return other._scope, self.__class__\n")
  assert keras_private_reads(str(tmp_path), {"_scope"}) == []


def test_unlocked_tracker_lets_a_built_layer_take_state_once():
  layer = keras.layers.Dense(2)
  layer.build((None, 3))
  with pytest.raises(ValueError, match="already built"):
    layer.extra = keras.metrics.Mean(name="extra")
  with keras_private.unlocked_tracker(layer):
    layer.extra = keras.metrics.Mean(name="extra")
  assert layer.extra.name == "extra"
  with pytest.raises(ValueError, match="already built"):  # locked again
    layer.more = keras.metrics.Mean(name="more")
  unbuilt = keras.layers.Dense(2)
  with keras_private.unlocked_tracker(unbuilt):
    pass
  unbuilt.extra = keras.metrics.Mean(name="extra")  # never locked


def test_flatten_layers_finds_nested_layers_model_layers_does_not():
  inner = keras.layers.Dense(2, name="inner")
  model = keras.Sequential([keras.Input((4, 3)),
                            keras.layers.TimeDistributed(inner, name="td")])
  assert [layer.name for layer in model.layers] == ["td"]
  names = [layer.name for layer in keras_private.flatten_layers(model)]
  assert "td" in names and "inner" in names


def test_graph_nodes_and_history_of_a_shared_layer():
  shared = keras.layers.Dense(2, name="shared")
  a_in, b_in = keras.Input((3,)), keras.Input((5,))
  a = keras.Model(a_in, shared(keras.layers.Dense(3)(a_in)))
  b = keras.Model(b_in, shared(keras.layers.Dense(3)(b_in)))
  nodes = keras_private.inbound_nodes(shared)
  assert len(nodes) == 2
  assert tuple(nodes[0].output_tensors[0].shape) == (None, 2)
  assert [keras_private.node_in_graph(a, shared, i) for i in (0, 1)] == [
      True, False]
  assert [keras_private.node_in_graph(b, shared, i) for i in (0, 1)] == [
      False, True]
  assert keras_private.keras_history(b.outputs[0]) == (shared, 1, 0)
  seq = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  graph = keras_private.functional_graph(seq)
  assert isinstance(graph, keras.Model) and graph is not seq
  assert graph.operations[-1] is seq.layers[0]
  assert keras_private.functional_graph(a) is a

  class Sub(keras.Model):

    def call(self, x):
      return x

  assert keras_private.functional_graph(Sub()) is None
  assert keras_private.functional_graph(keras.Sequential()) is None


def test_run_through_graph_calls_each_layer_and_matches_the_model():
  inputs = keras.Input((3,))
  h = keras.layers.Dense(4, name="d1")(inputs)
  model = keras.Model(inputs, keras.layers.Dense(2, name="d2")(h))
  assert keras_private.can_run_through_graph(model)
  assert not keras_private.can_run_through_graph(keras.layers.Dense(2))
  seen = []

  def operation_fn(op):
    seen.append(op.name)
    return op

  x = np.arange(6, dtype="float32").reshape(2, 3)
  out = keras_private.run_through_graph(model, x, operation_fn)
  assert seen == ["d1", "d2"]
  np.testing.assert_array_equal(np.asarray(out), np.asarray(model(x)))


def test_metric_function_returns_the_per_example_function_and_arguments():
  metric = keras.metrics.SparseTopKCategoricalAccuracy(k=2)
  fn, kwargs = keras_private.metric_function(metric)
  assert kwargs["k"] == 2
  y = np.array([2, 0])
  p = np.array([[0.1, 0.5, 0.4], [0.1, 0.5, 0.4]], "float32")
  np.testing.assert_array_equal(np.asarray(fn(y, p, **kwargs)), [1.0, 0.0])
  metric.update_state(y, p)
  assert float(metric.result()) == 0.5
  assert keras_private.metric_function(keras.metrics.Mean()) == (None, {})


def test_skip_optimizer_init_lets_a_handle_set_attributes():

  class Handle(keras.optimizers.Optimizer):

    def __init__(self, skip):  # pylint: disable=super-init-not-called
      if skip:
        keras_private.skip_optimizer_init(self)
      self.name = "handle"

  with pytest.raises(RuntimeError, match="super"):
    Handle(skip=False)
  handle = Handle(skip=True)
  assert handle.name == "handle"
  assert not hasattr(handle, "iterations")  # no base __init__ state
