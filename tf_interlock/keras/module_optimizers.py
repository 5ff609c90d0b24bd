"""`InterlockModel.optimizer`: the K module optimizers behind one handle.

Every module k has its own optimizer (Gomez et al., 2022, arXiv:2010.04116:
each module and its aux head are updated by their own optimizer, so module k
can apply step t while later modules still work on it). Keras's callbacks
and tools expect one `model.optimizer` with a `learning_rate` and an
`iterations` counter: `LearningRateScheduler` and `ReduceLROnPlateau` read
and set `model.optimizer.learning_rate`, `TensorBoard` logs it as
"learning_rate" and steps its evaluation summaries by `iterations`.
`ModuleOptimizers` is that handle: reading the learning rate reads the first
selected module's; setting it sets every selected module's (all K unless
`modules` names some). It owns no variables: the module optimizers are saved
with the model under their own names.
"""

import keras

from tf_interlock import int_args
from tf_interlock import keras_private


class ModuleOptimizers(keras.optimizers.Optimizer):
  """One Keras optimizer handle over the modules' optimizers.

  Args:
    trainer: the `InterlockTrainer` whose `optimizers[k]` trains module k+1.

  Attributes:
    modules: None (every module) or the 1-based module numbers whose
      learning rate `learning_rate` reads and sets.
  """

  # Deliberately no super().__init__: the base class would create a step
  # counter and a learning rate variable that nothing updates.
  def __init__(self, trainer):  # pylint: disable=super-init-not-called
    keras_private.skip_optimizer_init(self)
    # A function, not an attribute holding the trainer: Keras's saving
    # walks attributes, and the optimizers are saved with the model already.
    self._get_trainer = lambda: trainer
    self.name = "module_optimizers"
    self.built = True
    self._modules = None

  @property
  def modules(self):
    return self._modules

  @modules.setter
  def modules(self, value):
    num = len(self._get_trainer().optimizers)
    if value is not None:
      value = [value] if int_args.is_int(value) else list(value)
      if not value or any(not int_args.is_int(k) or
                          not 1 <= k <= num for k in value):
        raise ValueError(f"modules must be None (all) or module numbers in "
                         f"1..{num}. Received: modules={value!r}")
      value = [int(k) for k in value]
    self._modules = value

  def module_optimizers(self):
    """The selected modules' optimizers, in depth order."""
    optimizers = self._get_trainer().optimizers
    if self._modules is None:
      return list(optimizers)
    return [optimizers[k - 1] for k in sorted(set(self._modules))]

  @property
  def learning_rate(self):
    """The first selected module's learning rate (a variable)."""
    return self.module_optimizers()[0].learning_rate

  @learning_rate.setter
  def learning_rate(self, value):
    for optimizer in self.module_optimizers():
      optimizer.learning_rate = value

  @property
  def iterations(self):
    """The last module's step counter: every module steps once per step."""
    return self._get_trainer().optimizers[-1].iterations

  @property
  def variables(self):
    return []

  def build(self, variables):
    del variables  # Each module's optimizer is built by the trainer.

  def finalize_variable_values(self, var_list):
    del var_list  # Keras passes the model's; each module has its own.
    trainer = self._get_trainer()
    for k, optimizer in enumerate(trainer.optimizers):
      optimizer.finalize_variable_values(trainer.variables(k))

  def get_config(self):
    return {"name": self.name,
            "module_optimizers": [keras.saving.serialize_keras_object(o)
                                  for o in self._get_trainer().optimizers]}

  def __repr__(self):
    names = [type(o).__name__ for o in self._get_trainer().optimizers]
    return f"ModuleOptimizers({names}, modules={self._modules})"
