"""`ti.callbacks.TimeBudget` on `InterlockModel.fit` and on plain Keras.

The budgets are 1e-9 s (spent by any call of the train function) and 1e9 s
(never spent), so what these tests check does not depend on the machine's
speed.
"""

import keras
import numpy as np
import pytest

import tf_interlock as ti
from tests.keras_models import sequential_cnn

BATCH, SIZE = 8, 8
STEPS_PER_EPOCH, EPOCHS = 4, 3
STOPPED = ti.callbacks.STOPPED_LOG


def data(num=STEPS_PER_EPOCH * BATCH):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(num, SIZE, SIZE, 1)).astype("float32")
  return x, rng.integers(0, 10, size=num).astype("int32")


def fit(budget, steps_per_execution=1, strategy="2wise"):
  model = ti.InterlockModel(ti.from_keras(sequential_cnn(size=SIZE), 3),
                            strategy=strategy, placement="simulated")
  model.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["accuracy"],
                steps_per_execution=steps_per_execution)
  history = model.fit(*data(), batch_size=BATCH, epochs=EPOCHS, verbose=0,
                      callbacks=[budget])
  return model, history


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_tiny_wall_budget_stops_after_the_first_call(steps_per_execution):
  budget = ti.callbacks.TimeBudget(1e-9)
  model, history = fit(budget, steps_per_execution)
  # Checked once per call of the train function: one call of N steps ran.
  assert budget.stopped
  assert budget.steps == steps_per_execution
  assert int(model.optimizer.iterations.numpy()) == steps_per_execution
  # The epoch it stopped is in History, flagged; no epoch followed.
  assert history.history[STOPPED] == [1.0]
  assert len(history.history["loss"]) == 1
  assert budget.elapsed_s > 0


def test_batches_count_leaves_the_tracing_call_out():
  budget = ti.callbacks.TimeBudget(1e-9, count="batches")
  model, history = fit(budget, steps_per_execution=2)
  # The first call (tracing) is not counted: the second call spends it.
  assert budget.steps == 4
  assert int(model.optimizer.iterations.numpy()) == 4
  assert history.history[STOPPED] == [1.0]


@pytest.mark.parametrize("count", ti.callbacks.COUNTS)
def test_huge_budget_runs_to_the_end(count):
  budget = ti.callbacks.TimeBudget(1e9, count=count)
  model, history = fit(budget, steps_per_execution=2)
  assert not budget.stopped
  assert budget.steps == EPOCHS * STEPS_PER_EPOCH
  assert int(model.optimizer.iterations.numpy()) == EPOCHS * STEPS_PER_EPOCH
  assert history.history[STOPPED] == [0.0] * EPOCHS


def test_a_second_fit_gets_a_new_budget():
  budget = ti.callbacks.TimeBudget(1e-9)
  model, _ = fit(budget)
  history = model.fit(*data(), batch_size=BATCH, epochs=EPOCHS, verbose=0,
                      callbacks=[budget])
  assert budget.steps == 1
  assert int(model.optimizer.iterations.numpy()) == 2
  assert history.history[STOPPED] == [1.0]


def test_plain_keras_model():
  model = sequential_cnn(size=SIZE)
  model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  budget = ti.callbacks.TimeBudget(1e-9)
  history = model.fit(*data(), batch_size=BATCH, epochs=EPOCHS, verbose=0,
                      callbacks=[budget])
  assert budget.steps == 1
  assert int(model.optimizer.iterations.numpy()) == 1
  assert history.history[STOPPED] == [1.0]


@pytest.mark.parametrize("kwargs, message", [
    ({"seconds": 0}, "seconds=0"),
    ({"seconds": float("inf")}, "seconds=inf"),
    ({"seconds": True}, "seconds=True"),
    ({"seconds": "10"}, "seconds='10'"),
    ({"seconds": 5, "count": "cpu"}, "count='cpu'"),
])
def test_bad_arguments_are_one_line(kwargs, message):
  with pytest.raises(ValueError, match="Received: " + message):
    ti.callbacks.TimeBudget(**kwargs)
