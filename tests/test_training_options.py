"""`TrainingOptions`: every setting of the trainer and the Keras model in one
frozen value, checked (types too) when made; the doors' keyword arguments
build it, and `compile` gives its trainer a new value without changing the
model's."""

import dataclasses
import re

import keras
import numpy as np
import pytest

import tf_interlock as ti
from layers import aux_heads
from layers import resnet
from tests import helpers
from tf_interlock.strategy import InterlockStrategy


def _trainer(**kwargs):
  return ti.InterlockTrainer(helpers.mlp_modules(2), "sgd", "local",
                             loss_fn=helpers.cross_entropy, **kwargs)


# A truth value is not a setting: 'no', 'False' and 0.0 were taken as True.
_BAD = [
    ("memory_lean", "no"), ("memory_lean", "False"), ("memory_lean", 0.0),
    ("memory_lean", 1), ("recompute", "yes"), ("recompute", [True, 1]),
    ("recompute", []), ("steps_per_loop", True), ("steps_per_loop", 2.0),
    ("steps_per_loop", 0), ("num_microbatches", False),
    ("num_microbatches", "2"), ("jit_compile", "yes"), ("jit_compile", 1),
]


@pytest.mark.parametrize("name, value", _BAD)
def test_every_door_refuses_a_bad_type_in_one_line(name, value):
  received = re.escape(f"Received: {name}={value!r}") + "$"
  for make in (lambda: ti.TrainingOptions(**{name: value}),
               lambda: _trainer(**{name: value})):
    with pytest.raises(ValueError, match=received) as info:
      make()
    assert "\n" not in str(info.value)
  if name in ("memory_lean", "recompute", "num_microbatches"):
    with pytest.raises(ValueError, match=received):
      ti.InterlockModel(helpers.mlp_modules(2), "local", **{name: value})
  if name in ("steps_per_loop", "jit_compile"):
    model = ti.InterlockModel(helpers.mlp_modules(2), "local")
    keras_name = ("steps_per_execution" if name == "steps_per_loop"
                  else name)
    with pytest.raises(ValueError, match=f"Received: {keras_name}="):
      model.compile("sgd", **{keras_name: value})
    assert model.trainer is None  # refused before anything was made


@pytest.mark.parametrize("make", [
    lambda: resnet.BasicBlock(4, 1, synchronized_bn="no"),
    lambda: aux_heads.ConvAuxHead(10, synchronized_bn=0.0),
    lambda: aux_heads.make_aux_head("pool", 10, (None, 4, 4, 8),
                                    synchronized_bn="False"),
])
def test_the_layers_boolean_arguments_take_bools_only(make):
  with pytest.raises(ValueError, match=r"Received: synchronized_bn="):
    make()


def test_frozen_and_normalised():
  options = ti.TrainingOptions(strategy="2wise-sum", recompute=[True, False])
  assert options.strategy == InterlockStrategy(2, "sum")
  assert options.recompute == (True, False)
  assert options == ti.TrainingOptions(strategy=InterlockStrategy(2, "sum"),
                                       recompute=(True, False))
  with pytest.raises(dataclasses.FrozenInstanceError):
    options.memory_lean = True


def test_keyword_arguments_build_the_same_value():
  given = _trainer(steps_per_loop=3, num_microbatches=2, memory_lean=True)
  options = ti.TrainingOptions(strategy="local", steps_per_loop=3,
                               num_microbatches=2, memory_lean=True)
  assert given.options == options
  from_options = ti.InterlockTrainer(helpers.mlp_modules(2), "sgd",
                                     loss_fn=helpers.cross_entropy,
                                     options=options)
  assert from_options.options is options
  assert from_options.step.memory_lean and from_options.steps_per_loop == 3
  # A keyword argument replaces the field of options= (a new value).
  other = ti.InterlockTrainer(helpers.mlp_modules(2), "sgd",
                              loss_fn=helpers.cross_entropy, options=options,
                              steps_per_loop=5)
  assert other.steps_per_loop == 5 and options.steps_per_loop == 3
  with pytest.raises(ValueError, match=r"Received: options=\{"):
    _trainer(options={"memory_lean": True})


def test_the_trainer_takes_a_placement_name_as_the_model_does():
  trainer = _trainer(placement="single")
  assert trainer.placement.kind == "single"
  with pytest.raises(ValueError, match=r"Received: placement='nowhere'$"):
    _trainer(placement="nowhere")


def test_compile_does_not_change_the_models_options():
  options = ti.TrainingOptions(strategy="local", num_microbatches=2,
                               memory_lean=True)
  model = ti.InterlockModel(helpers.mlp_modules(2), options=options)
  model.compile("sgd", steps_per_execution=2)
  assert model.interlock_options is options
  assert model.trainer.options == dataclasses.replace(options,
                                                      steps_per_loop=2)
  before = helpers.weights(model.modules)
  x, y = helpers.batch(size=16)
  model.fit(x, y, batch_size=8, epochs=1, verbose=0)
  after = helpers.weights(model.modules)
  assert all(not np.array_equal(a, b) for a, b in zip(before, after))
  model.compile(keras.optimizers.SGD(0.1))  # the model's options again
  assert model.trainer.options == options
  # Saved and loaded with its settings.
  again = ti.InterlockModel.from_config(model.get_config())
  assert again.interlock_options == options
