"""TF's private names live in tf_interlock/tf_private.py alone, and do what
its docstrings say on the installed TF."""

import os

import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from tests import helpers
from tests.binaries import ROOT
from tf_interlock import placement as placement_lib
from tf_interlock import tf_private
from tf_interlock.trainer import InterlockTrainer


def test_checked_tf_version():
  assert tf.__version__ in tf_private.CHECKED_TF_VERSIONS, (
      f"tf_interlock/tf_private.py was checked against TF "
      f"{tf_private.CHECKED_TF_VERSIONS}; installed: {tf.__version__}. "
      f"Re-read the private names it uses and update the list.")


def _call_config(light):
  """The ConfigProto a call op gets when made inside (or outside) the
  block."""
  inner = tf.function(lambda x: x * 2.0)

  def outer(x):
    if light:
      with tf_private.light_graph_optimization():
        return inner(x)
    return inner(x)

  graph = tf.function(outer).get_concrete_function(
      tf.TensorSpec([], tf.float32)).graph
  calls = [op for op in graph.get_operations()
           if op.type.endswith("PartitionedCall")]
  assert len(calls) == 1
  config = config_pb2.ConfigProto()
  config.ParseFromString(calls[0].get_attr("config_proto"))
  return config.graph_options.rewrite_options


def test_light_settings_reach_the_calls_in_the_block_only():
  light = _call_config(True)
  assert light.disable_tfg_optimizer
  assert light.meta_optimizer_iterations == light.ONE
  assert light.layout_optimizer == light.OFF
  assert light.memory_optimization == light.NO_MEM_OPT
  # After the block, and without it, calls keep the process's settings.
  for rewrites in (_call_config(False), _call_config(False)):
    assert not rewrites.disable_tfg_optimizer
    assert rewrites.meta_optimizer_iterations == rewrites.DEFAULT_NUM_ITERS


def test_light_trainer_trains_like_the_default(monkeypatch):
  used = []
  light = tf_private.light_rewrites
  monkeypatch.setattr(tf_private, "light_rewrites",
                      lambda r: (used.append(1), light(r)))
  x, y = helpers.batch(size=8)
  runs = []
  for optimization in ("default", "light"):
    trainer = InterlockTrainer(
        helpers.mlp_modules(2, batch_norm=True),
        lambda k: keras.optimizers.Adam(0.01), "2wise",
        loss_fn=helpers.cross_entropy,
        placement=placement_lib.make_placement("simulated", 2),
        steps_per_loop=4)
    trainer.graph_optimization = optimization
    trainer.build(x)
    iterator = iter(trainer.distribute_dataset(helpers.repeat_dataset(x, y)))
    runs.append(([trainer.train_loop(iterator) for _ in range(2)],
                 helpers.weights(trainer.modules)))
  assert used  # the light run went through the adapter
  for a, b in zip(runs[1][1], runs[0][1]):  # the weights: bit for bit
    np.testing.assert_array_equal(a, b)
  # The means reported may differ in the last bit (seen: one float32 ulp):
  # the passes left on round a sum differently in the two graphs.
  for a, b in zip(runs[1][0], runs[0][0]):
    assert a.keys() == b.keys()
    np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a],
                               rtol=3e-7)


def test_no_other_file_touches_tf_private_names():
  allowed = os.path.join("tf_interlock", "tf_private.py")
  bad = []
  for package in ("tf_interlock", "layers"):
    for folder, _, names in os.walk(os.path.join(ROOT, package)):
      for name in names:
        path = os.path.join(folder, name)
        if not name.endswith(".py") or path.endswith(allowed):
          continue
        with open(path, encoding="utf-8") as f:
          text = f.read()
        if "function_call_options" in text or "tensorflow.python.eager" in (
            text):
          bad.append(os.path.relpath(path, ROOT))
  assert not bad, f"TF private names outside tf_private.py: {bad}"
