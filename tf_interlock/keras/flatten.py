"""Nested Keras models, inlined so that `from_keras` can cut inside them.

The transfer-learning idiom builds a model around another one:

    base = keras.applications.MobileNetV2(weights=None, include_top=False)
    x = base(inputs)
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))

The outer graph then holds `base` as one node, and a cut could only go
before or after the whole of it. `flatten` returns an equal functional model
whose graph holds the nested models' own layers and operations in their
place (recursively), so that depthwise modules may split the base itself.

It works on configs: the nested model's config is spliced into the outer
one, its InputLayers replaced by the tensors that fed it and the outer
references to its outputs pointed at the tensors that made them. A fresh
model is built from that config and the source weights (moving statistics
included) are copied in, so the user's model is only read.

As in Keras 3's functional call, a training flag given to the outer model
reaches every inner layer (Keras passes the caller's `training` over a
nested call's own `training=False`), so the inlined graph trains the same
layers the nested one does. Frozen layers stay frozen: each inner layer's
config carries its own `trainable`.

A layer called more than once (tied weights: an input embedding reused as
the output head) is made one layer per call here, each a copy holding the
same weights, and `flatten` says which copies are one layer; `keras_split`
merges the copies that land in one module again (`keras_ties`).
"""

import keras

from tf_interlock.keras import nodes as keras_nodes
from tf_interlock import keras_private
from tf_interlock.keras import ties as keras_ties
from tf_interlock.keras import layer_state


def _nested_graph(operation):
  """The layer graph of a nested functional or Sequential model, or None."""
  if not isinstance(operation, keras.Model):
    return None
  return keras_private.functional_graph(operation)


def _calls(graph, operation):
  """How many times `graph` calls `operation`."""
  return sum(keras_private.node_in_graph(graph, operation, i)
             for i in range(len(keras_private.inbound_nodes(operation))))


def needs_flattening(model):
  """Whether `model`'s graph holds a functional or Sequential model, or a
  layer called more than once (tied weights)."""
  graph = keras_private.functional_graph(model)
  return graph is not None and any(
      _nested_graph(op) is not None or _calls(graph, op) > 1
      for op in graph.operations)


def _graph_config(graph):
  """The functional config (layers and their calls) of a `Functional`.

  A subclass with its own constructor (every keras_hub `Backbone`) gives
  its constructor's arguments as `get_config`; a plain functional model
  over the same tensors (no layer is called again, so no node is added)
  gives the layer graph.
  """
  config = graph.get_config()
  if "layers" in config:
    return config
  return keras.Model(graph.input, graph.output, name=graph.name).get_config()


def tensor_refs(refs):
  """[name, node, tensor] triples of a config's input or output layers.

  Keras writes one tensor flat, several as a list and named ones as a dict,
  whose tensors a model's outputs number in sorted key order (as
  `keras.tree.flatten` does).
  """
  if isinstance(refs, dict):
    return [list(refs[key]) for key in sorted(refs)]
  return [list(refs)] if isinstance(refs[0], str) else [list(r) for r in refs]


def _call_tensors(args):
  """The keras_history of each tensor a node was called with, in order."""
  found = []
  if isinstance(args, dict):
    if args.get("class_name") == "__keras_tensor__":
      return [list(args["config"]["keras_history"])]
    for v in args.values():
      found += _call_tensors(v)
  elif isinstance(args, (list, tuple)):
    for v in args:
      found += _call_tensors(v)
  return found


def _renamed(entries, rename):
  """Inner layer entries with names (and references to them) renamed."""
  def history(h):
    return [rename.get(h[0], h[0])] + h[1:]
  out = []
  for entry in keras_ties.map_histories(entries, history):
    new = rename.get(entry["name"], entry["name"])
    if new != entry["name"]:
      entry = dict(entry, name=new,
                   config=dict(entry["config"], name=new))
    out.append(entry)
  return out


def _inline(graph, taken):
  """(config, sources) of `graph` with every nested model inlined.

  Args:
    graph: a `Functional`.
    taken: names already used in the outer graph; inner names that clash
      get the nested model's name as a prefix. Updated in place.

  Returns:
    The flat functional config, each layer called once, and {name in it:
    the source layer or operation}, for copying weights (a layer called
    several times is the source of each of its copies).
  """
  config = _graph_config(graph)
  operations = {op.name: op for op in graph.operations}
  taken.update(entry["name"] for entry in config["layers"])
  # A layer called again (a tie) gets a copy per further call, so that a
  # cut may go between the calls (`keras_ties`).
  config, copies = keras_ties.untie(
      config, {name for name, op in operations.items()
               if _nested_graph(op) is not None}, taken)
  entries, sources, redirect = [], {}, {}
  for entry in config["layers"]:
    operation = operations[copies.get(entry["name"], entry["name"])]
    inner = _nested_graph(operation)
    if inner is None:
      entries.append(entry)
      sources[entry["name"]] = operation
      continue
    calls = entry["inbound_nodes"]
    if len(calls) != 1:
      raise ValueError(
          f"Nested model {operation.name!r} is called {len(calls)} times in "
          f"model {graph.name!r}; from_keras inlines a nested model called "
          f"once. Received: model={graph.name!r}")
    inner_config, inner_sources = _inline(inner, set())
    clash = {e["name"] for e in inner_config["layers"]} & taken
    rename = {n: keras_ties.unique_name(f"{operation.name}_{n}", taken)
              for n in clash}
    taken.update(e["name"] for e in inner_config["layers"])
    inner_entries = _renamed(inner_config["layers"], rename)
    inputs = [[rename.get(r[0], r[0])] + r[1:]
              for r in tensor_refs(inner_config["input_layers"])]
    outputs = [[rename.get(r[0], r[0])] + r[1:]
               for r in tensor_refs(inner_config["output_layers"])]
    fed = _call_tensors(calls[0]["args"])
    called_with = calls[0]["args"][0] if calls[0]["args"] else None
    if (isinstance(inner_config["input_layers"], dict) and
        isinstance(called_with, dict) and
        set(called_with) == set(inner_config["input_layers"])):
      # A dict of inputs is matched by key, whatever the caller's order.
      fed = [_call_tensors(called_with[key])[0]
             for key in sorted(called_with)]
    elif len(fed) != len(inputs):
      raise ValueError(
          f"Nested model {operation.name!r} has {len(inputs)} inputs but is "
          f"called with {len(fed)} tensors; from_keras cannot inline it. "
          f"Received: model={graph.name!r}")
    feeds = {r[0]: f for r, f in zip(inputs, fed)}
    inner_entries = [e for e in inner_entries if e["name"] not in feeds]
    entries += keras_ties.map_histories(inner_entries,
                                        lambda h, m=feeds: m.get(h[0], h))
    for i, out in enumerate(outputs):
      redirect[(operation.name, i)] = feeds.get(out[0], out)
    for name, source in inner_sources.items():
      sources[rename.get(name, name)] = source

  def follow(h):
    # A nested output that is a tensor fed to it leads on to its producer.
    while (h[0], h[2]) in redirect:
      h = list(redirect[(h[0], h[2])])
    return h
  config = dict(config, layers=keras_ties.map_histories(entries, follow))
  config["output_layers"] = keras_ties.map_refs(config["output_layers"],
                                                follow)
  return config, sources


def flatten(model, custom_objects):
  """`flatten_with_sources` without the sources: (flat, ties)."""
  flat, ties, _ = flatten_with_sources(model, custom_objects)
  return flat, ties


def flatten_with_sources(model, custom_objects):
  """`model`, or an equal functional model with each layer called once.

  Nested models are inlined, and each further call of a layer becomes the
  call of a copy (`keras_ties.untie`).

  Args:
    model: a built Sequential or functional `keras.Model`.
    custom_objects: {class name: class} of the model's own layer classes
      (as `keras.models.clone_model` finds them, without registration).

  Returns:
    (flat, ties): `model` itself and [] when `needs_flattening` is False;
    otherwise a new functional model, same inputs and outputs, whose layers
    hold copies of the source weights, and the names of its layers that
    are one weighted layer of `model` (`keras_ties.groups`). Then
    {name of a layer or operation of flat: the one of `model`, at any
    depth, that it stands for} (`keras_origins` maps them back).
  """
  if not needs_flattening(model):
    graph = keras_private.functional_graph(model)
    return model, [], {op.name: op for op in graph.operations}
  graph = keras_private.functional_graph(model)
  config, sources = _inline(graph, set())
  ties = keras_ties.groups(sources, lambda s: bool(keras_nodes.weights(s)))
  config = layer_state.with_vocabularies(
      config, [s for s in sources.values() if keras_nodes.is_layer(s)])
  flat = keras.Model.from_config(config, custom_objects=custom_objects)
  # The whole state, not only get_weights(): adapted preprocessing and
  # trainable flags at every depth come through as in keras_split.
  for name, source in sources.items():
    if (keras_nodes.is_layer(source) and
        not isinstance(source, keras.layers.InputLayer)):
      layer_state.restore(flat.get_layer(name), layer_state.snapshot(source))
  return flat, ties, sources
