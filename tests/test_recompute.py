"""Recomputation and the memory-lean order change no number.

`InterlockTrainer(recompute=...)` re-runs a module's forward inside its
backward; `memory_lean=True` (local) runs module k + 1's forward after
module k's backward. Both must train exactly as the plain step does: after
the same steps, every weight (BatchNorm's moving statistics included) is
the same within 1e-6. SGD at learning rate 1 without momentum moves each
weight by minus its gradient, so equal weights are equal gradients.
"""

import keras
import numpy as np
import pytest

from tests import helpers
from tf_interlock import placement as placement_lib
from tf_interlock.trainer import InterlockTrainer


def _train(strategy, placement="single", microbatches=1, steps=1,
           **options):
  """The weights before and after `steps` steps."""
  modules = helpers.mlp_modules(3, batch_norm=True)
  trainer = InterlockTrainer(
      modules, lambda k: keras.optimizers.SGD(1.0), strategy,
      placement=placement_lib.make_placement(placement, 3),
      steps_per_loop=steps, num_microbatches=microbatches, **options)
  x, y = helpers.batch(size=8)
  trainer.build(x)
  before = helpers.weights(modules)
  trainer.train_loop(iter(trainer.distribute_dataset(
      helpers.repeat_dataset(x, y))))
  return before, helpers.weights(modules)


# (local on one device without microbatches: the lean-order test below.)
@pytest.mark.parametrize("strategy,placement,microbatches", [
    ("e2e", "single", 1), ("2wise", "simulated", 2),
    ("local", "simulated", 2)])
def test_recompute_gives_the_same_weights(strategy, placement, microbatches):
  initial, plain = _train(strategy, placement, microbatches)
  _, again = _train(strategy, placement, microbatches, recompute=True)
  for a, b in zip(plain, again):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  # The step really trained (the comparison is not of untouched weights).
  assert any(not np.allclose(a, b) for a, b in zip(plain, initial))


def test_recompute_of_some_modules_and_the_lean_order_give_the_same_weights():
  # Two steps: the lean order also chains each step after the one before.
  _, plain = _train("local", microbatches=2, steps=2)
  for options in ({"recompute": [True, False, True]}, {"memory_lean": True},
                  {"memory_lean": True, "recompute": True}):
    _, again = _train("local", microbatches=2, steps=2, **options)
    for a, b in zip(plain, again):
      np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_bad_options_are_one_line():
  modules = helpers.mlp_modules(3)
  with pytest.raises(ValueError, match=r"Received: recompute=\[True\]"):
    InterlockTrainer(modules, "sgd", "local", recompute=[True])
  with pytest.raises(ValueError, match="memory_lean=True needs a strategy"):
    InterlockTrainer(modules, "sgd", "2wise", memory_lean=True)
