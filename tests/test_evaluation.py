"""Tests for the per-head evaluation of in-memory modules and exports."""

import math
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import resnet
from layers import transformer
from layers.interlock_module import InterlockModule
from tf_interlock import evaluation
from tf_interlock import export

# Known-answer logits (one row per example) and labels. Final head: argmax
# [0, 1, 2, 0], right on examples 0 and 1. Exit 1 sees the negated logits:
# argmax [2, 0, 1, 1], right on example 3 only.
LOGITS = np.array([[2., 1., 0.], [0., 3., 1.], [1., 0., 5.], [3., 0., 1.]],
                  dtype="float32")
LABELS = np.array([0, 1, 0, 1], dtype="int32")


def _identity_modules(input_shape):
  """K = 2 modules whose final logits are the input and exit 1's its negation.

  Args:
    input_shape: per-example input shape; its last axis is the classes.

  Dense layers with fixed kernels rather than weightless layers, so that the
  export has variables like a real model.
  """
  def dense(gain):
    return keras.layers.Dense(
        input_shape[-1], use_bias=False,
        kernel_initializer=keras.initializers.Identity(gain=gain))
  modules = [InterlockModule([dense(1.0)], aux_head=dense(-1.0)),
             InterlockModule([dense(1.0)])]
  for module in modules:
    module.build((None,) + tuple(input_shape))
  return modules


def _cross_entropy(logits, labels):
  """Mean softmax cross-entropy in NumPy, independent of the code under test."""
  shifted = logits - logits.max(axis=-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
  return -np.take_along_axis(log_probs, labels[:, None], axis=-1).mean()


def _known_answer_dataset():
  # Batches of 3 and 1: a mean of batch means would give accuracies 1/3
  # (final) and 1/2 (exit 1) instead of the example-weighted 1/2 and 1/4.
  return tf.data.Dataset.from_tensor_slices((LOGITS, LABELS)).batch(3)


def _check_known_answer(results):
  # Heads are named as every per-module number: module 2 is the network.
  assert list(results) == ["module_1", "module_2"]
  assert results["module_2"]["num_examples"] == 4
  assert results["module_2"]["accuracy"] == pytest.approx(0.5)
  assert results["module_1"]["accuracy"] == pytest.approx(0.25)
  assert results["module_2"]["loss"] == pytest.approx(
      _cross_entropy(LOGITS, LABELS), rel=1e-6)
  assert results["module_1"]["loss"] == pytest.approx(
      _cross_entropy(-LOGITS, LABELS), rel=1e-6)


def test_known_answer_in_memory():
  _check_known_answer(evaluation.evaluate_modules(
      _identity_modules((3,)), _known_answer_dataset()))


def test_known_answer_from_saved_model(tmp_path):
  export.export_saved_model(_identity_modules((3,)),
                            tf.TensorSpec((None, 3), tf.float32),
                            tmp_path / "export")
  _check_known_answer(evaluation.evaluate_saved_model(
      tmp_path / "export", _known_answer_dataset()))


def test_uniform_lm_has_perplexity_of_vocabulary_size():
  vocab = 7
  logits = np.zeros((5, 4, vocab), dtype="float32")
  labels = np.random.default_rng(0).integers(0, vocab, size=(5, 4))
  dataset = tf.data.Dataset.from_tensor_slices((logits, labels)).batch(2)
  results = evaluation.evaluate_modules(
      _identity_modules((4, vocab)), dataset, metric_fn=None, task="lm")
  for metrics in results.values():
    assert set(metrics) == {"loss", "perplexity", "num_examples"}
    assert metrics["num_examples"] == 5
    assert metrics["loss"] == pytest.approx(math.log(vocab), rel=1e-6)
    assert metrics["perplexity"] == pytest.approx(vocab, rel=1e-6)


def _assert_same_results(in_memory, saved):
  assert list(in_memory) == list(saved)
  for head in in_memory:
    assert set(in_memory[head]) == set(saved[head])
    assert in_memory[head]["num_examples"] == saved[head]["num_examples"]
    for key, value in in_memory[head].items():
      assert saved[head][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (
          head, key)


def test_a_module_without_head_has_no_exit_and_keeps_the_numbering(tmp_path):
  # K = 3, module 2 headless: the network is module_3 in memory and in the
  # export (which records K), not the module after the deepest exit.
  modules = _identity_modules((3,))
  middle = InterlockModule([keras.layers.Dense(
      3, use_bias=False, kernel_initializer="identity")])
  middle.build((None, 3))
  modules.insert(1, middle)
  export.export_saved_model(modules, tf.TensorSpec((None, 3), tf.float32),
                            tmp_path / "export")
  in_memory = evaluation.evaluate_modules(modules, _known_answer_dataset())
  saved = evaluation.evaluate_saved_model(tmp_path / "export",
                                          _known_answer_dataset())
  assert list(in_memory) == ["module_1", "module_3"]
  assert in_memory["module_3"]["accuracy"] == pytest.approx(0.5)
  assert in_memory["module_1"]["accuracy"] == pytest.approx(0.25)
  _assert_same_results(in_memory, saved)


def test_resnet_in_memory_and_saved_model_agree(tmp_path):
  shape = (16, 16, 3)
  # One block per stage (ResNet-8): still conv + BN, and quick to trace.
  modules = resnet.resnet_modules("resnet20", 10, 3, width=0.25,
                                  stage_blocks=(1, 1, 1), aux_head="pool",
                                  input_shape=shape)
  input_shape = (None,) + shape
  for module in modules:
    module.build(input_shape)
    input_shape = module.body.compute_output_shape(input_shape)
  rng = np.random.default_rng(0)
  images = rng.normal(size=(10,) + shape).astype("float32")
  labels = rng.integers(0, 10, size=(10,))
  dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(4)
  export.export_saved_model(modules, tf.TensorSpec((None,) + shape),
                            tmp_path / "export")
  in_memory = evaluation.evaluate_modules(modules, dataset)
  saved = evaluation.evaluate_saved_model(tmp_path / "export", dataset)
  assert list(in_memory) == ["module_1", "module_2", "module_3"]
  assert set(in_memory["module_3"]) == {"loss", "accuracy", "num_examples"}
  assert in_memory["module_3"]["num_examples"] == 10
  _assert_same_results(in_memory, saved)


def test_lm_in_memory_and_saved_model_agree(tmp_path):
  vocab, seq = 37, 8
  modules = transformer.transformer_lm_modules(vocab, seq, 2, 16, 2, 32, 2)
  input_shape = (None, seq)
  for module in modules:
    module.build(input_shape)
    input_shape = module.body.compute_output_shape(input_shape)
  # int64 ids, as NumPy makes them: the saved model casts them to int32.
  ids = np.random.default_rng(0).integers(0, vocab, size=(7, seq + 1))
  dataset = tf.data.Dataset.from_tensor_slices(
      (ids[:, :-1], ids[:, 1:])).batch(3)
  export.export_saved_model(modules, tf.TensorSpec((None, seq), tf.int32),
                            tmp_path / "export")
  in_memory = evaluation.evaluate_modules(modules, dataset, metric_fn=None,
                                          task="lm")
  saved = evaluation.evaluate_saved_model(tmp_path / "export", dataset,
                                          task="lm")
  assert list(in_memory) == ["module_1", "module_2"]
  _assert_same_results(in_memory, saved)
  for metrics in saved.values():
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["loss"]))


def test_rejects_infinite_dataset_and_unknown_task():
  dataset = _known_answer_dataset()
  with pytest.raises(ValueError, match="must be finite"):
    evaluation.evaluate_modules(_identity_modules((3,)), dataset.repeat())
  with pytest.raises(ValueError, match="Received: task='regression'"):
    evaluation.evaluate_modules(_identity_modules((3,)), dataset,
                                task="regression")


def test_rejects_empty_dataset():
  dataset = _known_answer_dataset().take(0)
  with pytest.raises(ValueError, match="Received: num_examples=0"):
    evaluation.evaluate_modules(_identity_modules((3,)), dataset)


def test_repeated_evaluations_trace_once_and_see_new_weights():
  """Six evaluations of the same modules share one traced step (no
  "triggered tf.function retracing" warnings), and still read the weights
  as they are at each call."""
  modules = _identity_modules((3,))
  for _ in range(6):
    _check_known_answer(evaluation.evaluate_modules(
        modules, _known_answer_dataset()))
  functions = modules[0].__dict__["_interlock_eval_functions"]
  assert len(functions) == 1
  # Batches of 3 then 1: one batch-polymorphic trace (reduce_retracing).
  assert list(functions.values())[0].experimental_get_tracing_count() <= 2
  (kernel,) = modules[1].trainable_weights  # its one Dense, no aux head
  kernel.assign(-np.eye(3, dtype="float32"))
  results = evaluation.evaluate_modules(modules, _known_answer_dataset())
  assert results["module_2"]["loss"] == pytest.approx(
      _cross_entropy(-LOGITS, LABELS), rel=1e-6)


def test_an_export_with_another_exports_variables_is_one_line(tmp_path):
  """variables/ copied from a smaller export leaves objects unbound: TF's
  AssertionError becomes one ValueError naming the export."""
  small, large = str(tmp_path / "small"), str(tmp_path / "large")
  export.export_saved_model(_identity_modules((3,)),
                            tf.TensorSpec([None, 3]), small)
  three = _identity_modules((3,)) + [InterlockModule([keras.layers.Dense(
      3, use_bias=False)])]
  three[-1].build((None, 3))
  export.export_saved_model(three, tf.TensorSpec([None, 3]), large)
  shutil.rmtree(os.path.join(large, "variables"))
  shutil.copytree(os.path.join(small, "variables"),
                  os.path.join(large, "variables"))
  with pytest.raises(ValueError) as e:
    evaluation.evaluate_saved_model(large, _known_answer_dataset())
  message = str(e.value)
  assert message.startswith(f"the export at {large} does not load: its "
                            "variables/ do not match"), message
  assert message.endswith(f"Received: export_dir={large!r}")
  assert "\n" not in message
