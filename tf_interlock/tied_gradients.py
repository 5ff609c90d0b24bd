"""Tied weights in training: one weight held as a copy by several modules.

A layer called in two modules (keras_hub's CausalLM heads reuse the token
embedding, `reverse=True`) is split by `from_keras` into one copy per
module, each on its module's device (`keras_ties`). The copies are one
weight (docs/method.md, "Tied weights"):

* each copy's gradient is computed by its own module's rule, i.e. from the
  losses in that module's window (under local learning the embedding copy
  in module 1 by L_1, the head copy in module K by L_K);
* the copies' gradients are summed, once, on the first copy's device;
* every copy's module applies that sum with its own optimizer. The
  optimizers of a tie's modules have the same configuration and step
  together, so every copy, and every slot (momentum, Adam's moments), gets
  the same update from the same inputs: the copies stay bit-equal.

End-to-end, the sum is what automatic differentiation gives the one weight
of the unsplit model, so e2e training with a tie equals plain Keras.

A tie costs a dependency: the update of every module holding a copy waits
for the gradients of every other copy's module in the same step (module 1
then waits for module K, as end-to-end), and the summed gradient crosses
the devices once each way.
"""

import tensorflow as tf


def _total(values):
  """The sum of one weight's gradients. Embedding lookups give
  IndexedSlices: when every one does, their rows are kept (repeated
  indices sum when an optimizer densifies them); otherwise dense."""
  if all(isinstance(v, tf.IndexedSlices) for v in values):
    return tf.IndexedSlices(tf.concat([v.values for v in values], 0),
                            tf.concat([v.indices for v in values], 0),
                            values[0].dense_shape)
  return tf.add_n([tf.convert_to_tensor(v) for v in values])


def _describe(key, members):
  return f"tie {key!r} in modules {[k + 1 for k, _ in members]}"


def _inner(optimizer):
  return getattr(optimizer, "inner_optimizer", optimizer)


class TiedGradients:
  """Sums each tie's gradients over the modules that hold a copy.

  Args:
    modules: the K `InterlockModule`s, built. A body with `tied_layers`
      ({layer name: tie key}, `keras_split.KerasSegment`) holds copies.
    variables: per module, its trainable variables in gradient order
      (`InterlockTrainer.variables`).
    optimizers: the K module optimizers, built.
    loss_scaled: whether modules scale their losses (mixed_float16).

  Raises:
    ValueError: for a tie that the modules cannot keep equal: under loss
      scaling, frozen in some modules only, with state updated in training
      (moving statistics), or with optimizers configured differently or
      clipping by a global norm.
  """

  def __init__(self, modules, variables, optimizers, loss_scaled):
    found = {}
    for k, module in enumerate(modules):
      for name, key in getattr(module.body, "tied_layers", {}).items():
        found.setdefault(key, []).append(
            (k, module.body.model.get_layer(name)))
    # Per tie: [(module, positions of the copy's variables in its list)].
    self.groups = []
    for key, members in found.items():
      self.groups.extend(self._checked(key, members, variables, optimizers,
                                       loss_scaled))

  @property
  def modules(self):
    """Per tie that trains, the 0-based modules holding a copy."""
    return [tuple(k for k, _ in members) for members in self.groups]

  @staticmethod
  def _checked(key, members, variables, optimizers, loss_scaled):
    """[(module, positions)] of one tie, or [] when no copy trains."""
    where = _describe(key, members)
    if loss_scaled:
      raise ValueError(
          f"Tied weights cannot train under loss scaling (mixed_float16): "
          f"each module scales its gradients and skips steps by its own "
          f"scale, so the copies would drift apart; use mixed_bfloat16 or "
          f"float32. Received: {where}")
    positions = []
    for k, layer in members:
      index = {id(v): i for i, v in enumerate(variables[k])}
      found = [index.get(id(v)) for v in layer.trainable_variables]
      positions.append(None if not found or None in found else found)
    trained = [k + 1 for (k, _), p in zip(members, positions) if p]
    if not trained:
      return []
    if len(trained) != len(members):
      raise ValueError(
          f"A tied layer is trained in modules {trained} and frozen in the "
          f"others: its copies would drift apart; freeze it (or the "
          f"modules) everywhere or nowhere. Received: {where}")
    layer = members[0][1]
    if layer.non_trainable_weights:
      raise ValueError(
          f"A tied layer with state updated in training (e.g. moving "
          f"statistics) cannot span modules: each copy would update it from "
          f"its own inputs. Received: {where}, state "
          f"{[w.path for w in layer.non_trainable_weights]}")
    configs = []
    for k, _ in members:
      config = dict(_inner(optimizers[k]).get_config())
      config.pop("name", None)
      if config.get("global_clipnorm"):
        raise ValueError(
            f"Modules that hold a tied weight cannot clip by a global norm "
            f"(each module's norm differs, so would the copies' updates); "
            f"use clipnorm or clipvalue. Received: {where}, "
            f"global_clipnorm={config['global_clipnorm']}")
      configs.append(config)
    if any(c != configs[0] for c in configs[1:]):
      raise ValueError(
          f"The modules that hold a tied weight need optimizers with one "
          f"configuration (the copies take the same steps). Received: "
          f"{where}, optimizers "
          f"{[_inner(optimizers[k]).get_config() for k, _ in members]}")
    return [[(k, p) for (k, _), p in zip(members, positions)]]

  def sum(self, grads, scope):
    """`grads` with every copy's gradient replaced by the tie's sum.

    Args:
      grads: per module, its gradients aligned with its variables.
      scope: `k -> context manager` placing ops on module k's device.

    Returns:
      A new list of per-module lists. Each sum is computed once, on the
      first copy's device, and read by every copy's module.
    """
    grads = [list(g) for g in grads]
    for members in self.groups:
      first = members[0][0]
      for j in range(len(members[0][1])):
        with scope(first):
          total = _total([grads[k][p[j]] for k, p in members])
        for k, p in members:
          grads[k][p[j]] = total
    return grads
