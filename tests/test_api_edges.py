"""The library API's edges (issue 46): two threads on one model, placement
names for the trainer, numpy integers as ints, Python lists as data.

Each test goes through the public API and checks what really happened: the
optimizers' step counters, the predictions served, the message's one line.
"""

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_interlock as ti
from tf_interlock import export as export_lib
from tf_interlock import placement as placement_lib

X = np.random.RandomState(0).rand(64, 8).astype("float32")
Y = np.random.RandomState(1).randint(0, 3, 64)


def _net():
  keras.utils.set_random_seed(0)
  return keras.Sequential([keras.Input((8,)),
                           keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(3)])


def _model():
  model = ti.InterlockModel(ti.from_keras(_net(), 2), strategy="local")
  model.compile("sgd")
  return model


def _steps(model):
  return [int(opt.iterations.numpy()) for opt in model.trainer.optimizers]


class _HoldAfterFirstBatch(keras.callbacks.Callback):
  """Stops fit's thread after its first batch until `release` is set: the
  window in which another thread's call is certain to overlap."""

  def __init__(self):
    super().__init__()
    self.held = threading.Event()
    self.release = threading.Event()

  def on_train_batch_end(self, batch, logs=None):
    if batch == 0:
      self.held.set()
      assert self.release.wait(120)


def _in_thread(fn, name):
  """fn() in a thread of its own; returns what it returned or raised."""
  out = {}

  def run():
    try:
      out["value"] = fn()
    except Exception as e:  # pylint: disable=broad-except
      out["error"] = e
  thread = threading.Thread(target=run, name=name)
  thread.start()
  thread.join(300)
  assert not thread.is_alive()
  return out


def test_a_second_thread_is_refused_while_fit_runs_and_the_steps_stay_exact():
  model = _model()
  hold = _HoldAfterFirstBatch()
  first = {}

  def fit_a():
    try:
      first["history"] = model.fit(X, Y, batch_size=8, verbose=0,
                                   callbacks=[hold])
    except Exception as e:  # pylint: disable=broad-except
      first["error"] = e
  thread_a = threading.Thread(target=fit_a, name="A")
  thread_a.start()
  try:
    assert hold.held.wait(300), first
    calls = {
        "fit": lambda: model.fit(X, Y, batch_size=8, verbose=0),
        "evaluate": lambda: model.evaluate(X, Y, verbose=0),
        "predict": lambda: model.predict(X, verbose=0),
        "train_on_batch": lambda: model.train_on_batch(X[:8], Y[:8]),
    }
    refused = {name: _in_thread(call, "B") for name, call in calls.items()}
    during = _steps(model)
  finally:
    hold.release.set()
    thread_a.join(300)
  assert "error" not in first, first
  for name, out in refused.items():
    error = out.get("error")
    assert isinstance(error, RuntimeError), (name, out)
    assert str(error).startswith(
        "InterlockModel.fit is already running in another thread; "), error
    assert str(error).endswith(
        f"Received: InterlockModel.{name} from thread 'B'"), error
    assert "\n" not in str(error)
  # None of B's calls ran a step: A's first batch only, then A's 8.
  assert during == [1, 1]
  assert _steps(model) == [8, 8]
  # The guard is free again: B's fit now trains, every step counted.
  assert "error" not in _in_thread(
      lambda: model.fit(X, Y, batch_size=8, verbose=0), "B")
  assert _steps(model) == [16, 16]


def test_fit_may_call_predict_and_evaluate_from_its_own_thread():
  model = _model()
  seen = []

  class _Probe(keras.callbacks.Callback):

    def on_epoch_end(self, epoch, logs=None):
      seen.append(model.predict(X[:4], verbose=0).shape)

  history = model.fit(X, Y, batch_size=8, verbose=0, callbacks=[_Probe()],
                      validation_data=(X[:16], Y[:16]))
  assert seen == [(4, 3)]
  assert "val_loss" in history.history


def test_a_second_thread_in_the_trainers_train_loop_is_refused():
  modules = ti.from_keras(_net(), 2)
  trainer = ti.InterlockTrainer(modules, "sgd", "local")
  trainer.build(tf.constant(X[:8]))
  inside, release = threading.Event(), threading.Event()

  def batches():
    for _ in range(2):
      inside.set()
      assert release.wait(120)
      yield X[:8], Y[:8].astype("int64")
  dataset = tf.data.Dataset.from_generator(batches, output_signature=(
      tf.TensorSpec([8, 8], tf.float32), tf.TensorSpec([8], tf.int64)))
  iterator = iter(trainer.distribute_dataset(dataset))
  first = {}
  thread_a = threading.Thread(
      target=lambda: first.update(metrics=trainer.train_loop(iterator)),
      name="A")
  thread_a.start()
  try:
    assert inside.wait(300)
    out = _in_thread(lambda: trainer.train_loop(iterator), "B")
  finally:
    release.set()
    thread_a.join(300)
  assert str(out["error"]).startswith(
      "InterlockTrainer.train_loop is already running in another thread; ")
  assert [int(o.iterations.numpy()) for o in trainer.optimizers] == [1, 1]
  assert "module_2/loss" in first["metrics"]


@pytest.mark.parametrize("name", ["single", "simulated"])
def test_the_trainer_takes_the_placement_names_the_model_takes(name):
  modules = ti.from_keras(_net(), 2)
  trainer = ti.InterlockTrainer(modules, "sgd", "local", placement=name)
  assert trainer.placement.kind == name
  trainer.build(tf.constant(X[:8]))
  for k, module in enumerate(modules):
    for v in module.weights:
      if trainer.placement.devices is not None:
        assert placement_lib.same_device(v.value.device,
                                         trainer.placement.devices[k])


@pytest.mark.parametrize("placement", ["nowhere", 3, False])
def test_the_trainer_refuses_other_placements_in_one_line(placement):
  with pytest.raises(ValueError) as e:
    ti.InterlockTrainer(ti.from_keras(_net(), 2), "sgd", placement=placement)
  assert "\n" not in str(e.value)
  assert str(e.value).endswith(f"placement={placement!r}") or (
      "nowhere" in str(e.value)), e.value


def test_numpy_integers_are_ints_and_bools_are_not():
  model = _model()
  model.fit(X, Y, batch_size=np.int64(8), epochs=np.int32(1), verbose=0)
  assert _steps(model) == [8, 8]
  by_int = model.predict(X[:4], exit=1, verbose=0)
  by_numpy = model.predict(X[:4], exit=np.int64(1), verbose=0)
  np.testing.assert_array_equal(by_numpy, by_int)
  # The network, not the exit: a numpy K is K.
  np.testing.assert_array_equal(model.predict(X[:4], exit=np.int64(2),
                                              verbose=0),
                                model.predict(X[:4], verbose=0))
  with pytest.raises(ValueError, match=r"Received: exit=True$"):
    model.predict(X[:4], exit=True, verbose=0)
  trainer = ti.InterlockTrainer(ti.from_keras(_net(), 2), "sgd",
                                strategy=np.int64(1),
                                num_microbatches=np.int64(2))
  assert trainer.strategy.window == 1 and type(trainer.num_microbatches) is int
  model.optimizer.modules = np.int64(2)
  assert model.optimizer.modules == [2]


@pytest.mark.parametrize("num_classes", [0, -3, 2.5, True, "10"])
def test_from_keras_refuses_a_bad_num_classes_naming_it(num_classes):
  with pytest.raises(ValueError) as e:
    ti.from_keras(_net(), 2, num_classes=num_classes)
  assert str(e.value).startswith("num_classes must be None"), e.value
  assert str(e.value).endswith(f"Received: num_classes={num_classes!r}")


def test_from_keras_takes_a_numpy_num_classes():
  modules = ti.from_keras(_net(), 2, num_classes=np.int64(5))
  model = ti.InterlockModel(modules, strategy="local")
  model.compile("sgd")
  assert model.predict(X[:2], exit=1, verbose=0).shape == (2, 5)


RAGGED = [[0.1] * 8, [0.2] * 7] * 32


@pytest.mark.parametrize("x, y, words", [
    (RAGGED, Y, "x's rows differ in length (row 0 has 8 values, row 1 has "
     "7 values)"),
    ([[0.1] * 8, 0.5] * 32, Y, "row 1 has a single value"),
    ([[[0.1]] * 8, [[0.1, 0.2]] * 8] * 32, Y, "x's rows differ in length "
     "below the first axis"),
    (X, [[0], [1, 2]] * 32, "y's rows differ in length"),
    (X.tolist(), Y, "x is a Python list of 64 examples; pass one numpy "
     "array"),
])
def test_python_lists_as_data_are_one_line_naming_x_or_y(x, y, words):
  model = _model()
  for call in (lambda: model.fit(x, y, batch_size=8, verbose=0),
               lambda: model.evaluate(x, y, verbose=0)):
    with pytest.raises(ValueError) as e:
      call()
    assert words in str(e.value), e.value
    assert "\n" not in str(e.value)
    assert "Received: " in str(e.value)
  assert _steps(model) == [0, 0]
  if isinstance(x, list):
    with pytest.raises(ValueError, match="rows differ|Python list"):
      model.predict(x, verbose=0)


def test_a_list_of_labels_still_trains():
  model = _model()
  model.fit(X, Y.tolist(), batch_size=8, verbose=0)
  assert _steps(model) == [8, 8]


@pytest.mark.parametrize("name", ["exp[1]", "exp*", "exp?", "exp{a,b}"])
def test_an_export_folder_tf_would_read_as_a_pattern_is_refused(tmp_path,
                                                                name):
  model = _model()
  model.fit(X, Y, batch_size=8, verbose=0)
  target = tmp_path / name
  for export in (model.export_saved_model,
                 lambda path: model.export(path, verbose=False)):
    with pytest.raises(ValueError) as e:
      export(str(target))
    assert str(e.value).endswith(f"Received: export_dir={str(target)!r}")
    assert "file pattern" in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []
  # The same folder under a plain name exports and loads.
  plain = model.export_saved_model(str(tmp_path / "exp1"))
  logits = export_lib.load_exported(plain).signatures["serving_default"](
      inputs=tf.constant(X[:4]))["logits"]
  np.testing.assert_allclose(logits, model.predict(X[:4], verbose=0),
                             rtol=1e-5, atol=1e-5)
  # A folder renamed into a pattern is refused on load, in one line.
  (tmp_path / "exp1").rename(target)
  with pytest.raises(ValueError, match="rename the folder to load it"):
    export_lib.load_exported(str(target))
