"""keras_hub task models as their users drive them, split by from_keras.

Tiny random-weight configurations (nothing is downloaded), no
preprocessor: `compile` with no loss trains with the task's own default
loss, as the unsplit task's `compile` does; per-token `sample_weight` (the
padding mask) weighs every module's loss as Keras weighs the task's; the
task classes named by issue 45 split, train and reload; bad shapes are
refused in one line.
"""

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from tests import keras_models
from tf_interlock.keras import split as keras_split
from tf_interlock.keras.model import InterlockModel

pytestmark = pytest.mark.slow

VOCAB, LENGTH, BATCH = 32, 8, 4


def gpt2_causal_lm(seed=0):
  return keras_models.gpt2_causal_lm(VOCAB, LENGTH, seed)


def lm_data(num=2 * BATCH, seed=0):
  return keras_models.lm_data(num, VOCAB, LENGTH, seed)


def classifier_data(num=2 * BATCH, seed=3, classes=3):
  x, _, _ = lm_data(num, seed)
  y = np.random.default_rng(seed).integers(0, classes, size=num)
  return x, y.astype("int32")


def fit(model, x, y, sample_weight=None, epochs=2):
  return model.fit(x, y, sample_weight=sample_weight, batch_size=BATCH,
                   epochs=epochs, shuffle=False, verbose=0).history


def test_causal_lm_with_no_loss_and_per_token_weights_equals_the_task():
  x, y, weights = lm_data()
  task = gpt2_causal_lm()
  # The task's own compile: loss="auto", SparseCategoricalCrossentropy(
  # from_logits=True).
  task.compile(keras.optimizers.Adam(1e-2))
  want = fit(task, x, y, weights)
  model = InterlockModel(keras_split.from_keras(gpt2_causal_lm(), 3),
                         strategy="e2e", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2))
  got = fit(model, x, y, weights)
  np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
  for name in ("transformer_layer_0", "transformer_layer_1"):
    for a, b in zip(model.get_layer(name).weights,
                    task.backbone.get_layer(name).weights, strict=True):
      np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)
  np.testing.assert_allclose(model.predict(x, verbose=0),
                             task.predict(x, verbose=0), atol=1e-5)


def test_padded_tokens_count_in_no_module_loss_with_the_default_loss():
  # Other labels where the weight is 0: every module's loss (the aux
  # heads' per-token losses too) is the same; where it is 1, not.
  x, y, weights = lm_data(seed=1)
  padded = np.where(weights > 0, y, (y + 5) % VOCAB)
  unpadded = np.where(weights > 0, (y + 5) % VOCAB, y)
  assert not np.array_equal(padded, y)
  model = InterlockModel(keras_split.from_keras(gpt2_causal_lm(), 3),
                         strategy="2wise", placement="simulated")
  model.compile(keras.optimizers.SGD(0.0))
  runs = [fit(model, x, labels, weights, epochs=1)
          for labels in (y, padded, unpadded)]
  for k in range(1, 4):
    key = f"module_{k}/loss"
    np.testing.assert_allclose(runs[0][key], runs[1][key], rtol=1e-6)
    assert not np.allclose(runs[0][key], runs[2][key]), key


def bert_classifier(activation=None, seed=0):
  keras.utils.set_random_seed(seed)
  backbone = keras_hub.models.BertBackbone(
      vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
      intermediate_dim=32, max_sequence_length=LENGTH, dropout=0.0)
  return keras_hub.models.BertTextClassifier(
      backbone, num_classes=3, preprocessor=None, activation=activation,
      dropout=0.0)


@pytest.mark.parametrize("activation", [None, "softmax"])
def test_text_classifier_with_no_loss_equals_the_task(activation):
  # With activation="softmax" the task's default loss takes probabilities
  # (from_logits=False): the generic default would train on them as
  # logits.
  x, y = classifier_data()
  x["segment_ids"] = np.zeros_like(x["token_ids"])
  task = bert_classifier(activation)
  task.compile(keras.optimizers.Adam(1e-2))
  want = fit(task, x, y)
  modules = keras_split.from_keras(bert_classifier(activation), 2)
  assert modules[-1].body.default_loss["config"]["from_logits"] == (
      activation is None)
  model = InterlockModel(modules, strategy="e2e", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2))
  got = fit(model, x, y)
  np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
  np.testing.assert_allclose(model.predict(x, verbose=0),
                             task.predict(x, verbose=0), atol=1e-5)


def llama_causal_lm():
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.LlamaBackbone(
      vocabulary_size=VOCAB, num_layers=2, num_query_heads=2,
      num_key_value_heads=1, hidden_dim=16, intermediate_dim=32,
      dropout=0.0)
  return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def distil_bert_classifier():
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.DistilBertBackbone(
      vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
      intermediate_dim=32, max_sequence_length=LENGTH, dropout=0.0)
  return keras_hub.models.DistilBertTextClassifier(
      backbone, num_classes=3, preprocessor=None, dropout=0.0)


def roberta_classifier():
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.RobertaBackbone(
      vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
      intermediate_dim=32, max_sequence_length=LENGTH, dropout=0.0)
  return keras_hub.models.RobertaTextClassifier(
      backbone, num_classes=3, preprocessor=None, dropout=0.0)


def test_llama_causal_lm_is_refused_in_one_line_naming_its_decoder(tmp_path):
  # keras_hub 0.32's LlamaTransformerDecoder.get_config reads
  # self.rope_scaling_factor, which its constructor never sets: the
  # layer has no config to rebuild it from. The task saves whole (its
  # backbone saves its own arguments), which the split cannot use.
  task = llama_causal_lm()
  task.save(tmp_path / "whole.keras")
  with pytest.raises(ValueError, match=(
      r"from_keras rebuilds every layer from its config, and layer "
      r"'transformer_layer_0' \(keras_hub.*LlamaTransformerDecoder\) cannot "
      r"give one: its get_config raises AttributeError: .*rope_scaling_factor"
      r".* Received: model=")) as info:
    keras_split.from_keras(task, 3)
  assert "\n" not in str(info.value)


@pytest.mark.parametrize("make", [distil_bert_classifier, roberta_classifier])
def test_task_splits_trains_with_its_default_loss_and_reloads(make, tmp_path):
  task = make()
  if isinstance(task, keras_hub.models.CausalLM):
    x, y, weights = lm_data(seed=4)
  else:
    (x, y), weights = classifier_data(seed=4), None
  modules = keras_split.from_keras(task, 3)
  assert modules[-1].body.default_loss is not None
  model = InterlockModel(modules, strategy="2wise")
  model.compile(keras.optimizers.Adam(1e-2))
  # Module 1 and its aux head, before and after: trained by their loss.
  before = model.predict(x, exit=1, verbose=0)
  history = fit(model, x, y, weights)
  assert history["loss"][-1] < history["loss"][0]
  assert history["module_1/loss"][-1] < history["module_1/loss"][0]
  assert not np.allclose(model.predict(x, exit=1, verbose=0), before)
  model.save(tmp_path / "task.keras")
  loaded = keras.models.load_model(tmp_path / "task.keras")
  np.testing.assert_array_equal(loaded.predict(x, verbose=0),
                                model.predict(x, verbose=0))
  # The reloaded modules keep the task's default loss for a new compile.
  assert loaded.modules[-1].body.default_loss == modules[-1].body.default_loss
  loaded.compile(keras.optimizers.SGD(0.0))
  np.testing.assert_allclose(
      loaded.evaluate(x, y, sample_weight=weights, batch_size=BATCH,
                      verbose=0, return_dict=True)["loss"],
      model.evaluate(x, y, sample_weight=weights, batch_size=BATCH,
                     verbose=0, return_dict=True)["loss"], rtol=1e-6)


@pytest.mark.parametrize("weights, match", [
    (np.ones((2 * BATCH, LENGTH + 1), "float32"),
     r"sample_weight needs one weight per example .* Received: "
     r"sample_weight.shape=\(8, 9\) for y.shape=\(8, 8\)"),
    (np.ones((2 * BATCH, 3), "float32"),
     r"Received: sample_weight.shape=\(8, 3\)"),
])
def test_a_sample_weight_of_a_wrong_shape_is_one_line(weights, match):
  x, y, _ = lm_data()
  model = InterlockModel(keras_split.from_keras(gpt2_causal_lm(), 2))
  model.compile("sgd")
  with pytest.raises(ValueError, match=match) as info:
    fit(model, x, y, weights, epochs=1)
  assert "\n" not in str(info.value)
  assert not model.built  # refused before a batch was read


def test_a_dataset_weight_of_a_wrong_shape_is_one_line():
  x, y, _ = lm_data()
  dataset = tf.data.Dataset.from_tensor_slices(
      (x, y, np.ones((2 * BATCH, 2, 4), "float32"))).batch(
          BATCH, drop_remainder=True)
  model = InterlockModel(keras_split.from_keras(gpt2_causal_lm(), 2))
  model.compile("sgd")
  with pytest.raises(ValueError, match=(
      r"sample_weight of shape \(batch, 2, 4\) cannot weigh the loss, "
      r"which gives one value per position, shape \(batch, 8\)")) as info:
    model.fit(dataset, verbose=0)
  assert "\n" not in str(info.value)


def test_labels_that_do_not_match_the_outputs_are_one_line():
  # One label per sequence for a model that predicts every token.
  x, y, _ = lm_data()
  model = InterlockModel(keras_split.from_keras(gpt2_causal_lm(), 2))
  model.compile("sgd")
  with pytest.raises(ValueError, match=(
      r"The loss cannot take labels of shape \(batch,\) with outputs of "
      r"shape \(batch, 8, 32\) .* Received: "
      r"loss=SparseCategoricalCrossentropy, y.shape=\(batch,\)")) as info:
    fit(model, x, y[:, 0], epochs=1)
  assert "\n" not in str(info.value)
