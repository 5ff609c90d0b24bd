"""InterlockModel: compile/fit/evaluate/predict/save under interlocking."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.keras_models import assert_on_devices, sequential_cnn
from tf_interlock import export as export_lib
from tf_interlock.keras import split as keras_split
from tf_interlock import placement as placement_lib
from tf_interlock.keras.model import InterlockModel
from tf_interlock.trainer import InterlockTrainer

BATCH = 8
SIZE = 8  # Small images keep the tests fast.


def data(num=4 * BATCH, seed=0, size=SIZE):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num, size, size, 1)).astype("float32")
  return x, rng.integers(0, 10, size=num).astype("int32")


def cnn_model(strategy="2wise", steps_per_execution=2, size=SIZE,
              **compile_kwargs):
  model = InterlockModel(keras_split.from_keras(sequential_cnn(size=size), 3),
                         strategy=strategy, placement="simulated")
  compile_kwargs.setdefault("optimizer", keras.optimizers.SGD(0.05))
  model.compile(metrics=["accuracy"], steps_per_execution=steps_per_execution,
                **compile_kwargs)
  return model


def module_weights(model):
  return [v.numpy().copy() for m in model.interlock_modules for v in m.weights]


def iterations(model):
  return [int(o.iterations) for o in model.trainer.optimizers]


class StopAt(keras.callbacks.Callback):
  """Interrupts training when `epoch` begins, as a crash would."""

  def __init__(self, epoch):
    super().__init__()
    self.epoch = epoch

  def on_epoch_begin(self, epoch, logs=None):
    if epoch == self.epoch:
      raise RuntimeError("interrupted")


def test_fit_with_callbacks_trains_every_module_then_resumes(tmp_path):
  x, y = data()
  model = cnn_model()
  model.build(x.shape)
  start = module_weights(model)
  assert_on_devices(model.trainer, model.placement)
  backup = str(tmp_path / "backup")
  callbacks = [
      keras.callbacks.EarlyStopping(monitor="val_loss", patience=5),
      keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras")),
      keras.callbacks.TensorBoard(str(tmp_path / "tb")),
      keras.callbacks.BackupAndRestore(backup)]
  # 3 steps per epoch with 2 per call: calls of 2 and 1 steps.
  with pytest.raises(RuntimeError, match="interrupted"):
    model.fit(x[:24], y[:24], batch_size=BATCH, epochs=3, verbose=0,
              validation_data=(x[24:], y[24:]),
              callbacks=callbacks + [StopAt(2)])
  assert iterations(model) == [6, 6, 6]
  end = module_weights(model)
  # Every module's body and head moved (not only the last module's).
  changed = [not np.allclose(a, b) for a, b in zip(start, end)]
  per_module = np.split(np.array(changed), np.cumsum(
      [len(m.weights) for m in model.interlock_modules])[:-1])
  assert all(c.any() for c in per_module)
  assert os.path.exists(tmp_path / "best.keras")
  assert tf.io.gfile.glob(str(tmp_path / "tb" / "train" / "*"))
  # A fresh process's model resumes from the backup: epoch 2 only, with
  # every module's weights and optimizer state.
  resumed = cnn_model()
  history = resumed.fit(x[:24], y[:24], batch_size=BATCH, epochs=3,
                        verbose=0, validation_data=(x[24:], y[24:]),
                        callbacks=[keras.callbacks.BackupAndRestore(backup)])
  assert iterations(resumed) == [9, 9, 9]
  assert history.epoch == [2]
  for key in ("loss", "accuracy", "val_loss", "module_1/loss",
              "module_2/accuracy", "module_3/grad_norm", "val_module_1/loss"):
    assert np.isfinite(history.history[key][0]), key
  # ModelCheckpoint's file loads back, placed, compiled, with its step counts.
  loaded = keras.models.load_model(tmp_path / "best.keras")
  assert iterations(loaded) == [6, 6, 6]
  assert_on_devices(loaded.trainer, loaded.placement)
  for a, b in zip(module_weights(loaded), end):
    np.testing.assert_array_equal(a, b)
  loaded.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
  assert iterations(loaded) == [10, 10, 10]


def test_fit_updates_equal_the_trainers():
  x, y = data(num=4 * BATCH, seed=3)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
      BATCH, drop_remainder=True)
  # A Loss with its own (sum) reduction: only its per-example values count.
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                    reduction="sum")
  model = cnn_model(steps_per_execution=2, loss=loss)
  model.fit(dataset, epochs=1, verbose=0)
  modules = keras_split.from_keras(sequential_cnn(size=SIZE), 3)
  trainer = InterlockTrainer(
      modules, lambda k: keras.optimizers.SGD(0.05), strategy="2wise",
      placement=placement_lib.make_placement("simulated", 3),
      steps_per_loop=2)
  trainer.build(x[:1])
  iterator = iter(trainer.distribute_dataset(dataset))
  trainer.train_loop(iterator)
  trainer.train_loop(iterator)
  want = [v.numpy() for m in modules for v in m.weights]
  for got, expected in zip(module_weights(model), want, strict=True):
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_fit_logs_are_each_epochs_step_means():
  # 3 steps an epoch, in calls of 2 and 1 steps; Keras resets the trackers
  # when an epoch begins: every log is the mean over that epoch's steps.
  x, y = data(num=3 * BATCH, seed=4)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
      BATCH, drop_remainder=True)
  model = cnn_model(steps_per_execution=2)
  history = model.fit(dataset, epochs=2, verbose=0)
  trainer = InterlockTrainer(
      keras_split.from_keras(sequential_cnn(size=SIZE), 3),
      lambda k: keras.optimizers.SGD(0.05), strategy="2wise",
      placement=placement_lib.make_placement("simulated", 3))
  trainer.build(x[:1])
  for epoch in range(2):
    iterator = iter(trainer.distribute_dataset(dataset))
    steps = [trainer.train_loop(iterator, num_steps=1) for _ in range(3)]
    for key in ("module_1/loss", "module_2/accuracy", "module_3/loss",
                "module_3/grad_norm"):
      assert history.history[key][epoch] == pytest.approx(
          np.mean([step[key] for step in steps]), rel=1e-5), (key, epoch)
  assert history.history["loss"] == history.history["module_3/loss"]
  assert history.history["accuracy"] == history.history["module_3/accuracy"]


def test_fit_under_another_strategy_than_the_models_raises(mirrored):
  x, y = data(num=2 * BATCH)
  model = InterlockModel(
      keras_split.from_keras(sequential_cnn(size=SIZE), 3), "2wise")
  model.compile("sgd", steps_per_execution=1)
  with mirrored.scope():
    with pytest.raises(ValueError, match="strategy=MirroredStrategy"):
      model.fit(x, y, batch_size=BATCH, verbose=0)
  assert iterations(model) == [0, 0, 0]


def test_fit_under_mirrored_strategy(mirrored):
  x, y = data(num=2 * BATCH)
  with mirrored.scope():
    model = InterlockModel(
        keras_split.from_keras(sequential_cnn(size=SIZE), 3), "2wise")
    model.compile("sgd", metrics="accuracy", steps_per_execution=2)
  history = model.fit(x, y, batch_size=BATCH, verbose=0,
                      validation_data=(x, y))
  assert [int(o.iterations.numpy()) for o in model.trainer.optimizers] == [
      2, 2, 2]
  # Validation runs each replica's share of the batch; the trackers must
  # combine them into the mean over all examples.
  per_example = keras.losses.sparse_categorical_crossentropy(
      y, model(x), from_logits=True)
  assert history.history["val_loss"][0] == pytest.approx(
      float(np.mean(per_example)), rel=1e-5)


def test_evaluate_predict_exits_save_and_export(tmp_path):
  x, y = data(num=20)
  model = cnn_model(strategy="local")
  model.fit(x[:16], y[:16], batch_size=BATCH, verbose=0)
  logs = model.evaluate(x, y, batch_size=6, verbose=0, return_dict=True)
  assert set(logs) == {"loss", "accuracy", "module_1/loss",
                       "module_1/accuracy", "module_2/loss",
                       "module_2/accuracy", "module_3/loss",
                       "module_3/accuracy"}
  assert logs["loss"] == logs["module_3/loss"]
  final = model.predict(x, batch_size=6, verbose=0)
  exit1 = model.predict(x, batch_size=6, verbose=0, exit=1)
  module = model.interlock_modules[0]
  np.testing.assert_allclose(
      exit1, module.aux_head(module.body(x)).numpy(), atol=1e-5)
  per_example = keras.losses.sparse_categorical_crossentropy(
      y, exit1, from_logits=True)
  assert logs["module_1/loss"] == pytest.approx(
      float(np.mean(per_example)), rel=1e-5)
  model.save(tmp_path / "model.keras")
  loaded = keras.models.load_model(tmp_path / "model.keras")
  assert loaded.interlock_strategy.name == "local"
  np.testing.assert_allclose(loaded.predict(x, verbose=0, exit=2),
                             model.predict(x, verbose=0, exit=2), atol=1e-6)
  export_dir = model.export_saved_model(str(tmp_path / "export"))
  served = export_lib.load_exported(export_dir)
  assert export_lib.exit_names(served) == ["exit_1", "exit_2"]
  np.testing.assert_allclose(
      served.signatures["serving_default"](inputs=tf.constant(x))["logits"],
      final, atol=1e-5)
  with pytest.raises(ValueError, match=r"one of \[1, 2\]. Received: exit=0"):
    model.predict(x, exit=0)


def test_compile_accepts_each_optimizer_form():
  x, y = data(num=BATCH)
  mine = keras.optimizers.Adam(1e-3)
  model = cnn_model(optimizer=mine, steps_per_execution=1)
  model.fit(x, y, batch_size=BATCH, verbose=0)
  assert iterations(model) == [1, 1, 1]
  assert int(mine.iterations) == 0  # Cloned: the user's instance is unused.
  for optimizer, kind, rates in (
      ("adam", keras.optimizers.Adam, [0.001] * 3),
      ([keras.optimizers.SGD(0.1 * k) for k in (1, 2, 3)],
       keras.optimizers.SGD, [0.1, 0.2, 0.3]),
      (lambda k: keras.optimizers.RMSprop(0.1 * (k + 1)),
       keras.optimizers.RMSprop, [0.1, 0.2, 0.3])):
    model = cnn_model(optimizer=optimizer)
    model.build(x.shape)
    assert_on_devices(model.trainer, model.placement)
    assert [type(o) for o in model.trainer.optimizers] == [kind] * 3
    # A factory cannot be saved: such a model is saved uncompiled.
    assert bool(model.get_compile_config()) == (not callable(optimizer))
    np.testing.assert_allclose(
        [float(o.learning_rate) for o in model.trainer.optimizers], rates,
        rtol=1e-6)


@pytest.mark.parametrize("compile_kwargs, match", [
    ({"optimizer": 42}, "Received: optimizer=42"),
    ({"optimizer": "adamm"}, "Received: optimizer='adamm'"),
    ({"optimizer": [keras.optimizers.SGD()]}, "Received: len\\(optimizer\\)=1"),
    ({"loss": "nope"}, "Received: loss='nope'"),
    ({"metrics": [keras.metrics.AUC()]},
     "Received: metrics="),
    ({"run_eagerly": True}, "Received: \\['run_eagerly'\\]"),
    ({"jit_compile": "on"}, "Received: jit_compile='on'"),
])
def test_compile_errors_name_the_argument(compile_kwargs, match):
  model = InterlockModel(keras_split.from_keras(sequential_cnn(size=SIZE), 3))
  with pytest.raises(ValueError, match=match):
    model.compile(**compile_kwargs)


def test_fit_errors_name_the_argument():
  x, y = data(num=2 * BATCH)
  model = InterlockModel(keras_split.from_keras(sequential_cnn(size=SIZE), 3))
  with pytest.raises(ValueError, match="Call compile\\(\\) before fit"):
    model.fit(x, y)
  model.compile(loss=lambda y_true, y_pred: tf.reduce_mean(y_pred))
  with pytest.raises(ValueError, match="one value per example"):
    model.fit(x, y, batch_size=BATCH, verbose=0)
  model.compile()
  examples = tf.data.Dataset.from_tensor_slices((x, y))
  fixed = examples.batch(4, drop_remainder=True)
  cases = [
      (dict(x=examples.batch(5)), "drop_remainder=True"),
      (dict(x=fixed.repeat()), "Received: steps_per_epoch=None"),
      (dict(x=fixed, steps_per_epoch=3), "must be None or 4"),
      (dict(x=x, y=y, class_weight={0: 1.0}), "Received: class_weight="),
      (dict(x=x[:3], y=y[:3]), "Received: batch_size=32"),
  ]
  for kwargs, match in cases:
    with pytest.raises(ValueError, match=match):
      model.fit(verbose=0, **kwargs)


@pytest.mark.parametrize("weighted", [False, True])
def test_e2e_fit_equals_plain_keras_fit(weighted):
  # The front door's honesty check: BN + Adam, unshuffled, same start; with
  # sample weights, Keras's default reduction sum(w * loss) / batch.
  x, y = data(num=4 * BATCH, seed=5)
  weights = (np.random.default_rng(6).uniform(0, 2, size=len(x)).astype(
      "float32") if weighted else None)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  plain = sequential_cnn(size=SIZE)
  plain.compile(keras.optimizers.Adam(1e-2), loss)
  want = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                   sample_weight=weights, verbose=0)
  model = InterlockModel(keras_split.from_keras(sequential_cnn(size=SIZE), 3),
                         strategy="e2e", placement="simulated")
  model.compile(keras.optimizers.Adam(1e-2), loss, steps_per_execution=2)
  got = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                  sample_weight=weights, verbose=0)
  np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                             rtol=1e-5)
  np.testing.assert_allclose(model.predict(x, verbose=0),
                             plain.predict(x, verbose=0), atol=1e-6)


def test_each_epoch_runs_its_steps_with_a_callback_list_of_the_users():
  # The epoch's step count comes from an on_epoch_begin callback that fit
  # adds; a user's own CallbackList (which Keras uses as given) gets it too.
  x, y = data()
  model = cnn_model()
  seen = []
  callbacks = keras.callbacks.CallbackList(
      [keras.callbacks.LambdaCallback(
          on_epoch_end=lambda epoch, logs: seen.append(iterations(model)))],
      add_history=True, model=model)
  # 3 steps per epoch with 2 per call: calls of 2 and 1 steps.
  model.fit(x[:24], y[:24], batch_size=BATCH, epochs=2, verbose=0,
            callbacks=callbacks)
  model.fit(x[:24], y[:24], batch_size=BATCH, epochs=1, verbose=0,
            callbacks=callbacks)
  assert seen == [[3, 3, 3], [6, 6, 6], [9, 9, 9]]
  # The user's callback, Keras's History, the epoch callback and the
  # non-finite guard (fit_guards), once each.
  assert len(callbacks.callbacks) == 4
