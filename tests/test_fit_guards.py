"""`InterlockModel.fit` trains on no bad input in silence (issue 35, §2).

NaN or Inf in x, a NaN sample weight: `fit` stops with one line naming the
module (or stops quietly with `NonFiniteGuard("terminate")`). Labels out of
range, negative or with fractions are refused before the first step, with
and without XLA; so is an empty batch in `train_on_batch`.
"""

import keras
import numpy as np
import pytest

from tf_interlock.keras import fit_checks
from tf_interlock.keras import split as keras_split
from tf_interlock.keras.model import InterlockModel

CLASSES = 4


def _model(jit_compile=False):
  keras.utils.set_random_seed(0)
  plain = keras.Sequential([
      keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
      keras.layers.Dense(16, activation="relu"),
      keras.layers.Dense(CLASSES)])
  model = InterlockModel(keras_split.from_keras(plain, 2), "2wise")
  model.compile(optimizer="sgd", metrics=["accuracy"],
                jit_compile=jit_compile)
  return model


def _data(n=64):
  rng = np.random.default_rng(0)
  return (rng.random((n, 8), dtype=np.float32),
          rng.integers(0, CLASSES, n))


def _first_line(error):
  text = str(error.value)
  assert "\n" not in text, text
  return text


@pytest.mark.parametrize("fault", ["nan_x", "inf_x", "nan_weight"])
def test_fit_stops_on_non_finite_input_naming_the_module(fault):
  model = _model()
  x, y = _data()
  weights = np.ones(len(x), np.float32)
  if fault == "nan_x":
    x[20, 3] = np.nan
  elif fault == "inf_x":
    x[20, 3] = np.inf
  else:
    weights[20] = np.nan
  with pytest.raises(fit_checks.NonFiniteError) as error:
    model.fit(x, y, sample_weight=weights, batch_size=16, epochs=3,
              verbose=0, shuffle=False)
  line = _first_line(error)
  # Example 20 is in batch 2 of the first epoch: it stops there.
  assert "in module_" in line and "batch 2 of epoch 1" in line, line
  assert "NonFiniteGuard('terminate')" in line, line


def test_a_terminate_guard_stops_fit_quietly_as_terminate_on_nan(capsys):
  model = _model()
  x, y = _data()
  x[20, 3] = np.nan
  history = model.fit(x, y, batch_size=16, epochs=3, verbose=0,
                      shuffle=False,
                      callbacks=[fit_checks.NonFiniteGuard("terminate")])
  assert len(history.history["loss"]) == 1  # the other epochs never ran
  out = capsys.readouterr().out
  assert "warning: non-finite" in out and "batch 2 of epoch 1" in out, out


def test_finite_input_trains_unguarded_as_before():
  model = _model()
  x, y = _data()
  history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
  assert np.isfinite(history.history["loss"]).all()


def test_non_finite_weights_are_named_even_when_the_logs_look_finite():
  model = _model()
  x, y = _data()
  model.fit(x, y, batch_size=16, epochs=1, verbose=0)
  finite_logs = {"loss": 1.0, "module_1/loss": 1.0, "module_2/loss": 1.0}
  assert fit_checks.nonfinite_problem(model, finite_logs) is None
  kernel = model.interlock_modules[1].trainable_weights[0]
  value = kernel.numpy()
  value[0, 0] = np.nan
  kernel.assign(value)
  problem = fit_checks.nonfinite_problem(model, finite_logs)
  assert problem == ("non-finite weights in module_2 while the logs look "
                     "finite"), problem


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("bad,shown", [(CLASSES, f"= {CLASSES}"),
                                       (-1, "= -1"), (1.5, "= 1.5")])
def test_bad_labels_are_refused_before_the_first_step(jit_compile, bad,
                                                      shown):
  model = _model(jit_compile)
  x, y = _data()
  y = y.astype(np.float32 if isinstance(bad, float) else np.int64)
  y[37] = bad
  before = [w.numpy().copy() for w in model.weights] if model.built else None
  with pytest.raises(ValueError) as error:
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
  line = _first_line(error)
  assert f"y[37] {shown}" in line, line
  assert f"[0, {CLASSES})" in line, line
  assert model.trainer.optimizers[0].iterations.numpy() == 0  # no step
  if before is not None:
    assert all((a == b.numpy()).all() for a, b in zip(before, model.weights))


def test_whole_float_labels_still_train():
  model = _model()
  x, y = _data()
  history = model.fit(x, y.astype(np.float32), batch_size=16, epochs=1,
                      verbose=0)
  assert np.isfinite(history.history["loss"]).all()


def test_train_on_batch_refuses_bad_labels_and_an_empty_batch():
  model = _model()
  x, y = _data(16)
  with pytest.raises(ValueError, match=r"needs at least one example.*"
                     r"Received: x.shape=\(0, 8\)"):
    model.train_on_batch(x[:0], y[:0])
  y[3] = 9
  with pytest.raises(ValueError, match=r"y\[3\] = 9 is not a class id"):
    model.train_on_batch(x, y)


def test_weights_gone_non_finite_in_the_last_step_are_named_at_the_epochs_end():
  # The logs are read after every call, the weights at each epoch's end: a
  # NaN weight that no later step's loss shows is still caught.
  model = _model()
  x, y = _data()

  class PoisonLastStep(keras.callbacks.Callback):

    def on_train_batch_end(self, batch, logs=None):
      if batch == 3:  # the last of 64 / 16 batches
        kernel = self.model.interlock_modules[0].trainable_weights[0]
        value = kernel.numpy()
        value[1, 2] = np.inf
        kernel.assign(value)

  with pytest.raises(fit_checks.NonFiniteError) as error:
    model.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False,
              callbacks=[PoisonLastStep(), fit_checks.NonFiniteGuard()])
  assert _first_line(error).startswith(
      "non-finite weights in module_1 while the logs look finite at the end "
      "of epoch 1;"), error.value
