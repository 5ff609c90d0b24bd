"""`ExecutionOptions`: checked when made, frozen, and given to the trainer
(and through `InterlockModel.compile`) at construction, never set after."""

import dataclasses

import keras
import numpy as np
import pytest

import tf_interlock as ti
from tests import helpers
from tf_interlock.keras import fit as keras_fit
from tf_interlock import placement as placement_lib
from tf_interlock.execution_options import ExecutionOptions
from tf_interlock.trainer import InterlockTrainer


@pytest.mark.parametrize("kwargs, match", [
    ({"loop": "scan"}, r"Received: loop='scan'$"),
    ({"graph_optimization": "none"}, r"Received: graph_optimization='none'$"),
    ({"min_traced_calls": 0}, r"Received: min_traced_calls=0$"),
    ({"min_traced_calls": True}, r"Received: min_traced_calls=True$"),
    ({"min_traced_calls": 2.0}, r"Received: min_traced_calls=2.0$"),
    ({"data_autotune": "yes"}, r"Received: data_autotune='yes'$"),
    ({"loop_block": 0}, r"Received: loop_block=0$"),
    ({"max_block_weights": 0}, r"Received: max_block_weights=0$"),
    ({"max_block_weights": 8.0}, r"Received: max_block_weights=8.0$"),
    ({"loop_block": 2.0}, r"Received: loop_block=2.0$"),
    ({"loop": "unrolled", "loop_block": 4},
     r"Received: loop_block=4, loop='unrolled'$"),
])
def test_a_bad_value_is_one_line_naming_it(kwargs, match):
  with pytest.raises(ValueError, match=match) as info:
    ExecutionOptions(**kwargs)
  assert "\n" not in str(info.value)


def test_defaults_and_frozen():
  options = ti.ExecutionOptions()
  assert options == ExecutionOptions(loop="auto", loop_block=1,
                                     max_block_weights=256,
                                     graph_optimization="auto",
                                     min_traced_calls=4, data_autotune=False)
  with pytest.raises(dataclasses.FrozenInstanceError):
    options.loop = "while"


def _trainer(steps_per_loop=1, options=None):
  x, y = helpers.batch(size=8)
  trainer = InterlockTrainer(
      helpers.mlp_modules(2), lambda k: keras.optimizers.Adam(0.01), "local",
      loss_fn=helpers.cross_entropy,
      placement=placement_lib.make_placement("simulated", 2),
      steps_per_loop=steps_per_loop, options=options)
  trainer.build(x)
  return trainer, iter(trainer.distribute_dataset(
      helpers.repeat_dataset(x, y)))


def test_the_trainer_takes_options_once():
  with pytest.raises(ValueError, match=r"Received: options=\{'loop': "):
    _trainer(options={"loop": "while"})
  trainer, _ = _trainer()
  assert trainer.options.execution == ExecutionOptions()
  assert not hasattr(trainer, "loop")
  assert not hasattr(trainer, "graph_optimization")


@pytest.mark.parametrize("min_calls, traced", [(4, False), (1, True)])
def test_min_traced_calls_decides_per_module_functions(min_calls, traced):
  # One step per call calls each module's work once: below the default
  # cut-off of 4 it runs op by op; a cut-off of 1 traces it.
  trainer, iterator = _trainer(
      options=ExecutionOptions(min_traced_calls=min_calls))
  trainer.train_loop(iterator)
  assert bool(trainer.step.functions.traces) is traced


@pytest.mark.parametrize("autotune", [False, True])
def test_data_autotune_reaches_fits_dataset(autotune):
  x, y = helpers.batch(size=16)
  dataset, *_ = keras_fit.training_dataset(
      x, y, 8, False, None, None, None, autotune=autotune)
  assert dataset.options().autotune.enabled is (None if autotune else False)


def test_compile_keeps_options_through_its_config():
  options = ExecutionOptions(loop="unrolled", data_autotune=True)
  model = ti.InterlockModel(helpers.mlp_modules(2), "local",
                            placement="simulated")
  model.compile("adam", execution_options=options)
  assert model.trainer.options.execution is options
  again = ti.InterlockModel(helpers.mlp_modules(2), "local",
                            placement="simulated")
  again.compile_from_config(model.get_compile_config())
  assert again.trainer.options.execution == options
  x, y = helpers.batch(size=16)
  history = model.fit(x, y, batch_size=8, verbose=0)
  assert np.isfinite(history.history["loss"][0])
