"""A user's own Keras models through the front door (issue 27, sections 1-2).

A small Transformer LM of the user's own (an unregistered position layer,
pre-LN blocks with causal self-attention), frozen modules and layers,
Keras metric lists, train_on_batch/test_on_batch, a layer without a
gradient, and drawing the model.
"""

import types
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.utils import model_visualization

import tf_interlock as ti
from tests.keras_models import sequential_cnn

VOCAB, LENGTH, WIDTH = 12, 8, 16
BATCH = 8


class Positions(keras.layers.Layer):
  """A learned position table, added: the user's own layer, unregistered."""

  def build(self, input_shape):
    self.table = self.add_weight(shape=tuple(input_shape[1:]), name="table")

  def call(self, inputs):
    return inputs + self.table


def transformer_lm(seed=0):
  """Embedding, positions, 3 pre-LN causal attention blocks, Dense to vocab."""
  keras.utils.set_random_seed(seed)
  tokens = keras.Input((LENGTH,), dtype="int32")
  h = Positions()(keras.layers.Embedding(VOCAB, WIDTH)(tokens))
  for _ in range(3):
    a = keras.layers.LayerNormalization()(h)
    a = keras.layers.MultiHeadAttention(2, WIDTH // 2)(a, a,
                                                       use_causal_mask=True)
    h = keras.layers.Add()([h, a])
    f = keras.layers.LayerNormalization()(h)
    f = keras.layers.Dense(WIDTH, activation="relu")(f)
    h = keras.layers.Add()([h, f])
  logits = keras.layers.Dense(VOCAB)(keras.layers.LayerNormalization()(h))
  return keras.Model(tokens, logits)


def token_data(num=4 * BATCH, seed=0):
  """Counting sequences: the next token is the current one plus one."""
  start = np.random.default_rng(seed).integers(0, VOCAB, size=(num, 1))
  seq = (start + np.arange(LENGTH + 1)) % VOCAB
  return seq[:, :-1].astype("int32"), seq[:, 1:].astype("int32")


def image_data(num=4 * BATCH, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num, 8, 8, 1)).astype("float32")
  return x, rng.integers(0, 10, size=num).astype("int32")


def mlp(seed=0):
  keras.utils.set_random_seed(seed)
  return keras.Sequential([
      keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
      keras.layers.Dense(8, activation="relu", name="middle"),
      keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)])


def mlp_data(num=4 * BATCH, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(num, 6)).astype("float32"),
          rng.integers(0, 4, size=num).astype("int32"))


def module_weights(model):
  return [[w.numpy() for w in module.weights] for module in model.modules]


def assert_same(a, b):
  assert len(a) == len(b)
  for u, v in zip(a, b):
    np.testing.assert_array_equal(u, v)


def assert_changed(a, b):
  assert any(not np.array_equal(u, v) for u, v in zip(a, b))


# -- 1. Sequence models ------------------------------------------------------


def test_transformer_lm_trains_2wise_and_every_exit_predicts_every_token():
  x, y = token_data()
  modules = ti.from_keras(transformer_lm(), num_modules=3)
  # The network's output is per position, so the default heads are too.
  assert [type(m.aux_head) for m in modules[:2]] == [ti.SequenceAuxHead] * 2
  assert modules[1].body.compute_output_shape((1, LENGTH, WIDTH)) == (
      1, LENGTH, WIDTH)
  model = ti.InterlockModel(modules, strategy="2wise")
  model.compile(keras.optimizers.Adam(1e-2), metrics=["accuracy"])
  history = model.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False,
                      verbose=0).history
  for k in (1, 2, 3):
    losses = history[f"module_{k}/loss"]
    assert losses[-1] < losses[0], (k, losses)
  for k in (1, 2):
    logits = model.predict(x[:4], exit=k, verbose=0)
    assert logits.shape == (4, LENGTH, VOCAB)
    # Exit k is modules 1..k, then head k at every position.
    h = x[:4]
    for module in model.modules[:k]:
      h = module(h)
    np.testing.assert_allclose(logits, model.modules[k - 1].aux_head(h),
                               atol=1e-5)


def test_sequence_head_on_a_cut_and_a_layer_norm_head_export(tmp_path):
  x, y = token_data()
  # ti.SequenceAuxHead builds on the shape a cut piece reports.
  modules = ti.from_keras(transformer_lm(), 3,
                          aux_head=lambda k, shape: ti.SequenceAuxHead(VOCAB))
  modules[1].build((1, LENGTH, WIDTH))
  assert modules[1].aux_head.compute_output_shape((1, LENGTH, WIDTH)) == (
      1, LENGTH, VOCAB)
  # A head of one's own with LayerNormalization trains and exports.
  model = ti.InterlockModel(ti.from_keras(
      transformer_lm(), 3, aux_head=lambda k, shape: keras.Sequential(
          [keras.layers.LayerNormalization(), keras.layers.Dense(VOCAB)])),
                            "2wise")
  model.compile(keras.optimizers.Adam(1e-2))
  model.fit(x, y, batch_size=BATCH, verbose=0)
  loaded = tf.saved_model.load(model.export_saved_model(
      str(tmp_path / "export")))
  assert sorted(loaded.signatures) == ["exit_1", "exit_2", "serving_default"]
  for exit_k, signature in ((1, "exit_1"), (2, "exit_2"),
                            (None, "serving_default")):
    served = loaded.signatures[signature](inputs=tf.constant(x[:4]))
    np.testing.assert_allclose(
        served["logits"], model.predict(x[:4], exit=exit_k, verbose=0),
        atol=1e-5, err_msg=signature)


# -- 2. Everyday Keras moves ---------------------------------------------------


def test_unregistered_layer_is_rebuilt_from_its_class_and_saving_asks_as_keras(
    tmp_path):
  x, y = token_data(num=2 * BATCH)
  source = transformer_lm()
  model = ti.InterlockModel(ti.from_keras(source, 3), "e2e")
  model.compile()
  model.build((None, LENGTH))
  # The piece's copy of the user's layer holds the source's weights.
  piece = model.modules[0].body.model
  positions = [layer for layer in piece.layers
               if isinstance(layer, Positions)]
  assert len(positions) == 1
  np.testing.assert_array_equal(
      positions[0].table.numpy(),
      [layer for layer in source.layers
       if isinstance(layer, Positions)][0].table.numpy())
  model.fit(x, y, batch_size=BATCH, verbose=0)
  # Loading needs the class registered (or custom_objects), as for Keras.
  for name, saved in (("keras", source), ("interlock", model)):
    path = str(tmp_path / f"{name}.keras")
    saved.save(path)
    with pytest.raises(TypeError, match="Could not locate class 'Positions'"):
      keras.models.load_model(path)


def test_frozen_first_module_under_e2e_passes_cotangents_through():
  x, y = mlp_data()

  def run(freeze, optimizers):
    model = ti.InterlockModel(ti.from_keras(mlp(), 3, split=[1, 2, 1]),
                              "e2e")
    if freeze:
      model.modules[0].trainable = False
    model.compile(optimizers)
    model.build((None, 6))
    before = module_weights(model)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return before, module_weights(model)

  before, frozen = run(True, keras.optimizers.SGD(0.1))
  assert_same(before[0], frozen[0])
  # Everything else trains exactly as with module 1's learning rate at 0.
  _, zero_rate = run(False, [keras.optimizers.SGD(0.0),
                             keras.optimizers.SGD(0.1),
                             keras.optimizers.SGD(0.1)])
  for k in (1, 2):
    assert_changed(before[k], frozen[k])
    assert_same(frozen[k], zero_rate[k])


def test_frozen_last_module_under_local_leaves_the_others_as_before():
  x, y = image_data()

  def run(freeze):
    model = ti.InterlockModel(ti.from_keras(sequential_cnn(size=8), 3),
                              "local")
    if freeze:
      model.modules[2].trainable = False
    model.compile(keras.optimizers.SGD(0.1))
    model.build((None, 8, 8, 1))
    before = module_weights(model)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return before, module_weights(model)

  before, frozen = run(True)
  _, unfrozen = run(False)
  # Module 3 (BatchNormalization's moving statistics included) is frozen.
  assert_same(before[2], frozen[2])
  assert_changed(before[2], unfrozen[2])
  for k in (0, 1):
    assert_same(frozen[k], unfrozen[k])


def test_frozen_layer_in_the_source_model_stays_frozen():
  x, y = mlp_data()
  source = mlp()
  source.get_layer("middle").trainable = False
  model = ti.InterlockModel(ti.from_keras(source, 2, split=[2, 2]), "2wise")
  model.compile(keras.optimizers.SGD(0.1))
  model.build((None, 6))
  body = model.modules[0].body.model
  before = [layer.get_weights() for layer in body.layers[1:]]
  model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
  after = [layer.get_weights() for layer in body.layers[1:]]
  assert [layer.name for layer in body.layers[1:]][1] == "middle"
  assert_changed(before[0], after[0])
  assert_same(before[1], after[1])


def test_metric_list_gives_every_exit_its_own_copy(tmp_path):
  x, y = image_data()
  model = ti.InterlockModel(ti.from_keras(sequential_cnn(size=8), 3),
                            "2wise")
  model.compile(keras.optimizers.SGD(0.1), metrics=[
      "accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
  history = model.fit(x, y, batch_size=BATCH, verbose=0).history
  top2 = "sparse_top_k_categorical_accuracy"
  for k in (1, 2, 3):
    assert f"module_{k}/accuracy" in history
    assert f"module_{k}/{top2}" in history
  assert history[top2] == history[f"module_3/{top2}"]
  logs = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
  for k, exit_k in ((1, 1), (2, 2), (3, None)):
    want = keras.metrics.SparseTopKCategoricalAccuracy(k=2)
    want.update_state(y, model.predict(x, exit=exit_k, verbose=0))
    np.testing.assert_allclose(logs[f"module_{k}/{top2}"], want.result(),
                               rtol=1e-6)
  # Saved compiled, metric objects included, and recompiled on loading.
  model.save(str(tmp_path / "m.keras"))
  restored = keras.models.load_model(str(tmp_path / "m.keras"))
  assert restored.evaluate(x, y, batch_size=BATCH, verbose=0,
                           return_dict=True) == logs
  with pytest.raises(ValueError, match=r"not one .*Received: metrics=<AUC"):
    model.compile(metrics=["accuracy", keras.metrics.AUC()])


def test_train_on_batch_is_fits_step_and_test_on_batch_its_evaluation():
  x, y = image_data(num=2 * BATCH)

  def compiled():
    model = ti.InterlockModel(ti.from_keras(sequential_cnn(size=8), 3),
                              "2wise")
    model.compile(keras.optimizers.SGD(0.1), metrics=["accuracy"])
    return model

  own = compiled()
  first = own.train_on_batch(x[:BATCH], y[:BATCH], return_dict=True)
  second = own.train_on_batch(x[BATCH:], y[BATCH:])
  assert isinstance(second, list) and len(second) == len(own.metrics_names)
  assert own.metrics_names[:2] == ["loss", "accuracy"]
  assert first["loss"] == first["module_3/loss"]
  fitted = compiled()
  history = fitted.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
  assert_same(own.get_weights(), fitted.get_weights())
  # fit's epoch log is the mean of the two steps train_on_batch reported.
  np.testing.assert_allclose(history.history["loss"][0],
                             (first["loss"] + second[0]) / 2, rtol=1e-6)
  logs = own.test_on_batch(x[:BATCH], y[:BATCH], return_dict=True)
  values = own.test_on_batch(x[:BATCH], y[:BATCH])
  assert logs == own.evaluate(x[:BATCH], y[:BATCH], batch_size=BATCH,
                              verbose=0, return_dict=True)
  assert values[0] == logs["loss"] and values[1] == logs["accuracy"]


def test_a_tape_over_the_model_sees_the_cuts():
  model = ti.InterlockModel(ti.from_keras(mlp(), 3, split=[1, 2, 1]), "e2e")
  x, _ = mlp_data()
  model.build((None, 6))
  with tf.GradientTape() as tape:
    out = model(x)
  grads = tape.gradient(out, [m.body.trainable_variables[0]
                              for m in model.modules])
  # Each module's input is cut: only the last module is reached.
  assert grads[0] is None and grads[1] is None and grads[2] is not None


class NoGradient(keras.layers.Layer):
  """Doubles its input in NumPy: TF has no gradient for it."""

  def call(self, inputs):
    out = tf.numpy_function(lambda a: 2 * a, [inputs], tf.float32)
    return tf.ensure_shape(out, inputs.shape)


def no_gradient_mlp():
  keras.utils.set_random_seed(0)
  return keras.Sequential([
      keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
      keras.layers.Dense(8, activation="relu"), NoGradient(name="no_grad"),
      keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)])


@pytest.mark.parametrize("strategy", ["e2e", "2wise"])
def test_a_layer_without_gradient_sends_zero_with_one_warning(strategy):
  x, y = mlp_data()
  model = ti.InterlockModel(
      ti.from_keras(no_gradient_mlp(), 3, split=[1, 2, 2]), strategy)
  model.compile(keras.optimizers.SGD(0.1))
  model.build((None, 6))
  before = module_weights(model)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
  said = [str(w.message) for w in caught if "No gradient" in str(w.message)]
  assert len(said) == 1, said
  assert said[0].startswith("No gradient flows through layer 'no_grad' of "
                            "module 2")
  after = module_weights(model)
  body = model.modules[0].body.trainable_variables
  if strategy == "e2e":
    # As plain Keras: nothing below the layer is trained by the loss.
    assert_same(before[0][:len(body)], after[0][:len(body)])
    plain = no_gradient_mlp()
    plain.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    pieces = [layer for module in model.modules
              for layer in module.body.model.layers[1:]]
    assert len(pieces) == len(plain.layers)
    for piece, layer in zip(pieces, plain.layers):
      for got, want in zip(piece.get_weights(), layer.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  else:
    # 2-wise: module 1 still learns from its own aux loss.
    assert_changed(before[0], after[0])


class FakePydot(types.ModuleType):
  """Just enough of pydot to record what `keras.utils.model_to_dot` builds."""

  class _Graph:

    def __init__(self, *args, **kwargs):
      self.args, self.attrs = args, dict(kwargs)
      self.nodes, self.edges, self.subgraphs = [], [], []

    def set(self, key, value):
      self.attrs[key] = value

    def set_node_defaults(self, **kwargs):
      del kwargs

    def add_node(self, node):
      self.nodes.append(node)

    def add_edge(self, edge):
      self.edges.append(edge)

    def add_subgraph(self, graph):
      self.subgraphs.append(graph)

    def get_edge(self, src, dst):
      return [e for e in self.edges if e.args == (src, dst)]

  Dot = Cluster = Node = Edge = _Graph


def test_plot_model_without_pydot_and_the_graph_it_can_walk(monkeypatch):
  model = ti.InterlockModel(ti.from_keras(sequential_cnn(size=8), 3),
                            "2wise")
  model.build((None, 8, 8, 1))
  # Without pydot, Keras's own message, as for any Keras model.
  monkeypatch.setattr(model_visualization, "pydot", None)
  messages = []
  for drawn in (sequential_cnn(size=8), model):
    with pytest.raises(ImportError) as raised:
      keras.utils.plot_model(drawn, expand_nested=True)
    messages.append(str(raised.value))
  assert messages[0] == messages[1]
  monkeypatch.setattr(model_visualization, "pydot",
                      FakePydot("pydot"))
  dot = keras.utils.model_to_dot(model.as_functional(), expand_nested=True)
  clusters = {c.attrs["label"]: c for c in dot.subgraphs}
  pieces = [module.body.model.name for module in model.modules]
  assert sorted(clusters) == sorted(pieces + ["aux_head1", "aux_head2"])
  drawn = {id(node) for c in dot.subgraphs for node in c.nodes}
  assert len(drawn) == sum(len(c.nodes) for c in dot.subgraphs)
  for k, module in enumerate(model.modules, start=1):
    names = [n.args[0] for n in clusters[pieces[k - 1]].nodes]
    layers = module.body.model.layers
    assert names == [str(id(layer)) for layer in layers]
  for k in (1, 2):
    names = [n.args[0] for n in clusters[f"aux_head{k}"].nodes]
    assert names == [str(id(layer))
                     for layer in model.modules[k - 1].aux_head.layers]
  # One edge into each head, from the last layer of its module.
  for k in (1, 2):
    source = str(id(model.modules[k - 1].body.model.layers[-1]))
    first = str(id(model.modules[k - 1].aux_head.layers[0]))
    assert [e.args for e in dot.edges if e.args[1] == first] == [
        (source, first)]
