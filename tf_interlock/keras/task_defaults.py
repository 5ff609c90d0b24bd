"""The loss a keras_hub task model trains with when `compile` names none.

keras_hub's task models (`GPT2CausalLM`, `BertTextClassifier`, ... every
subclass of `keras_hub.models.Task`) override `compile`: a loss left out
(their default `loss="auto"`) becomes the task's own, e.g.
`SparseCategoricalCrossentropy(from_logits=True)` for a causal LM, and
`from_logits=False` for a classifier made with `activation="softmax"`. A
user of the unsplit task writes `causal_lm.compile("adam")` and trains
with that loss; `InterlockModel.compile("adam")` on the split task must
train with the same one, not with our generic default.

`compile_loss(model)` asks the task itself: its own `compile` runs on a
stand-in object (`_Probe`) that shares the task's attributes (a
classifier's `activation`) and whose Keras `compile`, which the task's
calls last through `super()`, only records its arguments. The user's model
is neither compiled nor changed. `from_keras` stores the result in the
last module's body (`KerasSegment.default_loss`), so that it survives a
`.keras` save; `InterlockModel.compile` uses it when `loss` is None.
"""

import warnings

import keras


def is_task(model):
  """True for an instance of a keras_hub `Task` (without importing
  keras_hub, which is optional)."""
  return any(cls.__name__ == "Task" and cls.__module__.startswith("keras_hub")
             for cls in type(model).__mro__)


class _RecordCompile(keras.Model):
  """Stands between the task's classes and `keras.Model` in `_Probe`'s
  method order: the task's `super().compile(...)` lands here."""

  def compile(self, *args, **kwargs):  # pylint: disable=arguments-differ
    object.__setattr__(self, "_recorded_compile", (args, kwargs))

  def __setattr__(self, name, value):
    # What the task's compile sets after Keras's (its sampler, a cleared
    # generate function) stays on the stand-in, outside Keras's tracking.
    object.__setattr__(self, name, value)


def _recorded_loss(model):
  """Runs the task's own `compile()` on a stand-in; returns its loss."""
  probe_class = type("_Probe", (type(model), _RecordCompile), {})
  probe = object.__new__(probe_class)
  probe.__dict__.update(model.__dict__)
  probe_class.compile(probe)
  args, kwargs = probe.__dict__["_recorded_compile"]
  if "loss" in kwargs:
    return kwargs["loss"]
  return args[1] if len(args) > 1 else None


def compile_loss(model):
  """The task's default loss, serialized, or None for other models.

  Args:
    model: the model given to `from_keras`.

  Returns:
    `keras.losses.serialize` of the loss the task's `compile()` picks with
    no arguments, or None when `model` is not a keras_hub task (or its
    compile picks no loss). A task whose compile cannot be asked (a
    keras_hub version whose `compile` needs more than the model's
    attributes) gives None with a warning, so that a loss-less `compile`
    never trains with another loss unsaid.
  """
  if not is_task(model):
    return None
  try:
    loss = _recorded_loss(model)
    if loss is None:
      return None
    return keras.losses.serialize(keras.losses.get(loss))
  except Exception as e:  # pylint: disable=broad-except
    # Any failure of another library's compile on a stand-in: not fatal to
    # the split, but said.
    warnings.warn(
        f"Could not read the default loss of {type(model).__name__}'s "
        f"compile ({type(e).__name__}: {e}); pass loss= to "
        f"InterlockModel.compile.", stacklevel=3)
    return None


def default_loss(modules):
  """The task's loss recorded by `from_keras` in the last module, as a
  `keras.losses.Loss`, or None (compile's generic default then applies).
  """
  config = getattr(modules[-1].body, "default_loss", None)
  return None if config is None else keras.losses.deserialize(config)
