"""With --deterministic=true, the run that prepares an image data set into a
new --data_dir ends bit for bit as a later run that reads the prepared
files: every saved variable is equal.

It did not before (issue 46): TFDS names the temporary folder it prepares
a data set in with Python's `random.choice`, Keras draws each initializer's
seed from Python's `random` when a layer is made, and so only the preparing
run started from other weights (its BN statistics differed after one step
even at learning rate 1e-20). `train_lib.build` now seeds again just before
it makes the layers. Two `train.train` processes, as a user runs them: a
small ResNet on Fashion-MNIST-shaped IDX files the test writes.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from tests import idx_files
from tests.binaries import run_binary, tree_digest

pytestmark = pytest.mark.slow

# Two modules on one device and two steps at the preset's learning rate
# (the weights move): seconds of training, most of the time is TF's start.
FLAGS = ["--preset=fashion_mnist_resnet", "--num_modules=2", "--split=4,5",
         "--placement=single", "--resnet_width=0.5", "--batch_size=64",
         "--train_steps=2", "--warmup_steps=1", "--steps_per_loop=1",
         "--eval_every_steps=2", "--eval_batches=1",
         "--checkpoint_every_steps=2", "--deterministic=true"]
# The tf.data iterator's position: a variant, not readable as an array.
ITERATOR_STATE = "iterator/.ATTRIBUTES/ITERATOR_STATE"


def _saved_variables(model_dir):
  """{checkpoint key: value} of every variable of the run's checkpoint."""
  reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints"))
  keys = sorted(reader.get_variable_to_shape_map())
  assert ITERATOR_STATE in keys
  return {key: reader.get_tensor(key) for key in keys
          if key != ITERATOR_STATE}


def test_preparing_run_and_reading_run_save_equal_variables(tmp_path):
  source_dir = tmp_path / "idx"
  source_dir.mkdir()
  rng = np.random.default_rng(0)
  for split, n in (("train", 256), ("test", 128)):
    idx_files.write_split(str(source_dir), split,
                          rng.integers(0, 256, (n, 28, 28)),
                          np.arange(n) % 10, gz=False)
  data_dir = tmp_path / "tfds"
  data = [f"--source_dir={source_dir}", f"--data_dir={data_dir}"]

  run_binary("train.train", *FLAGS, *data,
             f"--model_dir={tmp_path / 'preparing'}")
  assert (data_dir / "fashion_mnist_local").is_dir()  # it prepared the data
  prepared = tree_digest(str(data_dir))
  run_binary("train.train", *FLAGS, *data,
             f"--model_dir={tmp_path / 'reading'}")
  assert tree_digest(str(data_dir)) == prepared  # it only read them

  preparing = _saved_variables(str(tmp_path / "preparing"))
  reading = _saved_variables(str(tmp_path / "reading"))
  assert preparing.keys() == reading.keys()
  # Trainable weights are saved under the optimizer (its key is the
  # shortest path to them), BN statistics under the module.
  assert any(key.startswith("optimizer_1/_trainable_variables/")
             for key in preparing)
  assert any("moving_mean" in key for key in preparing)
  for key, value in preparing.items():
    np.testing.assert_array_equal(value, reading[key], err_msg=key)
