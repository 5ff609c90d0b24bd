"""Every training setting of both front doors, as one frozen value.

`InterlockTrainer` and `InterlockModel` read their settings from one
`TrainingOptions`, made and checked when the trainer or model is made and
never changed after: `InterlockModel.compile` makes a new trainer from a new
value (`dataclasses.replace`), it does not edit the model's.

  import tf_interlock as ti
  options = ti.TrainingOptions(strategy="2wise", steps_per_loop=8,
                               num_microbatches=2)
  trainer = ti.InterlockTrainer(modules, "adam", options=options)
  model = ti.InterlockModel(modules, options=options)

The doors' own keyword arguments (`strategy=`, `steps_per_loop=`,
`memory_lean=`, ...) are still taken: `make` builds the value from them, so
both spellings are checked by the same rules. What is not a setting but a
collaborator (the modules, optimizers, loss and metric functions, the
`tf.distribute` strategy, the placement, the replicas) stays an argument of
its own.
"""

import dataclasses
from typing import Tuple, Union

from tf_interlock import execution_options as execution_lib
from tf_interlock import int_args
from tf_interlock import strategy as strategy_lib

JIT_COMPILE_ALLOWED = "True, False or 'auto'"


@dataclasses.dataclass(frozen=True)
class TrainingOptions:
  """How K interlocking modules are trained, fixed when the trainer is made.

  Attributes:
    strategy: the window: "e2e", "local", "pairwise", "Nwise" (optionally
      with a variant, "2wise-sum"), an int window or an `InterlockStrategy`;
      held as the parsed `InterlockStrategy`.
    steps_per_loop: training steps per `tf.function` call (Keras's
      `steps_per_execution`), an int >= 1.
    num_microbatches: M >= 1; each replica's batch is split into M
      microbatches whose gradients are summed before one update.
    jit_compile: True, False or "auto": compile the step with XLA
      (`module_functions.resolve_jit_compile`; "auto" as Keras: on a GPU or
      TPU, off on CPU).
    recompute: a bool, or one bool per module (held as a tuple): module k
      keeps only its input and re-runs its forward inside its backward.
    memory_lean: a bool: one module's activations alive at a time (local
      learning only; `engine.InterlockStep`).
    execution: an `ExecutionOptions`: how a call runs its steps (none of
      its fields changes what is computed).

  Raises:
    ValueError: one line naming the bad value and what is allowed, for a
      wrong type too (`memory_lean='no'` is refused, not taken as True).
  """

  strategy: Union[str, int, strategy_lib.InterlockStrategy] = "e2e"
  steps_per_loop: int = 1
  num_microbatches: int = 1
  jit_compile: Union[bool, str] = "auto"
  recompute: Union[bool, Tuple[bool, ...]] = False
  memory_lean: bool = False
  execution: execution_lib.ExecutionOptions = (
      execution_lib.ExecutionOptions())

  def __post_init__(self):
    # A frozen dataclass sets its normalized fields through object's own
    # __setattr__, here only, while the value is being made.
    object.__setattr__(self, "strategy",
                       strategy_lib.parse_strategy(self.strategy))
    for name in ("steps_per_loop", "num_microbatches"):
      value = getattr(self, name)
      if not int_args.is_int(value) or value < 1:
        raise ValueError(f"{name} must be an int >= 1. "
                         f"Received: {name}={value!r}")
      object.__setattr__(self, name, int(value))
    if not (isinstance(self.jit_compile, bool) or self.jit_compile == "auto"):
      raise ValueError(f"jit_compile must be {JIT_COMPILE_ALLOWED}. "
                       f"Received: jit_compile={self.jit_compile!r}")
    recompute = self.recompute
    if isinstance(recompute, (list, tuple)) and recompute and all(
        isinstance(v, bool) for v in recompute):
      object.__setattr__(self, "recompute", tuple(recompute))
    elif not isinstance(recompute, bool):
      raise ValueError(f"recompute must be True, False or a list of bools "
                       f"(one per module). Received: recompute={recompute!r}")
    if not isinstance(self.memory_lean, bool):
      raise ValueError(f"memory_lean must be True or False. "
                       f"Received: memory_lean={self.memory_lean!r}")
    if not isinstance(self.execution, execution_lib.ExecutionOptions):
      raise ValueError(f"execution must be a tf_interlock.ExecutionOptions. "
                       f"Received: execution={self.execution!r}")


def make(options=None, *, variant=None, **given):
  """The `TrainingOptions` of a door's arguments.

  Args:
    options: None (the defaults), a `TrainingOptions`, or an
      `ExecutionOptions` (the trainer's earlier `options=`: the defaults
      with that execution).
    variant: "only" or "sum", folded into the strategy (`parse_strategy`
      refuses one that contradicts the strategy's suffix).
    **given: `TrainingOptions` fields; None means not given (the value of
      `options`).

  Returns:
    `options` with the given fields replaced (a new value; `options` is
    not changed).

  Raises:
    ValueError: one line, for an options value of another type or any bad
      field.
  """
  if options is None:
    options = TrainingOptions()
  elif isinstance(options, execution_lib.ExecutionOptions):
    options = TrainingOptions(execution=options)
  elif not isinstance(options, TrainingOptions):
    raise ValueError(f"options must be a tf_interlock.TrainingOptions, an "
                     f"ExecutionOptions or None. Received: options={options!r}")
  changes = {name: value for name, value in given.items()
             if value is not None}
  if variant is not None:
    changes["strategy"] = strategy_lib.parse_strategy(
        changes.get("strategy", options.strategy), variant)
  return dataclasses.replace(options, **changes) if changes else options
