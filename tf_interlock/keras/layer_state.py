"""All of a layer's state, carried from a user's layer to its re-created copy.

`from_keras` re-creates each piece of the user's model from its config, on
module k's device, then brings the source layers' state in. Weights alone
(`get_weights`/`set_weights`) are not all of it:

* an adapted `Normalization` keeps its statistics in non-trainable
  variables, but `call` reads tensors that only its load hook
  (`load_own_variables` -> `finalize_state`) recomputes from them;
* an adapted `StringLookup`/`IntegerLookup`/`TextVectorization` keeps its
  vocabulary in a lookup table, which is no variable: Keras saves it as an
  asset (`save_assets`/`load_assets`);
* `trainable` is part of a layer's config at the top level only: a
  `MultiHeadAttention` or a user's layer frozen before the split would come
  back with its sublayers (created afresh in `build`) trainable, so its
  weights would train while its own `.trainable` still read False. Keras's
  `clone_model` loses this too.

So the state is taken the way `model.save` takes it (every nested layer's
save hooks, `keras_private.save_layer_state`) and put back the way
`load_model` does (every load hook), and every layer's `trainable` flag is
recorded at every depth and set again in the same order.

An adapted vocabulary is also written into the piece's config
(`with_vocabularies`), as Keras keeps a vocabulary given to the layer's
constructor: a lookup whose table is empty cannot even be called, and
`InterlockModel` builds (also when `load_model` rebuilds it, before any
asset is loaded) by calling its modules once.
"""

from typing import Any, List, NamedTuple, Tuple

import keras
import numpy as np

from tf_interlock import keras_private

_LOOKUPS = (keras.layers.StringLookup, keras.layers.IntegerLookup,
            keras.layers.TextVectorization)


class LayerState(NamedTuple):
  """One source layer's state.

  Attributes:
    saved: `keras_private.save_layer_state`'s (weights, assets).
    trainable: (class name, trainable) of the layer, then of each nested
      layer in Keras's own order (`keras_private.flatten_layers`).
  """
  saved: Any
  trainable: List[Tuple[str, bool]]


def _with_nested(layer):
  return [layer] + keras_private.flatten_layers(layer)


def snapshot(layer):
  """The state of a built `layer`, held in memory (numpy and bytes)."""
  return LayerState(
      keras_private.save_layer_state(layer),
      [(type(inner).__name__, bool(inner.trainable))
       for inner in _with_nested(layer)])


def restore(layer, state):
  """Puts `snapshot`'s state into `layer`, built from the same config.

  Raises:
    ValueError: when `layer` does not hold the same nested layers (a
      layer whose sublayers depend on more than its config).
  """
  keras_private.load_layer_state(layer, state.saved)
  nested = _with_nested(layer)
  classes = [type(inner).__name__ for inner in nested]
  if classes != [name for name, _ in state.trainable]:
    raise ValueError(
        f"Layer {layer.name!r} re-created from its config holds other "
        f"nested layers than the original, so which are frozen cannot be "
        f"carried over. Received: original={[n for n, _ in state.trainable]}"
        f", re-created={classes}")
  _set_flags(nested, [trainable for _, trainable in state.trainable])


def _set_flags(nested, flags):
  # Outer layers first: setting a layer's `trainable` sets its sublayers',
  # and each sublayer then gets its own recorded flag back.
  for inner, trainable in zip(nested, flags):
    if inner.trainable != trainable:
      inner.trainable = trainable


def _piece_layers(model):
  return [layer for layer in model.layers
          if not isinstance(layer, keras.layers.InputLayer)]


def trainable_flags(model):
  """[[layer name, [its `trainable`, then each nested layer's]], ...] of
  the layers of a functional `model` (a piece) in its order, as the user
  has set them now.

  A layer's config records its own flag only, and only as it was when the
  config was taken; this records every depth, so that flags changed after
  the split (keras.io's fine-tuning: unfreeze, recompile, fit) survive a
  save, a reload and a clone.
  """
  return [[layer.name, [bool(inner.trainable) for inner in
                        _with_nested(layer)]]
          for layer in _piece_layers(model)]


def set_trainable_flags(model, flags):
  """Sets `trainable_flags`'s flags on `model`'s layers, built from the
  same config: matched by position (the name is for reading; a layer
  renamed after the split still gets its own flags).

  Raises:
    ValueError: when `model` holds other layers than recorded.
  """
  layers = _piece_layers(model)
  if not flags:
    return
  sizes = [len(_with_nested(layer)) for layer in layers]
  if sizes != [len(recorded) for _, recorded in flags]:
    raise ValueError(
        f"Piece {model.name!r} re-created from its config holds other "
        f"layers than its recorded trainable flags. Received: "
        f"flags={flags}, layers={[layer.name for layer in layers]}")
  for layer, (_, recorded) in zip(layers, flags):
    _set_flags(_with_nested(layer), recorded)


def _adapted_vocabularies(layers):
  """{name: vocabulary} of each adapted lookup in `layers`, nested ones too.

  A lookup given its vocabulary (in its config already), one never adapted
  and one in "tf_idf" mode (whose weights are variables, restored with the
  rest) are left out.
  """
  found = {}
  for layer in layers:
    for inner in [layer] + keras_private.flatten_layers(layer):
      config = inner.get_config() if isinstance(inner, _LOOKUPS) else {}
      if (config and config.get("vocabulary") is None and
          config.get("output_mode") != "tf_idf" and
          inner.get_vocabulary(include_special_tokens=False)):
        # Plain Python values: the piece's config is kept as JSON.
        found[inner.name] = np.asarray(inner.get_vocabulary()).tolist()
  return found


def with_vocabularies(config, layers):
  """A piece's functional `config` with the adapted vocabularies of
  `layers` (its source layers) written into their lookups' configs."""
  found = _adapted_vocabularies(layers)
  names = {cls.__name__ for cls in _LOOKUPS}

  def walk(value):
    if isinstance(value, dict):
      inner = value.get("config")
      if (value.get("class_name") in names and isinstance(inner, dict) and
          inner.get("name") in found):
        return dict(value, config=dict(inner,
                                       vocabulary=found[inner["name"]]))
      return {key: walk(v) for key, v in value.items()}
    if isinstance(value, list):
      return [walk(v) for v in value]
    return value
  return walk(config) if found else config
