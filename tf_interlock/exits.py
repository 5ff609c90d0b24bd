"""Every exit of a stack of interlocking modules, from one forward pass.

An interlocking network (Gomez et al., 2022, arXiv:2010.04116) computes
h_0 = x, h_k = M_k(h_{k-1}) for k = 1..K. Each module k < K with an
auxiliary head A_k has an *exit*: the logits A_k(h_k), a classifier in its
own right. The last module ends with the network's own output head, so its
exit is the final classifier and its logits are h_K itself.

`exits` is the one forward pass over modules that inference, evaluation,
export, building and probing share: it yields, per module, h_k and its exit
logits. (The training step's forward lives in `tf_interlock.engine`, which
also routes gradients between modules.) Exit k is named by the module that
owns it, "module_{k}" (`metric_names.module_name(k - 1)`), the name its
training metrics carry too.
"""

import contextlib
from typing import Any, NamedTuple, Optional

import keras


class Exit(NamedTuple):
  """One module's output and its exit's logits.

  Attributes:
    index: the module's 0-based index k - 1.
    outputs: h_k, the module's output.
    logits: the exit's logits, A_k(h_k) for k < K and h_K for the last
      module; None when module k < K has no aux head or its logits were not
      asked for.
  """
  index: int
  outputs: Any
  logits: Optional[Any]


def is_exit(modules, index):
  """True if the module with 0-based `index` has an exit (logits)."""
  return index == len(modules) - 1 or modules[index].has_aux_head


def exit_indices(modules):
  """1-based indices k of the modules whose aux head is an early exit.

  Args:
    modules: the K `InterlockModule`s, in depth order.

  Returns:
    The sorted k < K whose module has an aux head. Module K's output is the
    final logits, so an aux head on it is not an exit.
  """
  return [k for k in range(1, len(modules)) if modules[k - 1].has_aux_head]


def exits(modules, inputs, *, training=False, scope=None, heads=None):
  """Runs the modules once over `inputs`, yielding every module's `Exit`.

  A generator: a caller that stops after exit k never runs modules > k.
  Each module is called as a Keras layer, h_k = M_k(stop_gradient(h_{k-1}))
  (which also builds it on first use), and its head reads h_k.

  Args:
    modules: the K `InterlockModule`s, in depth order.
    inputs: the network input h_0.
    training: Python bool, passed to every body and head.
    scope: None, or a callable `index -> context manager` entered around
      module `index`'s forward and head (e.g. `Placement.scope`).
    heads: None to compute every exit's logits; else the collection of
      0-based indices whose logits to compute (the others get None).

  Yields:
    `Exit(index, outputs, logits)` for index = 0..K-1.
  """
  modules = list(modules)
  h = inputs
  for index, module in enumerate(modules):
    with scope(index) if scope is not None else contextlib.nullcontext():
      h = module(h, training=training)
      logits = None
      if is_exit(modules, index) and (heads is None or index in heads):
        last = index == len(modules) - 1
        logits = h if last else module.aux_logits(h, training=training)
    yield Exit(index, h, logits)


def exit_logits(modules, inputs, k=None, **kwargs):
  """The logits of exit k alone: modules 1..k, then A_k (or the network).

  Args:
    modules: the K `InterlockModule`s, in depth order.
    inputs: the network input.
    k: 1-based module index of an exit; None for the network's output (K).
    **kwargs: `training` and `scope`, as for `exits`.

  Returns:
    The exit's logits.
  """
  index = len(modules) - 1 if k is None else k - 1
  for found in exits(modules, inputs, heads=(index,), **kwargs):
    if found.index == index:
      if found.logits is None:
        raise ValueError(f"Module {k} has no aux head, so no exit. "
                         f"Received: k={k!r}")
      return found.logits
  raise ValueError(f"k must be in 1..{len(modules)}. Received: k={k!r}")


def build(modules, inputs, **kwargs):
  """Builds every module and aux head by one forward pass over `inputs`.

  Args:
    modules: the K `InterlockModule`s, in depth order.
    inputs: a sample network input (any batch size).
    **kwargs: `scope`, as for `exits`.

  Returns:
    h_K, the network's output on `inputs`.
  """
  for found in exits(modules, inputs, training=False, **kwargs):
    h = found.outputs
  return h


def functional_graph(modules, input_shape, dtype="float32", name=None):
  """The built modules as one functional `keras.Model`, for drawing.

  Input -> module 1's layers -> ... -> module K's layers, with one output
  per exit: A_k(h_k) for every module k < K with an aux head, then h_K. A
  `from_keras` piece enters as its own functional model, an aux head as
  itself, so `keras.utils.plot_model(graph, expand_nested=True)` draws
  every module's layers and every head. The model shares the modules'
  built layers (no new weights) and has no cuts: it is for looking at, not
  for training.

  Args:
    modules: the K built `InterlockModule`s, in depth order.
    input_shape: the network input's shape, batch axis first.
    dtype: the input's dtype.
    name: the model's name.

  Returns:
    A `keras.Model`.
  """
  inputs = keras.Input(tuple(input_shape)[1:], dtype=dtype, name="inputs")
  h, outputs = inputs, []
  for index, module in enumerate(modules):
    body = getattr(module.body, "model", None) or module.body
    h = body(h)
    if index < len(modules) - 1 and module.has_aux_head:
      outputs.append(module.aux_head(h))
  return keras.Model(inputs, outputs + [h], name=name)
