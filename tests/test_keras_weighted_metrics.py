"""`compile(weighted_metrics=...)` and the keras_hub tasks' "auto" defaults.

Weighted metrics are checked against plain Keras itself: e2e `fit` makes
the same updates as Keras's `fit`, so every step sees the same
predictions, and the logged weighted metrics (training, validation,
`evaluate`) must be Keras's, per example and per token. A split
`GPT2CausalLM` compiled with `compile("adam")` logs what the task's own
`compile("adam")` logs, and a `.keras` save keeps what "auto" means.
"""

import keras
import numpy as np
import pytest

from tests import keras_models
from tf_interlock.keras import split as keras_split
from tf_interlock.keras.model import InterlockModel

BATCH, CLASSES, T = 8, 5, 6
VOCAB, LENGTH, LM_BATCH = 32, 8, 4


def small_model(per_token, seed=0):
  """Logits [batch, CLASSES], or [batch, T, CLASSES] when `per_token`."""
  keras.utils.set_random_seed(seed)
  inputs = keras.Input((T, 4) if per_token else (4,))
  h = keras.layers.Dense(8, activation="relu")(inputs)
  h = keras.layers.Dense(8, activation="relu")(h)
  return keras.Model(inputs, keras.layers.Dense(CLASSES)(h))


def small_data(per_token, num=4 * BATCH, seed=0):
  """(x, y, w): a weight per token is a padding mask (a prefix of each
  sequence), a weight per example any non-negative number (some 0)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num, T, 4) if per_token else (num, 4))
  y = rng.integers(0, CLASSES, size=(num, T) if per_token else num)
  if per_token:
    w = np.arange(T) < rng.integers(1, T + 1, size=(num, 1))
  else:
    w = rng.uniform(0.0, 2.0, size=num) * (rng.uniform(size=num) > 0.25)
  return x.astype("float32"), y.astype("int32"), w.astype("float32")


def split(model, num_modules=2, strategy="e2e"):
  return InterlockModel(keras_split.from_keras(model, num_modules),
                        strategy=strategy, placement="simulated")


def loss():
  return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.mark.parametrize("per_token", [False, True])
def test_e2e_weighted_metrics_equal_keras_fit_and_evaluate(per_token):
  x, y, w = small_data(per_token)
  val = small_data(per_token, num=2 * BATCH, seed=1)
  metrics = dict(metrics=["accuracy"], weighted_metrics=["accuracy"])
  kwargs = dict(sample_weight=w, validation_data=val, batch_size=BATCH,
                epochs=2, shuffle=False, verbose=0)
  plain = small_model(per_token)
  plain.compile(keras.optimizers.Adam(1e-2), loss(), **metrics)
  want = plain.fit(x, y, **kwargs).history
  model = split(small_model(per_token))
  model.compile(keras.optimizers.Adam(1e-2), loss(), steps_per_execution=2,
                **metrics)
  got = model.fit(x, y, **kwargs).history
  # Keras's names: the weighted copy of a metric that metrics= has too is
  # "weighted_<name>".
  assert set(want) == {"loss", "accuracy", "weighted_accuracy", "val_loss",
                       "val_accuracy", "val_weighted_accuracy"}
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6,
                               err_msg=key)
  for k in (1, 2):  # every exit its copy
    assert f"module_{k}/weighted_accuracy" in got
    assert f"val_module_{k}/weighted_accuracy" in got
  # The weights matter: the accuracy over the weighted examples or tokens.
  assert not np.allclose(got["weighted_accuracy"], got["accuracy"])
  evaluated = [m.evaluate(*val[:2], sample_weight=val[2], batch_size=BATCH,
                          verbose=0, return_dict=True) for m in (plain, model)]
  for key in evaluated[0]:
    np.testing.assert_allclose(evaluated[1][key], evaluated[0][key],
                               rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("metrics, weighted", [
    ([], ["accuracy"]),
    ([], ["sparse_categorical_accuracy"]),
    (["accuracy"], ["acc", "accuracy"]),
    (["accuracy"], ["accuracy", "accuracy"]),
    ([keras.metrics.SparseTopKCategoricalAccuracy(k=2)],
     [keras.metrics.SparseTopKCategoricalAccuracy(k=2), "accuracy"]),
])
def test_weighted_metrics_are_named_as_keras_names_them(metrics, weighted):
  x, y, w = small_data(False, num=BATCH)
  plain = small_model(False)
  plain.compile("sgd", loss(), metrics=metrics, weighted_metrics=weighted)
  want = plain.train_on_batch(x, y, sample_weight=w, return_dict=True)
  model = split(small_model(False))
  model.compile("sgd", loss(), metrics=metrics, weighted_metrics=weighted)
  got = model.train_on_batch(x, y, sample_weight=w, return_dict=True)
  assert {key for key in got if "/" not in key} == set(want)


def test_without_weights_weighted_metrics_equal_the_unweighted():
  x, y, _ = small_data(True)
  model = split(small_model(True), strategy="2wise")
  model.compile("adam", metrics=["accuracy"], weighted_metrics=["accuracy"])
  got = model.fit(x, y, batch_size=BATCH, verbose=0).history
  for prefix in ("", "module_1/", "module_2/"):
    np.testing.assert_allclose(got[f"{prefix}weighted_accuracy"],
                               got[f"{prefix}accuracy"], rtol=1e-6)


def test_auto_on_a_plain_model_is_todays_default_and_round_trips():
  x, y, _ = small_data(False, num=2 * BATCH)
  model = split(small_model(False))
  model.compile()  # metrics and weighted_metrics "auto": none
  logs = model.fit(x, y, batch_size=BATCH, verbose=0).history
  assert not [key for key in logs if "accuracy" in key]
  model.compile(optimizer="auto", loss="auto", weighted_metrics=["accuracy"])
  again = split(small_model(False))
  again.compile_from_config(model.get_compile_config())
  # What evaluate logs (fit's grad_norm trackers stay from the fit above).
  names = [[name for name in m.metrics_names if "grad_norm" not in name]
           for m in (model, again)]
  assert names[0] == names[1]
  assert "accuracy" in names[1] and "weighted_accuracy" not in names[1]


@pytest.mark.parametrize("kwargs, received", [
    (dict(weighted_metrics=5), "weighted_metrics=5"),
    (dict(weighted_metrics=["nope"]), "weighted_metrics='nope'"),
    (dict(weighted_metrics=[keras.metrics.AUC()]), "weighted_metrics=<AUC"),
    (dict(weighted_metrics={"logits": "accuracy"}),
     "weighted_metrics={'logits': 'accuracy'}"),
])
def test_bad_weighted_metrics_are_one_line(kwargs, received):
  model = split(small_model(False))
  with pytest.raises(ValueError, match="Received: " + received) as info:
    model.compile("sgd", **kwargs)
  assert "\n" not in str(info.value)


def test_weights_that_cannot_weigh_a_metric_are_one_line():
  # A metric of one value per example, weights per token.
  x, y, w = small_data(True, num=BATCH)
  model = split(small_model(True))
  model.compile("sgd", weighted_metrics=[
      lambda y_true, y_pred: keras.ops.max(y_pred, axis=(1, 2))])
  with pytest.raises(ValueError, match=(
      r"sample_weight of shape \(batch, 6\) cannot weigh the weighted "
      r"metric '<lambda>', whose values have shape \(batch,\).* Received: "
      r"sample_weight.shape=\(batch, 6\)")) as info:
    model.train_on_batch(x, y, sample_weight=w)
  assert "\n" not in str(info.value)


def causal_lm():
  return keras_models.gpt2_causal_lm(VOCAB, LENGTH)


def lm_fit(model, data, epochs=2):
  x, y, w = data
  return model.fit(x, y, sample_weight=w, batch_size=LM_BATCH, epochs=epochs,
                   shuffle=False, verbose=0).history


@pytest.mark.slow
def test_a_split_causal_lm_logs_the_tasks_weighted_accuracy():
  data = keras_models.lm_data(4 * LM_BATCH, VOCAB, LENGTH, seed=2)
  task = causal_lm()
  task.compile("adam")  # weighted_metrics="auto"
  want = lm_fit(task, data)
  model = split(causal_lm(), 3)
  model.compile("adam")
  got = lm_fit(model, data)
  assert set(want) == {"loss", "sparse_categorical_accuracy"}
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6,
                               err_msg=key)
  for k in (1, 2, 3):
    assert f"module_{k}/sparse_categorical_accuracy" in got


@pytest.mark.slow
def test_a_keras_save_keeps_what_auto_means(tmp_path):
  data = keras_models.lm_data(2 * LM_BATCH, VOCAB, LENGTH, seed=3)
  modules = keras_split.from_keras(causal_lm(), 2)
  defaults = modules[-1].body.compile_defaults
  assert [m["class_name"] for m in defaults["weighted_metrics"]] == [
      "SparseCategoricalAccuracy"]
  assert defaults["metrics"] is None
  model = InterlockModel(modules, strategy="2wise")
  model.compile(optimizer="auto")  # the task's Adam(2e-5)
  lm_fit(model, data, epochs=1)
  model.save(tmp_path / "lm.keras")
  loaded = keras.models.load_model(tmp_path / "lm.keras")
  assert loaded.modules[-1].body.compile_defaults == defaults
  assert float(loaded.optimizer.learning_rate) == pytest.approx(2e-5)
  x, y, w = data
  evaluated = [m.evaluate(x, y, sample_weight=w, batch_size=LM_BATCH,
                          verbose=0, return_dict=True)
               for m in (model, loaded)]
  assert "module_1/sparse_categorical_accuracy" in evaluated[1]
  for key in evaluated[0]:
    np.testing.assert_allclose(evaluated[1][key], evaluated[0][key],
                               rtol=1e-6, err_msg=key)
  loaded.compile("sgd")  # a new compile's "auto", from the saved modules
  assert "sparse_categorical_accuracy" in loaded.metrics_names
