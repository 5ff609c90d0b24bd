"""Where each layer of a split came from in the user's model, and back.

`from_keras` inlines nested models (`keras_flatten`) and re-creates every
piece on its module's device, so after the split the user's model is no
longer what trains: a nested base such as keras.io's
`keras.applications.MobileNetV2(include_top=False)` is spread over several
modules, and the model given to `from_keras` keeps its pre-training
weights. Each piece therefore records, for each of its layers, the path of
names that leads to it in the user's model (`["mobilenetv2_0.35_96",
"Conv1"]`), saved with the piece's config. From that:

* `nested_model(modules, name)`: the layers of nested model `name`, in
  whichever modules they landed, as one `NestedModel` whose `trainable`
  sets all of them (keras.io's phase 2, `base_model.trainable = True`);
* `give_back(modules)`: the user's model (or, after a reload, one rebuilt
  from its saved config) with the trained state of every layer written in:
  weights, BatchNormalization statistics and `trainable` flags, so that its
  own methods (a keras_hub task's `generate()`, `save()`) serve the
  trained network.
"""

import json

import keras

from tf_interlock.keras import nodes as keras_nodes
from tf_interlock import keras_private
from tf_interlock.keras import layer_state


def _nested_graph(operation):
  if not isinstance(operation, keras.Model):
    return None
  return keras_private.functional_graph(operation)


def _paths(model, prefix=()):
  """{id(layer): [names from `model` down to it]} of every layer of
  `model`'s graph, nested models looked into as `keras_flatten` does."""
  paths = {}
  for op in keras_private.functional_graph(model).operations:
    if isinstance(op, keras.layers.InputLayer):
      continue
    if _nested_graph(op) is not None:
      paths.update(_paths(op, prefix + (op.name,)))
    else:
      paths.setdefault(id(op), list(prefix + (op.name,)))
  return paths


def _source_config(model):
  """`model`'s serialized config as plain JSON values, or None when it has
  none (a config that JSON cannot hold)."""
  try:
    return json.loads(json.dumps(keras.saving.serialize_keras_object(model)))
  except Exception:  # pylint: disable=broad-except
    # Splitting must not fail on it: only to_keras after a reload needs it,
    # and says so in one line.
    return None


def record(modules, source, sources):
  """Gives every piece of `modules` its layers' paths in `source`.

  Args:
    modules: `from_keras`'s modules (bodies are `KerasSegment`s).
    source: the model given to `from_keras`.
    sources: `keras_flatten.flatten_with_sources`'s {flat name: the layer
      of `source`, at any depth, it stands for}.
  """
  paths = _paths(source)
  config = _source_config(source)
  for k, module in enumerate(modules):
    found = {}
    for name in module.body.layer_names:
      layer = sources.get(name)
      if keras_nodes.is_layer(layer) and id(layer) in paths:
        found[name] = paths[id(layer)]
    origins = {"paths": found}
    if k == 0:
      # Once: what `give_back` rebuilds the user's model from after a
      # reload, when the model object itself is gone.
      origins["source"] = config
    module.body.set_origins(origins, source)


def _paths_of(module):
  return getattr(module.body, "origins", {}).get("paths", {})


def _built_layers(k, module, names, what):
  model = getattr(module.body, "model", None)
  if model is None:
    raise ValueError(
        f"{what} has layers in module {k + 1}, which is built on its device "
        f"with the model: build or fit the model first. Received: "
        f"built=False")
  return [model.get_layer(n) for n in names]


class NestedModel:
  """A nested model of the model given to `from_keras`, after the split.

  Its layers may be spread over several modules; this object stands for
  all of them, as the nested model did (`get_layer(its name)`).

  Attributes:
    name: the nested model's name.
    layers: its layers (re-created in their modules), in depth order.
    modules: the module numbers (1-based) that hold them.
  """

  def __init__(self, name, layers, modules):
    self.name = name
    self.layers = layers
    self.modules = modules

  @property
  def trainable(self):
    """True when any of its layers trains (keras.io's fine-tuning freezes
    the lower layers of a trainable base)."""
    return any(layer.trainable for layer in self.layers)

  @trainable.setter
  def trainable(self, value):
    # Keras's `model.trainable = value`: every layer at every depth; as in
    # Keras, compile again for fit to see it.
    for layer in self.layers:
      layer.trainable = value

  def _unique(self, attribute):
    found = {}
    for layer in self.layers:
      for weight in getattr(layer, attribute):
        found.setdefault(id(weight), weight)
    return list(found.values())

  @property
  def weights(self):
    return self._unique("weights")

  @property
  def trainable_weights(self):
    return self._unique("trainable_weights")

  @property
  def non_trainable_weights(self):
    return self._unique("non_trainable_weights")

  def count_params(self):
    return sum(int(w.shape.num_elements()) for w in self.weights)

  def summary(self, print_fn=None):
    """Prints each layer, its module and whether it trains."""
    print_fn = print_fn or print
    print_fn(f'Nested model "{self.name}": {len(self.layers)} layers in '
             f"modules {self.modules}, {self.count_params():,} params")
    for layer in self.layers:
      print_fn(f"  {layer.name}  trainable={layer.trainable}")

  def __repr__(self):
    return (f"<NestedModel name={self.name!r} layers={len(self.layers)} "
            f"modules={self.modules}>")


def nested_names(modules):
  """{nested model name: [(module index, [its layer names there])]}, in
  depth order, of every nested model the pieces' layers came from."""
  found = {}
  for k, module in enumerate(modules):
    for name, path in _paths_of(module).items():
      for container in path[:-1]:
        places = found.setdefault(container, [])
        if not places or places[-1][0] != k:
          places.append((k, []))
        places[-1][1].append(name)
  return found


def nested_model(modules, name):
  """The `NestedModel` called `name`, or None when no layer came from a
  nested model of that name (or a layer of the pieces has that name).

  Raises:
    ValueError: when a module holding its layers is not built yet.
  """
  places = nested_names(modules).get(name)
  if places is None or any(name in m.layer_names for m in modules):
    return None  # A layer of that name comes first, as before.
  layers = []
  for k, names in places:
    layers += _built_layers(k, modules[k], names,
                            f"Nested model {name!r}")
  return NestedModel(name, layers, [k + 1 for k, _ in places])


def summary_lines(modules):
  """One line per nested model, for `InterlockModel.summary`."""
  lines = []
  for name, places in nested_names(modules).items():
    count = sum(len(names) for _, names in places)
    where = sorted({k + 1 for k, _ in places})
    span = (f"module {where[0]}" if len(where) == 1 else
            f"modules {where[0]}-{where[-1]}")
    try:
      view = nested_model(modules, name)
      trains = sum(layer.trainable for layer in view.layers)
      state = f", {trains} of them trainable"
    except ValueError:
      state = ""
    lines.append(f'Nested model "{name}": {count} layers in {span}{state} '
                 f'(get_layer("{name}"))')
  return lines


def _child(model, name):
  for op in keras_private.functional_graph(model).operations:
    if op.name == name:
      return op
  raise ValueError(
      f"The model to give back has no layer {name!r} in {model.name!r} "
      f"(its config differs from the model given to from_keras). "
      f"Received: name={name!r}")


def _resolve(model, path):
  for name in path:
    model = _child(model, name)
  return model


def give_back(modules):
  """The model given to `from_keras`, with the modules' state written in.

  The user's model object itself while it is alive in this process (the
  split model was made from it); otherwise (after `load_model` or a clone)
  a new one from its config saved with the modules.

  Args:
    modules: built `from_keras` modules.

  Returns:
    The Keras model.

  Raises:
    ValueError: for modules not made by `from_keras`, or when the user's
      model is gone and its config could not be saved.
  """
  first = modules[0].body
  if not hasattr(first, "source_model") or not _paths_of(modules[0]):
    raise ValueError(
        f"to_keras gives back the model given to from_keras; these modules "
        f"were not made by from_keras. Received: "
        f"body={type(first).__name__}")
  target = first.source_model()
  if target is None:
    config = first.origins.get("source")
    if config is None:
      raise ValueError(
          "to_keras: the model given to from_keras is gone (the split model "
          "was reloaded or cloned) and its config could not be saved. "
          "Received: source=None")
    try:
      target = keras.saving.deserialize_keras_object(config)
    except (TypeError, ValueError) as e:
      # Keras finds a class by its registered name, as for load_model.
      raise ValueError(
          f"to_keras: the model given to from_keras is gone (the split "
          f"model was reloaded or cloned) and rebuilding it from its saved "
          f"config failed; register your layer classes "
          f"(@keras.saving.register_keras_serializable()) or call to_keras "
          f"under keras.saving.custom_object_scope. Received: "
          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
      ) from e
  pieces = {}
  for k, module in enumerate(modules):
    paths = _paths_of(module)
    names = [n for n in module.body.layer_names if n in paths]
    for name, layer in zip(names, _built_layers(k, module, names,
                                                "The model")):
      # A tied layer's copies are equal: the first one is the layer.
      pieces.setdefault(tuple(paths[name]), layer)
  # A nested model trains when any of its layers does (Keras gives a
  # frozen model no trainable weights, whatever its layers' flags); outer
  # first, as setting a model's flag sets its layers', which are then set
  # one by one.
  containers = sorted({path[:i] for path in pieces
                       for i in range(1, len(path))}, key=len)
  for container in containers:
    _resolve(target, container).trainable = any(
        layer.trainable for path, layer in pieces.items()
        if path[:len(container)] == container)
  for path, layer in pieces.items():
    layer_state.restore(_resolve(target, path), layer_state.snapshot(layer))
  return target
