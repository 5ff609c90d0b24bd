"""Placement verification, TPU logical cores (offline), and the trainer's
error messages for common mistakes."""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers.interlock_module import InterlockModule
from tests import helpers
from tf_interlock import metric_names
from tf_interlock import placement as placement_lib
from tf_interlock.trainer import InterlockTrainer

K = 3


class _FakeTPUExtended:
  """TPUStrategy's logical-device stack, without a TPU."""

  def __init__(self, cores):
    self.num_logical_cores_per_replica = cores
    self.stack = [0]

  @contextlib.contextmanager
  def experimental_logical_device(self, core):
    self.stack.append(core)
    try:
      yield
    finally:
      self.stack.pop()

  def variable_created_in_scope(self, variable):
    del variable
    return True


class FakeTPUStrategy:
  """Records the logical core every variable is created on.

  Like `TPUStrategy`, whose variable creator puts each variable on the core
  at the top of `extended._logical_device_stack`: here the creator records
  that core instead. Running steps is delegated to the default strategy.
  """

  num_replicas_in_sync = 1

  def __init__(self, cores):
    self.extended = _FakeTPUExtended(cores)
    self.core_of = {}
    self.assigned = set()

  def scope(self):
    return tf.variable_creator_scope(self._creator)

  def _creator(self, next_creator, **kwargs):
    variable = next_creator(**kwargs)
    self.core_of[variable.ref()] = self.extended.stack[-1]
    return variable

  def experimental_assign_to_logical_device(self, tensor, core):
    self.assigned.add(core)
    return tensor

  def __getattr__(self, name):  # run, reduce, experimental_distribute_dataset
    return getattr(tf.distribute.get_strategy(), name)


def _module_variables(trainer, k):
  return trainer.modules[k].weights + trainer.optimizers[k].variables


def test_tpu_module_state_on_its_logical_core():
  x, y = helpers.batch(size=8)
  tpu = FakeTPUStrategy(cores=K)
  placement = placement_lib.make_placement("tpu", K, tpu)
  with tpu.scope():
    modules = helpers.mlp_modules(K, seed=3, batch_norm=True)
  trainer = InterlockTrainer(modules, lambda k: keras.optimizers.Adam(0.01),
                             "2wise", loss_fn=helpers.cross_entropy,
                             distribute=tpu, placement=placement)
  trainer.build(x)  # verifies the recorded cores itself
  for k in range(K):
    variables = _module_variables(trainer, k)
    # Body, head, BN statistics, Adam's slots, step counter and LR.
    assert len(variables) > 10
    assert {tpu.core_of[v.value.ref()] for v in variables} == {k}, k
  trainer.train_loop(iter(trainer.distribute_dataset(
      helpers.repeat_dataset(x, y))))
  assert tpu.assigned == set(range(K))
  # Same numbers as without a placement.
  reference_modules = helpers.mlp_modules(K, seed=3, batch_norm=True)
  reference = InterlockTrainer(reference_modules,
                               lambda k: keras.optimizers.Adam(0.01), "2wise",
                               loss_fn=helpers.cross_entropy)
  reference.build(x)
  reference.train_loop(iter(reference.distribute_dataset(
      helpers.repeat_dataset(x, y))))
  for a, b in zip(helpers.weights(reference_modules), helpers.weights(modules)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_tpu_prebuilt_module_raises():
  x, _ = helpers.batch(size=8)
  tpu = FakeTPUStrategy(cores=K)
  modules = helpers.mlp_modules(K)
  modules[1].build((None, 16))  # built before the placement: core 0
  trainer = InterlockTrainer(modules, "sgd", "2wise", distribute=tpu,
                             placement=placement_lib.make_placement(
                                 "tpu", K, tpu))
  with pytest.raises(ValueError, match=r"of module 2 was created outside "
                     r"every module's scope; it belongs on logical core 1"):
    trainer.build(x)


def _sequential_modules():
  """K modules whose bodies were built by keras.Input, as users write them."""
  bodies = [keras.Sequential([keras.Input((d,)), keras.layers.Dense(16)])
            for d in (6, 16, 16)]
  return [InterlockModule(bodies[0], aux_head=keras.layers.Dense(5)),
          InterlockModule(bodies[1], aux_head=keras.layers.Dense(5)),
          InterlockModule(bodies[2])]


def test_prebuilt_model_raises_naming_the_variable():
  x, _ = helpers.batch(size=8)
  trainer = InterlockTrainer(_sequential_modules(), "adam", "2wise",
                             placement=placement_lib.make_placement(
                                 "simulated", K))
  # Module 1's body sits on CPU:0, which is its device; module 2's does not.
  with pytest.raises(ValueError, match=(
      r"weight '[\w/]+kernel' of module 2 is on /job:localhost/replica:0/"
      r"task:0/device:CPU:0; it belongs on /device:CPU:1")):
    trainer.build(x)


def test_optimizers_made_outside_the_module_scope_raise():
  x, _ = helpers.batch(size=8)
  trainer = InterlockTrainer(
      helpers.mlp_modules(K), [keras.optimizers.SGD() for _ in range(K)],
      "2wise", placement=placement_lib.make_placement("simulated", K))
  with pytest.raises(ValueError, match=(
      r"optimizer variable '\w+/iteration' of module 2 is on .*CPU:0; it "
      r"belongs on /device:CPU:1")):
    trainer.build(x)


def test_every_variable_checked_on_its_device():
  x, _ = helpers.batch(size=8)
  placement = placement_lib.make_placement("simulated", K)
  trainer = InterlockTrainer(helpers.mlp_modules(K), keras.optimizers.Adam(),
                             "2wise", placement=placement)
  checked = []
  original = placement.check_variables
  placement.check_variables = lambda k, variables, hint="": (
      checked.extend(v for _, v in variables), original(k, variables, hint))
  trainer.build(x)
  names = {v.path for v in checked}
  for k in range(K):
    expected = _module_variables(trainer, k)
    assert {v.path for v in expected} <= names
    assert any(v.path.endswith("iteration") for v in expected)
    assert any("momentum" in v.path for v in expected)  # an Adam slot
    for v in expected:
      assert placement_lib.same_device(v.value.device, f"/cpu:{k}"), v.path


def test_same_device():
  full = "/job:localhost/replica:0/task:0/device:CPU:1"
  assert placement_lib.same_device(full, "/device:CPU:1")
  assert placement_lib.same_device(full, "/cpu:1")
  assert not placement_lib.same_device(full, "/device:CPU:0")
  assert not placement_lib.same_device(full, "/device:GPU:1")
  assert not placement_lib.same_device("", "/device:CPU:0")


def test_device_placement_with_replicas_raises(mirrored):
  with pytest.raises(ValueError, match="Received: placement=simulated"):
    InterlockTrainer(helpers.mlp_modules(K), "sgd", distribute=mirrored,
                     placement=placement_lib.make_placement("simulated", K))


def test_float16_on_tpu_raises():
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    modules = helpers.mlp_modules(K)
  finally:
    keras.mixed_precision.set_global_policy(previous)
  tpu = FakeTPUStrategy(cores=K)
  with pytest.raises(ValueError, match="use mixed_bfloat16"):
    InterlockTrainer(modules, "sgd", distribute=tpu,
                     placement=placement_lib.make_placement("tpu", K, tpu))


def _one_step(optimizers, loss_fn=helpers.cross_entropy, strategy="2wise"):
  x, y = helpers.batch(size=8)
  modules = helpers.mlp_modules(K, seed=9)
  trainer = InterlockTrainer(modules, optimizers, strategy, loss_fn=loss_fn)
  trainer.build(x)
  trainer.train_loop(iter(trainer.distribute_dataset(
      helpers.repeat_dataset(x, y))))
  return helpers.weights(modules), trainer


def test_one_optimizer_is_cloned_per_module():
  expected, _ = _one_step(lambda k: keras.optimizers.Adam(0.05))
  one = keras.optimizers.Adam(0.05)
  got, trainer = _one_step(one)
  assert len({id(o) for o in trainer.optimizers}) == K
  assert all(type(o) is keras.optimizers.Adam and o is not one
             for o in trainer.optimizers)
  assert int(one.iterations.numpy()) == 0
  for a, b in zip(expected, got):
    np.testing.assert_allclose(a, b, atol=1e-7)
  _, by_name = _one_step("adam")
  assert all(type(o) is keras.optimizers.Adam for o in by_name.optimizers)


@pytest.mark.parametrize("optimizers,match", [
    ("adamx", "'adamx' is no Keras optimizer name. Received: optimizers="),
    (3, "callable k -> optimizer. Received: optimizers=3"),
    (lambda k: "sgd", "module 1 is not a Keras optimizer"),
])
def test_bad_optimizers(optimizers, match):
  with pytest.raises(ValueError, match=match):
    InterlockTrainer(helpers.mlp_modules(K), optimizers)


@pytest.mark.parametrize("reduction", [
    "sum_over_batch_size", "sum", "mean", None])
def test_keras_loss_object_any_reduction(reduction):
  expected, _ = _one_step(lambda k: keras.optimizers.SGD(0.5))
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                    reduction=reduction)
  got, _ = _one_step(lambda k: keras.optimizers.SGD(0.5), loss_fn=loss)
  for a, b in zip(expected, got):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_scalar_loss_fn_rejected():
  with pytest.raises(ValueError, match="one value per example"):
    _one_step("sgd", loss_fn=lambda y, logits: tf.reduce_mean(
        helpers.cross_entropy(y, logits)))


def test_train_loop_before_build():
  trainer = InterlockTrainer(helpers.mlp_modules(K), "sgd")
  x, y = helpers.batch(size=8)
  with pytest.raises(RuntimeError, match=r"call trainer.build\("):
    trainer.train_loop(iter(trainer.distribute_dataset(
        helpers.repeat_dataset(x, y))))


def test_dataset_shorter_than_loop():
  x, y = helpers.batch(size=8)
  trainer = InterlockTrainer(helpers.mlp_modules(K), "sgd",
                             loss_fn=helpers.cross_entropy, steps_per_loop=3)
  trainer.build(x)
  finite = tf.data.Dataset.from_tensors((x, y)).repeat(2)
  with pytest.raises(ValueError, match=(
      r"dataset ended inside a loop of 3 steps.*Received: num_steps=3")) as e:
    trainer.train_loop(iter(trainer.distribute_dataset(finite)))
  # Still the end-of-data signal Keras's epoch loop expects.
  assert isinstance(e.value, tf.errors.OutOfRangeError)
  # With num_steps the batches left, the same data trains.
  metrics = trainer.train_loop(iter(trainer.distribute_dataset(finite)), 2)
  assert np.isfinite(metrics["module_3/loss"])


def test_strategy_spelling():
  with pytest.raises(ValueError, match=(
      r"did you mean '2wise'\?\). Received: strategy='2-wise'")):
    InterlockTrainer(helpers.mlp_modules(K), "sgd", "2-wise")


def test_metric_names_round_trip():
  assert metric_names.metric_name(0, "loss") == "module_1/loss"
  assert metric_names.parse_metric_name("module_12/grad_norm") == (
      11, "grad_norm")
  _, trainer = _one_step("sgd")
  for key in trainer.train_loop(iter(trainer.distribute_dataset(
      helpers.repeat_dataset(*helpers.batch(size=8))))):
    index, name = metric_names.parse_metric_name(key)
    assert metric_names.metric_name(index, name) == key and 0 <= index < K
  for bad in ("module_0/loss", "loss", "module_1"):
    with pytest.raises(ValueError, match="Received: key="):
      metric_names.parse_metric_name(bad)
