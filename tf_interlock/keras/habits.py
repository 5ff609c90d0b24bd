"""What a Keras user reaches for first, on an `InterlockModel`.

* `model.get_layer(name)` with the name of a layer of the model given to
  `from_keras`: that layer lives inside module k's piece (re-created on
  module k's device), not at the model's top level, where Keras looks.
  `find_layer` looks in every module's body and aux head.
* `model.export(dir)`: Keras's own export traces `model.call` over one
  input signature, which cannot serve every exit; `check_export` accepts
  the arguments that mean "the SavedModel", which `export_saved_model`
  then writes (one signature per exit, `serving_default` the network's),
  and refuses others in one line that names `export_saved_model`.
"""

import keras

_SAVED_MODEL_FORMATS = ("tf_saved_model", "saved_model")


def _inner_layers(body):
  """The top-level layers a built body holds (a `from_keras` piece's are
  the original model's), or None before its build."""
  model = getattr(body, "model", body)
  if model is None or (isinstance(model, keras.Model) and not model.built):
    return None
  if not isinstance(model, keras.Model):
    return [model]
  return [layer for layer in model.layers
          if not isinstance(layer, keras.layers.InputLayer)]


def find_layer(modules, name):
  """The layer called `name` in a module's body or an aux head.

  Args:
    modules: the K `InterlockModule`s.
    name: a layer name of the original model (or an aux head's name).

  Returns:
    The layer.

  Raises:
    ValueError: when the module holding it is not built yet, or no module
      holds a layer of that name (the message lists the names there are).
  """
  names = []
  for k, module in enumerate(modules, start=1):
    if module.aux_head is not None:
      if module.aux_head.name == name:
        return module.aux_head
      names.append(module.aux_head.name)
    layers = _inner_layers(module.body)
    if layers is None:
      if name in module.layer_names:
        raise ValueError(
            f"Layer {name!r} is in module {k}, which is built on its device "
            f"with the model: build or fit the model before get_layer. "
            f"Received: name={name!r}")
      names.extend(module.layer_names)
      continue
    for layer in layers:
      if layer.name == name:
        return layer
    names.extend(layer.name for layer in layers)
  raise ValueError(
      f"No such layer: {name}. The modules are "
      f"{[module.name for module in modules]} and hold {names}. "
      f"Received: name={name!r}")


def check_export(format, input_signature, kwargs):  # pylint: disable=redefined-builtin
  """Refuses, in one line, what `model.export` cannot write for us."""
  if (format not in _SAVED_MODEL_FORMATS or input_signature is not None or
      kwargs):
    raise ValueError(
        f"InterlockModel.export writes export_saved_model's SavedModel "
        f"(format='tf_saved_model', no input_signature: the built input "
        f"shape, one signature per exit); call "
        f"model.export_saved_model(dir) for the SavedModel alone. Received: "
        f"format={format!r}, input_signature={input_signature!r}, "
        f"other arguments={sorted(kwargs)}")
