"""A Keras user's habits on InterlockModel, through the public front door."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_interlock as ti
from tests.binaries import ROOT
from tests.keras_models import sequential_cnn

BATCH = 8
SIZE = 8


def data(num=4 * BATCH, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num, SIZE, SIZE, 1)).astype("float32")
  return x, rng.integers(0, 10, size=num).astype("int32")


def compiled(strategy="2wise", optimizer=None, source=None, **kwargs):
  source = source or sequential_cnn(size=SIZE)
  model = ti.InterlockModel(ti.from_keras(source, 3),
                            strategy=strategy, placement="simulated")
  model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1),
                metrics=["accuracy"], **kwargs)
  return model


def rates(model):
  return [float(o.learning_rate) for o in model.trainer.optimizers]


def test_front_door_names():
  for name in ("InterlockModel", "from_keras", "InterlockModule",
               "InterlockTrainer"):
    assert callable(getattr(ti, name)), name
  assert callable(ti.placement.make_placement)
  assert callable(ti.placement.configure_simulated_devices)


def test_summary_prints_one_row_per_module_and_layer_names():
  source = sequential_cnn(size=SIZE)
  model = compiled(source=source)
  lines = []
  model.summary(print_fn=lines.append)
  # Before the build: the layers are known, the parameters are not.
  assert sum("unbuilt" in line for line in lines) == 3 + 1
  model.build((None, SIZE, SIZE, 1))
  lines = []
  model.summary(print_fn=lines.append)
  rows = [line for line in lines if line[:1].isdigit()]
  assert len(rows) == 3
  names = [layer.name for layer in source.layers]
  # Where from_keras cut, publicly: modules[k].layer_names.
  got = [m.layer_names for m in model.modules]
  assert sum(got, []) == names
  for k, (row, module) in enumerate(zip(rows, model.modules)):
    assert row.startswith(str(k + 1))
    assert module.layer_names[0] in row and module.layer_names[-1] in row
    assert f"{module.body.count_params():,}" in row
    assert model.placement.devices[k] in row
    if module.has_aux_head:
      assert module.aux_head.name in row
  total = sum(v.numpy().size for m in model.modules for v in m.weights)
  assert f"Total params: {total:,}" in lines[-1]


def test_learning_rate_callbacks_and_tensorboard(tmp_path):
  x, y = data()
  model = compiled(optimizer=[keras.optimizers.SGD(r) for r in (.1, .2, .3)])
  assert model.optimizer is not None
  assert float(model.optimizer.learning_rate) == pytest.approx(0.1)
  # Naming modules: only modules 2 and 3 change.
  model.optimizer.modules = [2, 3]
  model.optimizer.learning_rate = 0.05
  np.testing.assert_allclose(rates(model), [0.1, 0.05, 0.05], rtol=1e-6)
  with pytest.raises(ValueError, match=r"Received: modules=\[4\]"):
    model.optimizer.modules = [4]
  model.optimizer.modules = None
  schedule = keras.callbacks.LearningRateScheduler(
      lambda epoch, lr: 0.01 * (epoch + 1))
  # patience=0 and a monitor that never improves twice: reduces each epoch.
  plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5,
                                              patience=0, min_delta=1e9)
  history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                      callbacks=[schedule, plateau,
                                 keras.callbacks.TensorBoard(
                                     str(tmp_path / "tb"))])
  # Epoch 2 began at 0.02 for every module; the plateau then halved it.
  np.testing.assert_allclose(rates(model), [0.01] * 3, rtol=1e-6)
  np.testing.assert_allclose(history.history["learning_rate"], [0.01, 0.02],
                             rtol=1e-6)
  logged = set()
  for path in tf.io.gfile.glob(str(tmp_path / "tb" / "train" / "*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      logged.update(v.tag for v in event.summary.value)
  assert "epoch_learning_rate" in logged
  # Step counters of the handle are the modules' own.
  assert int(model.optimizer.iterations) == 2 * 4


def test_load_model_in_a_new_process_after_import_tf_interlock(tmp_path):
  x, y = data()
  model = compiled(strategy="local")
  model.fit(x, y, batch_size=BATCH, verbose=0)
  path = str(tmp_path / "m.keras")
  model.save(path)
  np.save(tmp_path / "x.npy", x)
  np.save(tmp_path / "want.npy", model.predict(x, verbose=0, exit=1))
  # A program whose first import is a `layers` module then imports
  # tf_interlock without an error and has that module's classes
  # registered; `keras.models.load_model` then needs nothing more.
  code = (
      "import layers.resnet\n"
      "import numpy as np, keras, tf_interlock\n"
      "for name in ('BasicBlock', 'InterlockModel'):\n"
      "  print(keras.saving.get_registered_object('tf_interlock>' + name)"
      ".__name__)\n"
      "tf_interlock.placement.configure_simulated_devices(3)\n"
      f"m = keras.models.load_model({path!r})\n"
      f"x = np.load({str(tmp_path / 'x.npy')!r})\n"
      f"want = np.load({str(tmp_path / 'want.npy')!r})\n"
      "np.testing.assert_allclose(m.predict(x, verbose=0, exit=1), want,"
      " atol=1e-6)\n"
      "print(type(m).__name__, m.interlock_strategy.name)\n")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["BasicBlock", "InterlockModel",
                                 "InterlockModel", "local"]


def test_a_missing_dependency_of_a_layer_module_is_raised(tmp_path):
  # A missing dependency of a layer module (here blocked by a finder) is
  # raised by `import tf_interlock`, not swallowed.
  missing = (
      "import sys\n"
      "class Block:\n"
      "  def find_spec(self, name, path=None, target=None):\n"
      "    if name == 'layers.transformer':\n"
      "      raise ModuleNotFoundError(\"No module named 'fancy_dep'\","
      " name='fancy_dep')\n"
      "sys.meta_path.insert(0, Block())\n"
      "try:\n"
      "  import tf_interlock\n"
      "except ImportError as e:\n"
      "  print('raised', e.name)\n")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, "-c", missing], cwd=tmp_path,
                        env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["raised", "fancy_dep"]


def test_unbatched_dataset_says_how_to_batch_it():
  x, y = data()
  model = compiled()
  unbatched = tf.data.Dataset.from_tensor_slices((x, y))
  with pytest.raises(ValueError, match=r"batch the dataset: "
                     r"\.batch\(N, drop_remainder=True\)\. Received"):
    model.fit(unbatched, verbose=0)
  # Labels that are not scalars: one-hot, or one LM sequence per example
  # (tokens and next tokens), on an unbuilt model; then once built.
  one_hot = tf.data.Dataset.from_tensor_slices((x, np.eye(10)[y]))
  tokens = np.arange(4 * 6, dtype="int32").reshape(4, 6)
  sequences = tf.data.Dataset.from_tensor_slices((tokens, tokens + 1))
  for dataset in (one_hot, sequences):
    with pytest.raises(ValueError, match="batch the dataset"):
      compiled().fit(dataset, verbose=0)
  model.build(x.shape)
  with pytest.raises(ValueError, match="batch the dataset"):
    model.fit(one_hot, verbose=0)


def test_sample_weight_in_datasets_and_evaluate():
  x, y = data()
  w = np.random.default_rng(2).uniform(0, 2, size=len(x)).astype("float32")
  arrays = compiled(strategy="local")
  arrays.fit(x, y, sample_weight=w, batch_size=BATCH, shuffle=False,
             verbose=0)
  triples = compiled(strategy="local")
  triples.fit(tf.data.Dataset.from_tensor_slices((x, y, w)).batch(
      BATCH, drop_remainder=True), verbose=0)
  for a, b in zip(arrays.weights, triples.weights, strict=True):
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)
  # evaluate weights each example's loss: mean(w * loss), as Keras does.
  logs = arrays.evaluate(x, y, sample_weight=w, batch_size=BATCH, verbose=0,
                         return_dict=True)
  per_example = keras.losses.sparse_categorical_crossentropy(
      y, arrays.predict(x, verbose=0), from_logits=True)
  assert logs["loss"] == pytest.approx(float(np.mean(w * per_example)),
                                       rel=1e-5)
  with pytest.raises(ValueError, match="Received: len\\(sample_weight\\)=3"):
    arrays.fit(x, y, sample_weight=w[:3], verbose=0)
