"""Splits an existing Keras model depthwise into interlocking modules.

`from_keras` turns a `keras.Sequential` or a functional model into K
`InterlockModule`s (Gomez et al., 2022, arXiv:2010.04116, Sec. 3): module k
holds the layers between two cuts, every module but the last gets an
auxiliary head A_k, and the last one ends with the model's own output.

Interlocking moves one activation h_k forward and one cotangent dL/dh_k
back across each module boundary, so a cut is only allowed where a single
floating-point tensor crosses it: between two residual blocks, not inside
one (the skip connection would be a second one). Integer and boolean
tensors (a padding mask, segment ids) may cross too: they ride along the
boundary as a nest, without a cotangent (`layers.boundary`). Raw
`keras.Operation`s stand where layers may (`keras_nodes`), and nested
functional models are inlined first (`keras_flatten`). A layer called in two
modules (tied weights) is a copy in each (`keras_ties`).

The user's model is already built, so its weights live wherever they were
created (usually CPU:0), and a later device scope does not move them. The
modules therefore hold each piece's *config*, not its layers: a
`KerasSegment` creates fresh layers when the module is first built, inside
module k's device scope, and only then copies the source weights in. Weights
are copied once, at that first build, from a snapshot taken by `from_keras`.
"""

import json
import time

import keras
import numpy as np
import tensorflow as tf

from layers import aux_heads
from layers.interlock_module import InterlockModule
from tf_interlock.keras import fit_checks
from tf_interlock import int_args
from tf_interlock.keras import blocks as keras_blocks
from tf_interlock.keras import flatten as keras_flatten
from tf_interlock.keras import flops as keras_flops
from tf_interlock.keras import nodes as keras_nodes
from tf_interlock.keras import origins as keras_origins
from tf_interlock import keras_private
from tf_interlock.keras import ties as keras_ties
from tf_interlock.keras import layer_state
from tf_interlock.keras import task_defaults
from layers import partition

BALANCE_MODES = ("flops", "params", "time")


@keras.saving.register_keras_serializable(package="tf_interlock")
class KerasSegment(keras.layers.Layer):
  """A piece of a functional model, re-created from its config at build.

  Args:
    model_config: `get_config()` of the functional sub-model (its own
      InputLayer first).
    initial_weights: optional {layer name: that layer's
      `layer_state.snapshot`}, put into the new layers right after the
      build (weights, adapted preprocessing state, `trainable` at every
      depth).
    custom_objects: {class name: class} of the source model's own layers.
    tied_layers: {layer name in this piece: tie key} of the layers whose
      weights are one weight with a layer of another piece (the same key
      there): the trainer sums their gradients (`tied_gradients`).
    trainable_flags: optional `layer_state.trainable_flags` to set after
      the build (what a saved piece's layers were, at every depth).
    origins: optional {"paths": {layer name: its path of names in the
      user's model}, and in piece 1 "source": that model's serialized
      config} (`keras_origins.record`).
    default_loss: optional serialized Keras loss: the loss the source
      keras_hub task's `compile` picks when given none
      (`task_defaults`), kept by the last piece so that a saved model
      knows it too.
    compile_defaults: optional {"optimizer", "metrics",
      "weighted_metrics"}, each serialized or None: the rest of what that
      compile picks ("auto"), kept the same way.
    **kwargs: base `keras.layers.Layer` arguments.

  Call arguments: inputs, the piece's input tensor; training, a Python bool.
  """

  def __init__(self, model_config, initial_weights=None, custom_objects=None,
               tied_layers=None, trainable_flags=None, origins=None,
               default_loss=None, compile_defaults=None, **kwargs):
    super().__init__(**kwargs)
    self._flags_json = json.dumps(trainable_flags or [])
    self._origins_json = json.dumps(origins or {})
    self._source = lambda: None
    # Kept as text: Keras wraps a dict attribute in a tracking container
    # that serializes as {}.
    self._model_json = json.dumps(model_config)
    self._tied_json = json.dumps(tied_layers or {})
    self._default_loss_json = json.dumps(default_loss)
    self._compile_defaults_json = json.dumps(compile_defaults)
    self._initial_weights = initial_weights
    # The source model's own layer classes, by class name: a user's layer
    # is rebuilt from its class, as keras.models.clone_model does, without
    # registration. Not part of the config: a saved model finds its classes
    # by registered name, as Keras requires for saving.
    objects = dict(custom_objects or {})
    self._custom_objects = lambda: objects
    self.model = None

  def build(self, input_shape):
    # Out of any function being traced: a layer's state may be tensors
    # computed when it is loaded (an adapted Normalization's mean), which
    # must not belong to a graph. The device scope is kept.
    with tf.init_scope():
      # from_config calls the new layers on a symbolic input: their weights
      # are created here, under the caller's (module k's) device scope.
      self.model = _from_config(self.model_config, self._custom_objects())
      if self._initial_weights is not None:
        for layer_name, state in self._initial_weights.items():
          layer_state.restore(self.model.get_layer(layer_name), state)
        self._initial_weights = None
      layer_state.set_trainable_flags(self.model,
                                      json.loads(self._flags_json))
    if not self.trainable:
      # Frozen before its layers existed (e.g. `model.modules[0].trainable
      # = False` before the first build): freeze them too, so that a
      # BatchNormalization inside runs in inference mode, as Keras does.
      self.model.trainable = False

  @property
  def model_config(self):
    return json.loads(self._model_json)

  @property
  def origins(self):
    """{"paths": {layer name: its path of names in the user's model}, ...}
    (`keras_origins`); {} for a piece made otherwise."""
    return json.loads(self._origins_json)

  def set_origins(self, origins, source=None):
    """Records where this piece's layers came from, and the user's model
    itself (not saved: `source_model`)."""
    self._origins_json = json.dumps(origins)
    self._source = lambda: source

  def source_model(self):
    """The model given to `from_keras`, while this piece was made from it
    in this process; None after a reload or a clone."""
    return self._source()

  @property
  def tied_layers(self):
    """{layer name: tie key} of this piece's tied layers (see Args)."""
    return json.loads(self._tied_json)

  @property
  def default_loss(self):
    """The source task's default loss, serialized (see Args), or None."""
    return json.loads(self._default_loss_json)

  @default_loss.setter
  def default_loss(self, config):
    self._default_loss_json = json.dumps(config)

  @property
  def compile_defaults(self):
    """The source task's other compile defaults (see Args), or None."""
    return json.loads(self._compile_defaults_json)

  @compile_defaults.setter
  def compile_defaults(self, config):
    self._compile_defaults_json = json.dumps(config)

  @property
  def layer_names(self):
    """The source model's layers this piece holds, in depth order."""
    return [c["name"] for c in self.model_config["layers"]
            if c["class_name"] != "InputLayer"]

  def call(self, inputs, training=False):
    return self.model(inputs, training=training)

  def compute_output_shape(self, input_shape):
    model = self.model or _from_config(self.model_config,
                                       self._custom_objects())
    shape = model.compute_output_shape(input_shape)
    # A functional model with its one output given as a list reports
    # [shape]; a piece with one output tensor returns it bare, one with
    # several (a hidden state and a mask) a list of shapes.
    if isinstance(shape, (list, tuple)) and shape and isinstance(
        shape[0], (list, tuple)):
      return (tuple(shape[0]) if len(shape) == 1 else
              [tuple(s) for s in shape])
    return tuple(shape)

  def get_config(self):
    config = super().get_config()
    config["model_config"] = self.model_config
    if self.tied_layers:
      config["tied_layers"] = self.tied_layers
    # Every layer's trainable flag as it is now, at every depth: a flag
    # set after the split is no part of model_config.
    flags = (json.loads(self._flags_json) if self.model is None else
             layer_state.trainable_flags(self.model))
    if flags:
      config["trainable_flags"] = flags
    if json.loads(self._origins_json):
      config["origins"] = json.loads(self._origins_json)
    if self.default_loss is not None:
      config["default_loss"] = self.default_loss
    if self.compile_defaults is not None:
      config["compile_defaults"] = self.compile_defaults
    return config


def _from_config(config, custom_objects):
  """A functional model from its config, finding the source's own classes."""
  return keras.Model.from_config(config, custom_objects=custom_objects)


def _layer_classes(model):
  """{class name: class} of every non-Keras layer in `model`, nested ones
  included.

  Keras's own classes are left out: a config finds them by module path, and
  a built-in layer's registered name is its bare class name, which a raw
  Operation of another class shares (the layer `keras.layers.Add` and the
  `x + 3.0` of MobileNetV3's hard-swish, `keras.ops.numpy.Add`, are both
  "Add"): given here, it would turn the Operation into the layer.
  """
  classes = {}
  for layer in keras_private.flatten_layers(model):
    cls = layer.__class__
    if cls.__module__.split(".")[0] == "keras":
      continue
    classes[keras.saving.get_registered_name(cls)] = cls
    classes.setdefault(cls.__name__, cls)
  return classes


def _checked_graph(model):
  """The `Functional` holding a Sequential or functional model's graph,
  checked: a model with one output."""
  if not isinstance(model, keras.Model):
    raise TypeError(f"from_keras needs a keras.Sequential or a functional "
                    f"keras.Model. Received: model={model!r}")
  graph = keras_private.functional_graph(model)
  if graph is None:
    raise ValueError(
        f"from_keras needs a model with a layer graph: a Sequential starting "
        f"with keras.Input(...) or a functional model (a subclassed model "
        f"has no graph to cut). Received: model={model.name!r}")
  if len(graph.outputs) != 1:
    # Why one output, and what to do instead: docs/keras.md, "Several
    # outputs".
    raise ValueError(
        f"from_keras splits models with one output (every exit is one "
        f"logits tensor); model {model.name!r} has {len(graph.outputs)}: "
        f"{_output_names(graph)}. Concatenate them into one output and "
        f"compile with one loss over its slices (docs/keras.md, \"Several "
        f"outputs\"). Received: model={model.name!r}")
  return graph


def _raise_if_a_config_fails(model, error):
  """Raises one line naming the first layer of `model` whose `get_config`
  fails (the cause of `error`, which the split hit rebuilding the graph).

  Every piece is re-created from its layers' configs, as
  `keras.models.clone_model` of the inlined graph would: a layer whose
  class cannot give its config (e.g. keras_hub 0.32's
  `LlamaTransformerDecoder`, whose `get_config` reads an attribute its
  constructor never sets) cannot be split, though the model it sits in may
  save whole (a keras_hub backbone saves its own constructor's arguments,
  not its layers' configs).
  """
  def in_order(outer):
    # Depth order, nested models looked into, as the split inlines them.
    for layer in outer.layers:
      if isinstance(layer, keras.Model):
        yield from in_order(layer)
      else:
        yield layer

  for layer in in_order(model):
    try:
      layer.get_config()
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(
          f"from_keras rebuilds every layer from its config, and layer "
          f"{layer.name!r} ({type(layer).__module__}."
          f"{type(layer).__name__}) cannot give one: its get_config raises "
          f"{type(e).__name__}: {str(e).strip().splitlines()[0]} (a bug of "
          f"that class: get_config must return its constructor's "
          f"arguments). Received: model={model.name!r}") from error


def _output_names(graph):
  """A model's outputs as the user named them: a dict's keys, else the
  layers that make them."""
  if isinstance(graph.output, dict):
    return list(graph.output)
  return [keras_private.keras_history(t)[0].name for t in graph.outputs]


def _graph(model):
  """The functional graph of a model whose layers are each called once
  (`keras_flatten.flatten` makes it so).

  Returns:
    (graph, layers, nodes): the `Functional` holding the layer graph, its
    layers without InputLayers in topological order, and each layer's one
    node in this graph.
  """
  graph = _checked_graph(model)
  layers, nodes = [], []
  for layer in graph.operations:
    if isinstance(layer, keras.layers.InputLayer):
      continue
    # Only this graph's node counts: the same layer may also sit in others.
    own = [node for i, node in enumerate(keras_private.inbound_nodes(layer))
           if keras_private.node_in_graph(graph, layer, i)]
    layers.append(layer)
    nodes.append(own[0])
  return graph, layers, nodes


def _crossings(nodes, model_inputs, model_output):
  """For each cut after layer i, the tensors that cross it.

  A tensor made by layer p (p = -1: a model input) and read by layer j
  (j = len(nodes): the model output) crosses every cut p <= c < j: a model
  input that a later layer reads (a padding mask) crosses every cut before
  that layer.

  Returns:
    A list of len(nodes) - 1 lists of (tensor, producer, consumer names).
  """
  position = {id(t): (-1, "input") for t in model_inputs}
  for i, node in enumerate(nodes):
    for t in node.output_tensors:
      position[id(t)] = (i, node.operation.name)
  reads = [(t, j, node.operation.name) for j, node in enumerate(nodes)
           for t in node.input_tensors]
  reads.append((model_output, len(nodes), "output"))
  crossing = [{} for _ in range(len(nodes) - 1)]
  for tensor, j, consumer in reads:
    p, producer = position[id(tensor)]
    for c in range(max(p, 0), min(j, len(nodes) - 1)):
      crossing[c].setdefault(id(tensor), (tensor, producer, consumer))
  return [list(c.values()) for c in crossing]


def _rewire(value, old, new):
  """Copies a layer config, pointing references to tensor `old` at `new`."""
  if isinstance(value, dict):
    if value.get("class_name") == "__keras_tensor__":
      history = list(value["config"]["keras_history"])
      if history[0] == old[0] and history[2] == old[2]:
        value = dict(value, config=dict(value["config"], keras_history=new))
      return value
    return {key: _rewire(v, old, new) for key, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_rewire(v, old, new) for v in value]
  return value


def _history(config, producer, tensor_index):
  """[name, node index, tensor index] of a tensor as the config refers to it."""
  found = []

  def walk(value):
    if isinstance(value, dict):
      if value.get("class_name") == "__keras_tensor__":
        history = list(value["config"]["keras_history"])
        if history[0] == producer and history[2] == tensor_index:
          found.append(history)
      for v in value.values():
        walk(v)
    elif isinstance(value, (list, tuple)):
      for v in value:
        walk(v)
  walk(config)
  return found[0]


def _one_tensor(refs):
  """[[name, node, tensor]]: Keras writes a single input or output flat."""
  return [list(refs)] if isinstance(refs[0], str) else [list(r) for r in refs]


def _tensor_history(config, tensor):
  """[name, node, tensor] of a KerasTensor as `config` refers to it."""
  producer, _, tensor_index = keras_private.keras_history(tensor)
  return _history(config, producer.name, tensor_index)


def _segment_config(config, layers, start, stop, t_ins, t_outs, name):
  """The functional config of layers[start:stop].

  Args:
    config: the whole model's functional config.
    layers: its layers and operations in topological order.
    start, stop: the piece's layers.
    t_ins: the tensors crossing the cut before the piece (None for the
      first piece, which takes the model's inputs).
    t_outs: the tensors crossing the cut after it (None for the last
      piece, which gives the model's output).
    name: the piece's name.

  The crossing tensors are a list, in the order given (`_boundary`): one
  tensor is a list of one, as Keras writes a model's single input. Built from the whole model's config, so the
  user's model is not touched (creating a sub-model from its tensors would
  add nodes to its layers).
  """
  names = {layer.name for layer in layers[start:stop]}
  by_name = {c["name"]: c for c in config["layers"]}
  body = [by_name[n] for n in by_name if n in names]
  fed = {}  # A crossing tensor's history -> its new input's history.
  if start == 0:
    refs = keras_flatten.tensor_refs(config["input_layers"])
    # One input as before ([[name, 0, 0]]); several as the model takes them
    # (a list, or a dict whose keys fit, predict and export take).
    input_layers = refs if len(refs) == 1 else config["input_layers"]
    inputs = [by_name[r[0]] for r in refs]
  else:
    inputs, input_layers = [], []
    for i, t_in in enumerate(t_ins):
      old = _tensor_history(config, t_in)
      input_name = f"{name}_input" + (f"_{i}" if i else "")
      inputs.append({
          "module": "keras.layers", "class_name": "InputLayer",
          "registered_name": None, "name": input_name, "inbound_nodes": [],
          "config": {"batch_shape": list(t_in.shape), "dtype": t_in.dtype,
                     "name": input_name}})
      input_layers.append([input_name, 0, 0])
      body = _rewire(body, old, [input_name, 0, 0])
      fed[(old[0], old[2])] = [input_name, 0, 0]
  if stop == len(layers):
    output_layers = _one_tensor(config["output_layers"])
  else:
    output_layers = []
    for t_out in t_outs:
      history = _tensor_history(config, t_out)
      output_layers.append(fed.get((history[0], history[2]), history))
  return {"name": name, "trainable": True, "layers": inputs + body,
          "input_layers": input_layers, "output_layers": output_layers}


def _flops(layer, node):
  """`layer_flops`, or one line naming the layer and the balance to pass."""
  try:
    return keras_flops.layer_flops(layer, node)
  except (TypeError, ValueError) as e:
    shape = tuple(node.input_tensors[0].shape) if node.input_tensors else ()
    raise ValueError(
        f"Cannot estimate the FLOPs of layer {layer.name!r} (input shape "
        f"{shape}: {e}); pass balance='params', balance='time' with "
        f"sample= (a batch of inputs), or split=. "
        f"Received: balance='flops'") from e


def _timed_costs(pieces, sample, custom_objects):
  """Median forward seconds of each piece on `sample`, one piece at a time.

  Each piece is re-created from its config with fresh weights: timing does
  not depend on the weights' values, and the user's model stays untouched.
  """
  h, costs = tf.nest.map_structure(tf.convert_to_tensor, sample), []
  for config in pieces:
    piece = _from_config(config, custom_objects)
    run = tf.function(lambda x, p=piece: p(x, training=False))
    h_next = run(h)  # Traces and warms up.
    times = []
    for _ in range(5):
      start = time.perf_counter()
      tf.nest.map_structure(lambda t: t.numpy(), run(h))
      times.append(time.perf_counter() - start)
    costs.append(float(np.median(times)))
    h = h_next
  return costs


def _make_aux_head(aux_head, k, shape, num_classes, activation,
                   output_shape=()):
  """A_k for features of `shape` (batch axis included), unbuilt: a kind of
  `layers.aux_heads.KINDS` (None for "none") or the user's callable."""
  name = f"aux_head{k}"
  if callable(aux_head) and not isinstance(aux_head, str):
    head = aux_head(k, shape)
    if not isinstance(head, keras.layers.Layer):
      raise TypeError(f"aux_head(k, shape) must return a Keras layer. "
                      f"Received: aux_head({k}, {shape})={head!r}")
    return head
  # BN inside a conv head is per replica here, as in the source model.
  return aux_heads.make_aux_head(aux_head, num_classes, shape,
                                 activation=activation,
                                 output_shape=output_shape,
                                 synchronized_bn=False, name=name)


def _head_maker(graph, layers, aux_head, num_classes):
  """`(k, feature shape) -> A_k, unbuilt`, for the model's output: its
  classes (unless `num_classes`), shape and last activation."""
  if num_classes is None:
    num_classes = graph.outputs[0].shape[-1]
  activation = getattr(layers[-1], "activation", None)
  activation = (None if activation is None else
                keras.activations.serialize(activation))
  return lambda k, shape: _make_aux_head(aux_head, k, shape, num_classes,
                                         activation,
                                         tuple(graph.outputs[0].shape))


def _aux_head_flops(make_head, crossing, ends):
  """Per block end, the FLOPs of the aux head a module ending there runs
  on its output (0 after the last block): a full-vocabulary head on a
  language model costs about as much as one of its layers or more, so
  the balance counts it (`partition.balanced_split`'s cut costs).

  One head is made per distinct feature shape. A kind that cannot read
  some block's features (a conv head after a Dense layer) costs 0 there,
  as before heads were counted: if the balance cuts there, building the
  modules raises its one-line error."""
  by_shape = {}
  for end in ends[:-1]:
    shape = tuple(_boundary(crossing, end - 1)[0].shape)
    if shape not in by_shape:
      try:
        head = make_head(0, shape)
      except (TypeError, ValueError):
        head = None
      by_shape[shape] = 0.0 if head is None else float(
          keras_flops.head_flops(head, shape))
  return [by_shape[tuple(_boundary(crossing, end - 1)[0].shape)]
          for end in ends[:-1]] + [0.0]


def _cuts_from_split(split, layers, num_modules):
  """Layer indices (cut after) from counts per module or layer names."""
  split = list(split)
  names = [layer.name for layer in layers]
  if split and all(isinstance(s, str) for s in split):
    unknown = [s for s in split if s not in names]
    if unknown or len(split) != num_modules - 1:
      raise ValueError(
          f"split as layer names needs num_modules - 1 = {num_modules - 1} "
          f"names of the model's layers to cut after (unknown: {unknown}). "
          f"Received: split={split!r}")
    cuts = sorted(names.index(s) for s in split)
    if len(set(cuts)) != len(cuts) or cuts[-1] == len(layers) - 1:
      raise ValueError(f"split names each cut once and not the last layer. "
                       f"Received: split={split!r}")
    return cuts
  counts = partition.check_split(split, len(layers), num_modules)
  return list(np.cumsum(counts)[:-1] - 1)


def _describe(crossing):
  return ", ".join(f"{producer!r} -> {consumer!r}"
                   for _, producer, consumer in crossing)


def from_keras(model, num_modules, *, split=None, balance="flops",
               aux_head="linear", num_classes=None, sample=None,
               name=None):
  """Splits a Sequential or functional Keras model into K modules.

  Cuts go only where one floating-point tensor crosses (with any integer
  or boolean ones: masks, ids). With `split=None` the model is cut
  into blocks at such places, never between a layer and the
  normalisation, activation or merge that takes over its output, and with
  a nonlinearity in every block (`keras_blocks.block_ends`: in practice
  after each block's last activation); the blocks are dealt into K
  contiguous modules minimising the most expensive module
  (`partition.balanced_split`). `split=` may cut at any single-tensor place.

  Args:
    model: a built `keras.Sequential` (starting with `keras.Input`) or a
      functional `keras.Model` with one output and one input or several
      (a list or a dict); nested functional and Sequential models are
      looked into. Left unchanged.
    num_modules: K >= 1.
    split: optional explicit split: K layer counts (over `model.layers`
      without the InputLayer), or K - 1 layer names to cut after. A layer
      called several times (tied weights) counts once per call; its later
      calls are named `<name>_call2`, `<name>_call3`, ...
    balance: "flops" (each block's multiply-adds, `keras.flops`, plus those
      of the aux head a module ending there gets), "params" (parameter
      counts), or "time" (each block's measured forward time on `sample`,
      one block at a time).
    aux_head: a kind of `layers.aux_heads.KINDS`: "linear" ((pooling
      and) one dense layer; when the model's output is per position,
      [B, T, classes], LayerNormalization and a dense layer at every
      position, so each exit predicts every token), "authors" (conv 128
      -> conv 64 -> pool -> dense, image features only), "pool" (pool ->
      dense, image features only) or "none"; a callable
      `(k, feature_shape) -> keras layer` (k = 1..K-1); or None (no aux
      heads, as "none": only the "e2e" strategy can train such modules).
    num_classes: outputs of the aux heads; defaults to the last axis of the
      model's output.
    sample: a batch of inputs for balance="time"; defaults to 32 random
      normal examples.
    name: prefix of module names; defaults to the model's name.

  Returns:
    K unbuilt `InterlockModule`s. Each holds a snapshot of the model's
    weights, copied into the new layers when the module is first built.
    A layer called in several modules (tied weights, e.g. keras_hub's
    CausalLM heads) is a copy in each, listed in `body.tied_layers`; the
    trainer keeps the copies one weight (`tied_gradients`). For a keras_hub
    task model, the last module's `body.default_loss` is the loss the
    task's own `compile` picks when given none (`task_defaults`), and
    `body.compile_defaults` its optimizer, metrics and weighted metrics,
    which `InterlockModel.compile` uses for "auto".

  Raises:
    ValueError: in one line, e.g. naming a layer whose `get_config` fails
      (every piece is rebuilt from its layers' configs).
  """
  fit_checks.check_from_keras(model, num_modules, num_classes)
  num_classes = int_args.as_int(num_classes)
  _checked_graph(model)
  name = name or model.name
  # A keras_hub task's own defaults, for a compile that leaves them "auto".
  task_loss, task_compile = task_defaults.compile_defaults(model)
  # Nested functional and Sequential models are inlined, so that cuts may
  # go inside them (the transfer-learning idiom), and a layer called twice
  # (tied weights) becomes a copy per call, recorded in `ties`
  # (keras_flatten).
  source = model
  try:
    model, ties, sources = keras_flatten.flatten_with_sources(
        model, _layer_classes(model))
  except Exception as e:  # pylint: disable=broad-except
    _raise_if_a_config_fails(model, e)
    raise
  graph, layers, nodes = _graph(model)
  if balance not in BALANCE_MODES:
    raise ValueError(f"balance must be one of {BALANCE_MODES}. "
                     f"Received: balance={balance!r}")
  if not (aux_head is None or (callable(aux_head) and
                               not isinstance(aux_head, str))):
    aux_heads.check_kind(aux_head, also=", a callable or None")
  config = graph.get_config()
  crossing = _crossings(nodes, tf.nest.flatten(graph.inputs),
                        graph.outputs[0])
  # Integer and boolean tensors (masks, ids) ride along any boundary; one
  # floating-point tensor carries the gradient (`layers.boundary`).
  floats = [[c for c in cross if _is_float(c[0])] for cross in crossing]
  valid = [c for c in range(len(crossing)) if len(floats[c]) == 1]
  if split is not None:
    cuts = _cuts_from_split(split, layers, num_modules)
    for c in cuts:
      if len(floats[c]) != 1:
        raise ValueError(
            f"Cannot cut after layer {layers[c].name!r}: "
            f"{len(floats[c])} floating-point tensors cross there "
            f"({_describe(floats[c])}), e.g. a skip connection; a module "
            f"boundary carries one (and any integer or boolean tensors: "
            f"masks, ids). Layers one can cut after: "
            f"{[layers[v].name for v in valid]}. Received: split={split!r}")
  else:
    # Blocks: a layer with its normalisation and activation, each with a
    # nonlinearity (see keras_blocks).
    ends = keras_blocks.block_ends(layers, nodes, floats)
    starts = [0] + ends[:-1]
    if not 1 <= num_modules <= len(ends):
      raise ValueError(
          f"num_modules must be between 1 and {len(ends)}, the number of "
          f"blocks of model {model.name!r} (cut where one tensor crosses, "
          f"each with a nonlinearity; split= can force other cuts). "
          f"Received: num_modules={num_modules!r}")
    if balance == "time":
      pieces = [_segment_config(config, layers, a, b,
                                _boundary(crossing, a - 1),
                                _boundary(crossing, b - 1), f"t{i}")
                for i, (a, b) in enumerate(zip(starts, ends))]
      if sample is None:
        if len(tf.nest.flatten(graph.inputs)) != 1:
          raise ValueError(
              f"balance='time' on a model with several inputs needs "
              f"sample= (a batch of them). Received: sample=None")
        shape = tuple(graph.inputs[0].shape[1:])
        if None in shape:
          raise ValueError(
              f"balance='time' on a model whose input shape {shape} has an "
              f"unknown dimension needs sample= (a batch of inputs). "
              f"Received: sample=None")
        sample = tf.random.normal((32,) + shape)
      costs = _timed_costs(pieces, sample, _layer_classes(graph))
    else:
      per_layer = [_flops(layer, node) if balance == "flops"
                   else keras_nodes.count_params(layer)
                   for layer, node in zip(layers, nodes)]
      costs = [float(sum(per_layer[a:b])) for a, b in zip(starts, ends)]
    cut_costs = None
    if balance == "flops" and isinstance(aux_head, str):
      cut_costs = _aux_head_flops(
          _head_maker(graph, layers, aux_head, num_classes), crossing, ends)
    counts = partition.balanced_split(costs, num_modules,
                                      cut_costs=cut_costs)
    cuts = [ends[i] - 1 for i in np.cumsum(counts)[:-1] - 1]
  modules = _build_modules(graph, config, layers, crossing, cuts, aux_head,
                           num_classes, name, ties)
  keras_origins.record(modules, source, sources)
  modules[-1].body.default_loss = task_loss
  modules[-1].body.compile_defaults = task_compile
  return modules


def _is_float(tensor):
  return tf.as_dtype(tensor.dtype).is_floating


def _boundary(crossing, c):
  """The tensors crossing the cut after layer c, in boundary order: the
  floating-point one first (the aux head reads it, `layers.boundary`),
  then the masks and ids as they appear. None for c = -1 (the model's
  inputs) and for the end of the model (its output)."""
  if c < 0 or c >= len(crossing):
    return None
  tensors = [t for t, _, _ in crossing[c]]
  return ([t for t in tensors if _is_float(t)] +
          [t for t in tensors if not _is_float(t)])


def _build_modules(graph, config, layers, crossing, cuts, aux_head,
                   num_classes, name, ties):
  """One InterlockModule per run of layers between cuts.

  `ties` (`keras_flatten.flatten`) name the copies of each layer called
  more than once: the copies in one module become one layer again, and
  each module holding a copy of a tie that spans modules records it
  (`KerasSegment.tied_layers`) for the trainer.
  """
  bounds = list(zip([0] + [c + 1 for c in cuts], [c + 1 for c in cuts] +
                    [len(layers)]))
  merges, tied = keras_ties.in_pieces(
      ties, [[layer.name for layer in layers[a:b]] for a, b in bounds])
  make_head = _head_maker(graph, layers, aux_head, num_classes)
  modules = []
  for k, (start, stop) in enumerate(bounds, start=1):
    piece = _segment_config(config, layers, start, stop,
                            _boundary(crossing, start - 1),
                            _boundary(crossing, stop - 1),
                            f"{name}_piece{k}")
    merged = set()
    for names in merges[k - 1]:
      piece = keras_ties.merge(piece, names)
      merged.update(names[1:])
    # Raw keras.Operation nodes hold no state; every Layer brings its whole
    # state (load hooks, lookup tables, trainable at every depth).
    stateful = [layer for layer in layers[start:stop]
                if isinstance(layer, keras.layers.Layer) and
                layer.name not in merged]
    piece = layer_state.with_vocabularies(piece, stateful)
    weights = {layer.name: layer_state.snapshot(layer) for layer in stateful}
    body = KerasSegment(piece, weights, _layer_classes(graph),
                        tied_layers=tied[k - 1], name=f"{name}_segment{k}")
    head = None
    if k < len(bounds) and aux_head is not None:
      head = make_head(k, tuple(_boundary(crossing, stop - 1)[0].shape))
    modules.append(InterlockModule(body, aux_head=head,
                                   name=f"{name}_module{k}"))
  return modules
