"""Client side of the cluster equality test: `python -m tests.cluster_client`.

  python -m tests.cluster_client CLUSTER K,K,... STRATEGY,STRATEGY,...

A process connects to a cluster once, so one process does every check: for
each K and strategy it trains the same MLP for 20 steps with
placement=cluster (module k on worker k) and with placement=simulated
(module k on logical CPU k of this process), and prints one JSON line per
pair: the largest weight difference and where the cluster run's variables
were.
"""

import json
import sys

import keras
import numpy as np
import tensorflow as tf

from tests import helpers
from tf_interlock import cluster as cluster_lib
from tf_interlock import placement as placement_lib
from tf_interlock.trainer import InterlockTrainer

STEPS = 20


def train(kind, num_modules, strategy):
  """20 SGD steps (4 loops of 5) of a seeded K-module MLP.

  Returns:
    (trainer, its weights before the first step).
  """
  keras.utils.set_random_seed(0)
  placement = placement_lib.make_placement(kind, num_modules)
  trainer = InterlockTrainer(
      helpers.mlp_modules(num_modules, seed=1),
      lambda k: keras.optimizers.SGD(0.1, momentum=0.9), strategy,
      placement=placement, steps_per_loop=5)
  x, y = helpers.batch(size=16, seed=2)
  trainer.build(x)
  initial = helpers.weights(trainer.modules)
  iterator = iter(helpers.repeat_dataset(x, y))
  for _ in range(STEPS // 5):
    trainer.train_loop(iterator)
  return trainer, initial


def main(cluster, sizes, strategies):
  sizes = [int(k) for k in sizes.split(",")]
  placement_lib.configure_simulated_devices(max(sizes))
  spec = cluster_lib.cluster_spec(cluster)
  cluster_lib.connect(spec, timeout_s=60)
  for num_modules in sizes:
    for strategy in strategies.split(","):
      remote, initial = train("cluster", num_modules, strategy)
      local, _ = train("simulated", num_modules, strategy)
      a, b = helpers.weights(remote.modules), helpers.weights(local.modules)
      devices = sorted({
          v.value.device for k in range(num_modules)
          for v in remote.modules[k].weights + remote.optimizers[k].variables})
      print(json.dumps({
          "num_modules": num_modules, "strategy": strategy,
          "max_diff": max(float(np.abs(u - v).max()) for u, v in zip(a, b)),
          "moved": max(float(np.abs(u - v).max())
                       for u, v in zip(a, initial)),
          "devices": devices,
          "iterations": [int(o.iterations.numpy()) for o in remote.optimizers],
      }), flush=True)
  return 0


if __name__ == "__main__":
  tf.get_logger().setLevel("ERROR")
  sys.exit(main(*sys.argv[1:]))
