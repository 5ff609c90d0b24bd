"""What went wrong is on an error's first line (issue 35, §3).

TF's runtime errors start "Graph execution error:" and name the bad value
only after the node's trace; `op_errors.cause_first` puts the kernel's own
message first for `fit`, `evaluate`, `predict` and `train_on_batch`. The
model's own refusals (features of the wrong width in `predict`, one module
given twice, a Python generator) are one line.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import interlock_module
from tf_interlock.keras import split as keras_split
from tf_interlock import op_errors
from tf_interlock.keras.model import InterlockModel

CLASSES = 3

_GRAPH_ERROR = (
    "Graph execution error:\n\nDetected at node loss/Xent defined at (most "
    "recent call last):\n  File \"a.py\", line 1, in <module>\n\n  File "
    "\"b.py\", line 2, in fit\n\nReceived a label value of 7 which is "
    "outside the valid range of [0, 3).  Label values: 5 7\n\t [[{{node "
    "loss/Xent}}]] [Op:__inference_loop_1]")


@pytest.mark.parametrize("text, expected", [
    (_GRAPH_ERROR, "Received a label value of 7 which is outside the valid "
                   "range of [0, 3).  Label values: 5 7"),
    ("Graph execution error:\n\nDetected at node PyFunc defined at (most "
     "recent call last):\n<stack traces unavailable>\nRuntimeError: broke\n"
     "Traceback (most recent call last):\n\n  File \"g.py\"\n",
     "RuntimeError: broke"),
    ("{{function_node __wrapped__Foo}} bad shape [2,3]\n\t [[x]]",
     "bad shape [2,3]"),
    ("plain message\n  more", "plain message"),
    ("", ""),
])
def test_kernel_message_is_the_kernels_first_line(text, expected):
  assert op_errors.kernel_message(text) == expected


def test_cause_first_keeps_the_class_and_the_whole_text():
  error = tf.errors.InvalidArgumentError(None, None, _GRAPH_ERROR)
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    with op_errors.cause_first("fit"):
      raise error
  first, rest = raised.value.message.split("\n", 1)
  assert first.startswith("Received a label value of 7") and first.endswith(
      "(raised in fit)")
  assert _GRAPH_ERROR in rest


@pytest.fixture(scope="module")
def trained():
  keras.utils.set_random_seed(0)
  plain = keras.Sequential([
      keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
      keras.layers.Dense(16, activation="relu"), keras.layers.Dense(CLASSES)])
  model = InterlockModel(keras_split.from_keras(plain, 2), "local")
  model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  x = np.random.default_rng(0).random((32, 8), dtype=np.float32)
  y = np.arange(32) % CLASSES
  model.fit(x, y, batch_size=8, verbose=0)
  return model, x, y


@pytest.mark.parametrize("shift, shown", [(5, "label value of"),
                                          (-1, "label value of -1")])
def test_dataset_labels_out_of_range_are_named_first(trained, shift, shown):
  model, x, y = trained
  labels = y + shift if shift > 0 else y * 0 + shift
  dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(
      8, drop_remainder=True)
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    model.fit(dataset, verbose=0)
  first = str(raised.value).splitlines()[0]
  assert shown in first and "[0, 3)" in first, first


def test_a_generator_that_raises_midway_is_named_first(trained):
  model, x, y = trained

  def batches():
    for _ in range(2):
      yield x[:8], y[:8]
    raise RuntimeError("batch 3 could not be read")

  dataset = tf.data.Dataset.from_generator(batches, output_signature=(
      tf.TensorSpec((8, 8), tf.float32), tf.TensorSpec((8,), tf.int64)))
  with pytest.raises(tf.errors.OpError) as raised:
    model.fit(dataset, steps_per_epoch=4, verbose=0)
  first = str(raised.value).splitlines()[0]
  assert first.startswith("RuntimeError: batch 3 could not be read"), first


def test_a_python_generator_is_refused_in_one_line(trained):
  model, x, y = trained
  with pytest.raises(ValueError, match=r"from_generator.*Received: "
                                       r"x=generator$"):
    model.fit(((x[:8], y[:8]) for _ in range(2)), verbose=0)


def test_predict_with_features_of_another_width_is_one_line(trained):
  model, _, _ = trained
  with pytest.raises(ValueError, match=r"examples of shape \(8,\).*"
                                       r"Received: x.shape=\(4, 5\)$"):
    model.predict(np.zeros((4, 5), np.float32), verbose=0)


def test_one_module_given_twice_is_refused():
  module = interlock_module.InterlockModule(
      keras.layers.Dense(8), aux_head=keras.layers.Dense(CLASSES))
  other = interlock_module.InterlockModule(keras.layers.Dense(CLASSES))
  with pytest.raises(ValueError, match=r"module 1 is given again as module "
                                       r"3\. Received: modules\[2\]="):
    InterlockModel([module, other, module], "local")
