"""Trainers of a small MLP on simulated devices, run in one loop or
another (`ExecutionOptions.loop`): what tests/test_step_loop.py and
tests/test_pipelined_loop.py compare."""

import collections
import functools

import keras
import numpy as np
import tensorflow as tf

from tests import helpers
from tf_interlock import placement as placement_lib
from tf_interlock.execution_options import ExecutionOptions
from tf_interlock.trainer import InterlockTrainer


def trainer(loop, strategy, microbatches, steps_per_loop=4, traced=True,
            num_modules=3, block=1, max_block_weights=256):
  """A built trainer of `strategy` looping as `loop` (`block`,
  `max_block_weights`) says, and an iterator over different batches every
  step."""
  x, y = helpers.batch(size=8)
  made = InterlockTrainer(
      helpers.mlp_modules(num_modules, batch_norm=True),
      lambda k: keras.optimizers.Adam(0.01), strategy,
      loss_fn=helpers.cross_entropy,
      placement=placement_lib.make_placement("simulated", num_modules),
      steps_per_loop=steps_per_loop, num_microbatches=microbatches,
      options=ExecutionOptions(loop=loop, loop_block=block,
                               max_block_weights=max_block_weights))
  made.step.functions.traced = traced
  made.build(x)
  # Different batches every step: the loop must take them in order.
  rng = np.random.default_rng(3)
  xs = rng.normal(size=(64, x.shape[1])).astype("float32")
  ys = rng.integers(0, helpers.NUM_CLASSES, size=(64,)).astype("int32")
  dataset = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(
      8, drop_remainder=True).repeat()
  return made, iter(made.distribute_dataset(dataset))


Run = collections.namedtuple(
    "Run", "metrics built weights trainer iterator")


def run(loop, strategy, microbatches, traced, steps_per_loop, num_modules,
        block=1, max_block_weights=256):
  """One trainer's calls of `steps_per_loop`, `steps_per_loop` and 2 steps:
  their metrics, the weights after build and after the calls, and the
  trainer and its iterator (to look at the loop functions' graphs).

  Two calls of one loop function and one of another (2 steps: one more
  trip through the while loop's body after the first step). Cached: the
  runs are deterministic, and tests only read them (never run them on).
  """
  # One cache key however `block` is passed (lru_cache keys a keyword
  # apart from the same value passed by position or left out).
  return _cached_run(loop, strategy, microbatches, traced, steps_per_loop,
                     num_modules, block, max_block_weights)


@functools.lru_cache(maxsize=None)
def _cached_run(loop, strategy, microbatches, traced, steps_per_loop,
                num_modules, block, max_block_weights):
  """`run`, cached on its arguments in order."""
  made, iterator = trainer(loop, strategy, microbatches,
                           steps_per_loop=steps_per_loop, traced=traced,
                           num_modules=num_modules, block=block,
                           max_block_weights=max_block_weights)
  built = helpers.weights(made.modules)
  metrics = [made.train_loop(iterator) for _ in range(2)]
  metrics.append(made.train_loop(iterator, num_steps=2))
  return Run(metrics, built, helpers.weights(made.modules), made,
             iterator)
