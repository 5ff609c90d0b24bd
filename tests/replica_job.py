"""One process of a multi-process training test; run by the tests.

    TF_CONFIG=... python -m tests.replica_job OUT.npz MODE STRATEGY...

MODE "modules": replicas x modules (`tf_interlock.replicas.connect`), this
process holds all K modules, module k on its logical CPU k. MODE "mirrored":
`MultiWorkerMirroredStrategy` with placement "single". MODE "dead_peer":
as "modules", but replica 1 exits (code 3) once connected. Every strategy named
is trained in turn (same seed, same data) and its weights and metrics are
saved to OUT.npz as `{strategy}/w{i}` and `{strategy}/{metric}`.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

K = 2
GLOBAL_BATCH = 8
STEPS_PER_LOOP = 2
LOOPS = 3


def data():
  """32 examples in global batches of 8: every step sees new rows."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tests import helpers  # pylint: disable=g-import-not-at-top
  x, y = helpers.batch(size=32, seed=3)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(
      GLOBAL_BATCH, drop_remainder=True).repeat()


def train(strategy, distribute=None, placement=None, replicas=None):
  """Trains K = 2 MLP modules; returns (weights, last metrics)."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tests import helpers  # pylint: disable=g-import-not-at-top
  from tf_interlock.trainer import InterlockTrainer  # pylint: disable=g-import-not-at-top
  distribute = distribute or tf.distribute.get_strategy()
  with distribute.scope():
    modules = helpers.mlp_modules(K, seed=7)
  trainer = InterlockTrainer(
      modules, lambda k: keras.optimizers.SGD(0.1, momentum=0.9), strategy,
      loss_fn=helpers.cross_entropy, distribute=distribute,
      placement=placement, replicas=replicas, steps_per_loop=STEPS_PER_LOOP)
  trainer.build(helpers.batch(size=2)[0])
  iterator = iter(trainer.distribute_dataset(data()))
  metrics = [trainer.train_loop(iterator) for _ in range(LOOPS)]
  return helpers.weights(modules), metrics[-1], trainer


def main(out, mode, strategies):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_interlock import replicas as replicas_lib  # pylint: disable=g-import-not-at-top
  if mode in ("modules", "dead_peer"):
    # dead_peer: replica 1 dies once connected; replica 0's first
    # collective must then fail within its timeout instead of hanging.
    replicas, placement, _ = replicas_lib.connect(
        num_modules=K, timeout_s=300 if mode == "modules" else 20)
    if mode == "dead_peer" and replicas.replica_id == 1:
      print("replica_job dying", flush=True)
      os._exit(3)  # pylint: disable=protected-access
    kwargs = dict(placement=placement, replicas=replicas)
  else:
    kwargs = dict(distribute=tf.distribute.MultiWorkerMirroredStrategy())
  saved = {}
  for strategy in strategies:
    weights, metrics, trainer = train(strategy, **kwargs)
    saved.update({f"{strategy}/w{i}": w for i, w in enumerate(weights)})
    saved.update({f"{strategy}/{key}": value
                  for key, value in metrics.items()})
    if mode == "modules":
      graph = trainer._loop_fns[STEPS_PER_LOOP].get_concrete_function(  # pylint: disable=protected-access
          iter(trainer.distribute_dataset(data()))).graph
      saved[f"{strategy}/collective_devices"] = np.array(sorted(
          op.device for op in graph.get_operations()
          if op.type == "CollectiveReduceV2"))
  np.savez(out, **saved)
  print("replica_job done", flush=True)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], sys.argv[3:])
