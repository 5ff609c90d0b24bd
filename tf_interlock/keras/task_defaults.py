"""What a keras_hub task model trains and logs with when `compile` leaves
it to the task ("auto").

keras_hub's task models (`GPT2CausalLM`, `BertTextClassifier`, ... every
subclass of `keras_hub.models.Task`) override `compile`: its defaults
`optimizer="auto"`, `loss="auto"` and `metrics="auto"` (classifiers) or
`weighted_metrics="auto"` (causal and masked LMs) become the task's own,
e.g. `Adam(2e-5)`, `SparseCategoricalCrossentropy(from_logits=True)` and
`weighted_metrics=[SparseCategoricalAccuracy()]` for a causal LM, and
`from_logits=False` for a classifier made with `activation="softmax"`. A
user of the unsplit task writes `causal_lm.compile("adam")`, trains with
that loss and sees `sparse_categorical_accuracy` weighted by the padding
mask; `InterlockModel.compile("adam")` on the split task must do the same,
not fall back to our generic defaults.

`compile_defaults(model)` asks the task itself: its own `compile` runs on
a stand-in object (`_Probe`) that shares the task's attributes (a
classifier's `activation`) and whose Keras `compile`, which the task's
calls last through `super()`, only records its arguments. The user's model
is neither compiled nor changed. `from_keras` stores the results, each
serialized, in the last module's body (`KerasSegment.default_loss` and
`.compile_defaults`), so that they survive a `.keras` save;
`InterlockModel.compile` reads them for "auto" (`resolve`).
"""

import json
import warnings

import keras

from tf_interlock.keras import metrics as keras_metrics

# `keras.Model.compile`'s leading parameters, for a task that passes them
# by position.
_COMPILE_ARGS = ("optimizer", "loss", "loss_weights", "metrics",
                 "weighted_metrics")


def is_task(model):
  """True for an instance of a keras_hub `Task` (without importing
  keras_hub, which is optional)."""
  return any(cls.__name__ == "Task" and cls.__module__.startswith("keras_hub")
             for cls in type(model).__mro__)


def is_auto(value):
  """True for compile's "auto": the task's own default."""
  return isinstance(value, str) and value == "auto"


class _RecordCompile(keras.Model):
  """Stands between the task's classes and `keras.Model` in `_Probe`'s
  method order: the task's `super().compile(...)` lands here."""

  def compile(self, *args, **kwargs):  # pylint: disable=arguments-differ
    object.__setattr__(self, "_recorded_compile", (args, kwargs))

  def __setattr__(self, name, value):
    # What the task's compile sets after Keras's (its sampler, a cleared
    # generate function) stays on the stand-in, outside Keras's tracking.
    object.__setattr__(self, name, value)


def _recorded_compile(model):
  """Runs the task's own `compile()` on a stand-in; returns the arguments
  it gives Keras's `compile`, by name."""
  probe_class = type("_Probe", (type(model), _RecordCompile), {})
  probe = object.__new__(probe_class)
  probe.__dict__.update(model.__dict__)
  probe_class.compile(probe)
  args, kwargs = probe.__dict__["_recorded_compile"]
  return {**dict(zip(_COMPILE_ARGS, args)), **kwargs}


def _serialized_metrics(metrics):
  """A list of metrics as JSON-able values (names stay names), or None."""
  if metrics is None:
    return None
  return [m if isinstance(m, str) else keras.saving.serialize_keras_object(m)
          for m in keras_metrics.as_list(metrics)]


def compile_defaults(model):
  """The task's default loss, and its default optimizer and metrics.

  Args:
    model: the model given to `from_keras`.

  Returns:
    `(loss, others)`: `keras.losses.serialize` of the loss the task's
    `compile()` picks with no arguments (None if it picks none), and
    {"optimizer", "metrics", "weighted_metrics"}, each serialized or None;
    `(None, None)` when `model` is not a keras_hub task. A task whose
    compile cannot be asked (a keras_hub version whose `compile` needs more
    than the model's attributes) gives `(None, None)` with a warning, so
    that "auto" never means another loss unsaid.
  """
  if not is_task(model):
    return None, None
  try:
    recorded = _recorded_compile(model)
    loss = recorded.get("loss")
    if loss is not None:
      loss = keras.losses.serialize(keras.losses.get(loss))
    optimizer = recorded.get("optimizer")
    if optimizer is not None and not isinstance(optimizer, str):
      optimizer = keras.optimizers.serialize(optimizer)
    others = {
        "optimizer": optimizer,
        "metrics": _serialized_metrics(recorded.get("metrics")),
        "weighted_metrics": _serialized_metrics(
            recorded.get("weighted_metrics"))}
    # The last module keeps them as JSON: a value JSON cannot hold fails
    # here, with the warning, not in `from_keras`.
    return tuple(json.loads(json.dumps([loss, others])))
  except Exception as e:  # pylint: disable=broad-except
    # Any failure of another library's compile on a stand-in: not fatal to
    # the split, but said.
    warnings.warn(
        f"Could not read the defaults of {type(model).__name__}'s compile "
        f"({type(e).__name__}: {e}); pass optimizer=, loss=, metrics= and "
        f"weighted_metrics= to InterlockModel.compile.", stacklevel=3)
    return None, None


def default_loss(modules):
  """The task's loss recorded by `from_keras` in the last module, as a
  `keras.losses.Loss`, or None (compile's generic default then applies).
  """
  config = getattr(modules[-1].body, "default_loss", None)
  return None if config is None else keras.losses.deserialize(config)


def _default(modules, name):
  """The task's recorded `name` ("optimizer", "metrics", ...), made anew
  from its config, or None."""
  config = (getattr(modules[-1].body, "compile_defaults", None) or {}).get(
      name)
  if config is None or isinstance(config, str):
    return config
  if name == "optimizer":
    return keras.optimizers.deserialize(config)
  return [m if isinstance(m, str) else
          keras.saving.deserialize_keras_object(m) for m in config]


def resolve(modules, optimizer, loss, metrics, weighted_metrics):
  """`compile`'s arguments with "auto" (and a loss of None) replaced.

  Args:
    modules: the model's modules; the last one holds what `from_keras`
      recorded of a keras_hub task.
    optimizer, loss, metrics, weighted_metrics: as given to `compile`.

  Returns:
    `(optimizer, loss, metrics, weighted_metrics)`: each "auto" becomes the
    split task's own default (a new object, never shared with another
    compile); where the model is no task, or the task has none, the
    optimizer "adam", the loss None (our sparse cross-entropy on logits)
    and no metrics.
  """
  if is_auto(optimizer):
    optimizer = _default(modules, "optimizer") or "adam"
  if loss is None or is_auto(loss):
    loss = default_loss(modules)
  if is_auto(metrics):
    metrics = _default(modules, "metrics")
  if is_auto(weighted_metrics):
    weighted_metrics = _default(modules, "weighted_metrics")
  return optimizer, loss, metrics, weighted_metrics
