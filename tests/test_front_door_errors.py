"""Misuse of the Keras front door and a malformed TF_CONFIG: one line that
names the value (tf_interlock/keras/fit_checks.py, train/multi_worker.py)."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_interlock as ti
from train import multi_worker

X = np.random.RandomState(0).rand(64, 8).astype("float32")
Y = np.random.RandomState(1).randint(0, 3, 64)


def _net():
  return keras.Sequential([keras.Input((8,)),
                           keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(3)])


def _model(**compile_args):
  model = ti.InterlockModel(ti.from_keras(_net(), 2), strategy="2wise")
  model.compile("adam", **compile_args)
  return model


@pytest.mark.parametrize("model, num_modules, received", [
    (keras.Sequential([keras.Input((8,))]), 2,
     "model='sequential' with 0 layers"),
    (None, "2", "num_modules='2'"),
    (None, 0, "num_modules=0"),
    (None, True, "num_modules=True"),
])
def test_from_keras_refuses_in_one_line(model, num_modules, received):
  with pytest.raises(ValueError) as e:
    ti.from_keras(model if model is not None else _net(), num_modules)
  assert str(e.value).endswith("Received: " + received), str(e.value)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("x, y, fit_args, received", [
    ([X], Y, {}, "x=list of 1 array"),
    (X, Y[:50], {}, "len(x)=64, len(y)=50"),
    (X, Y, {"batch_size": -16}, "batch_size=-16"),
    (X, Y, {"batch_size": 16.5}, "batch_size=16.5"),
    (X, Y, {"batch_size": 0}, "batch_size=0"),
    (X, Y, {"steps_per_execution": 100}, "steps_per_execution=100"),
    # Keras returns an empty History: nothing trained, not a word.
    (X, Y, {"epochs": -1}, "epochs=-1"),
    (X, Y, {"epochs": 2, "initial_epoch": 2}, "epochs=2"),
    (X, Y, {"epochs": 1.5}, "epochs=1.5"),
    (X, Y, {"initial_epoch": -1}, "initial_epoch=-1"),
    # Before the first build: the width from_keras's source model takes.
    (X[:, :5], Y, {}, "x.shape=(64, 5)"),
    (X[:, :, None], Y, {}, "x.shape=(64, 8, 1)"),
])
def test_fit_refuses_in_one_line(x, y, fit_args, received):
  model = _model()
  with pytest.raises(ValueError) as e:
    model.fit(x, y, verbose=0, **fit_args)
  assert str(e.value).endswith("Received: " + received), str(e.value)
  assert "\n" not in str(e.value)
  assert not model.built  # refused before anything was built or trained


def test_evaluate_and_a_built_fit_refuse_in_one_line():
  model = _model()
  model.fit(X, Y, verbose=0)
  weights = [w.numpy() for w in model.weights]
  for call, received in (
      (lambda: model.evaluate(X, Y[:10], verbose=0), "len(x)=64, len(y)=10"),
      (lambda: model.evaluate(X[:, :5], Y, verbose=0), "x.shape=(64, 5)"),
      (lambda: model.fit(X[:, :5], Y, verbose=0), "x.shape=(64, 5)")):
    with pytest.raises(ValueError) as e:
      call()
    assert str(e.value).endswith("Received: " + received), str(e.value)
    assert "\n" not in str(e.value)
  assert all(np.array_equal(a, w.numpy()) for a, w in zip(weights,
                                                          model.weights))
  # What is right still runs: evaluate returns every exit's numbers.
  assert "module_2/loss" in model.evaluate(X, Y, verbose=0, return_dict=True)


@pytest.mark.parametrize("value", [0, 33, 100, 2.0, "4"])
def test_compile_caps_steps_per_execution(value):
  with pytest.raises(ValueError) as e:
    _model(steps_per_execution=value)
  assert str(e.value).endswith(f"Received: steps_per_execution={value!r}")


def test_a_model_exports_into_a_new_folder_and_replaces_none(tmp_path):
  model = _model()
  model.fit(X, Y, batch_size=16, verbose=0)
  target = str(tmp_path / "export")
  model.export_saved_model(target)
  loaded = tf.saved_model.load(target)
  want = model.predict(X[:4], verbose=0)
  got = loaded.signatures["serving_default"](tf.constant(X[:4]))
  np.testing.assert_allclose(list(got.values())[0].numpy(), want, rtol=1e-5,
                             atol=1e-5)
  before = sorted(os.listdir(target))
  model.fit(X, Y, batch_size=16, verbose=0)  # weights change
  with pytest.raises(ValueError, match="is not empty") as info:
    model.export_saved_model(target)  # even its own export: refused
  assert str(info.value).endswith(f"Received: export_dir={target!r}")
  assert sorted(os.listdir(target)) == before


@pytest.mark.parametrize("text, words", [
    ("[1,2]", "not a JSON list"),
    ('"str"', "not a JSON str"),
    ('{"task": 5}', "its 'task' must be an object"),
    ("{not json", "it is not JSON"),
    ('{"task": {"type": "worker", "index": -1}}', "task.index must be"),
    ('{"cluster": {"worker": "h:1"}}', "must be a list of host:port"),
    ('{"cluster": {"worker": [1, 2]}, "task": {"type": "worker"}}',
     "must be a list of host:port"),
    # Else a "ps" task trained alone, exit 0; the others were TF's lines
    # without TF_CONFIG's name.
    ('{"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", '
     '"index": 0}}', "task.type must be 'chief' or 'worker'"),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", '
     '"index": 5}}', "task.index=5 must name one of the 1 'worker' tasks"),
    ('{"cluster": {"worker": ["nohost"]}, "task": {"type": "worker", '
     '"index": 0}}', "cluster entry 'nohost' is not host:port"),
])
def test_a_malformed_tf_config_is_one_line(monkeypatch, text, words):
  monkeypatch.setenv("TF_CONFIG", text)
  with pytest.raises(ValueError) as e:
    multi_worker.num_tasks()
  message = str(e.value)
  assert message.startswith("TF_CONFIG must be a JSON object"), message
  assert words in message and message.endswith(
      f"Received: TF_CONFIG={text!r}"), message
