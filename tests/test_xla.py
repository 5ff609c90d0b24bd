"""The TPU-readiness test: the step compiled with XLA equals the step without.

A TPU runs only XLA programs, so every op of a step must have an XLA kernel
and static shapes. Each cell trains the same modules, from the same weights
on the same batches, for 3 steps with `jit_compile=True` and with
`jit_compile=False` on CPU, and compares every weight (BatchNorm statistics
included) and every metric afterwards.

The cells are a covering design, not the cross product: every strategy
(e2e, local, 2-wise, 3-wise, the "sum" variant), M = 1 and M = 4
microbatches, every model (MLP, ResNet with BatchNorm, the Transformer LM, a
`from_keras` CNN), every precision and both kinds of compiled program
(placement "single": one XLA program per replica step; "simulated": one per
module and kind of work, on the module's own device) appear at least once.

Tolerances. float32: 1e-5 (XLA fuses and reorders float32 sums; nothing
else differs). Mixed precision: `MIXED_TOLERANCE` on the float32 weights.
XLA keeps a fused chain of bfloat16/float16 ops in float32 where TF rounds
after every op, so activations differ by a few units in the last place of
the 8-bit (bfloat16) or 11-bit (float16) mantissa, i.e. up to ~1e-2 and
~1e-3 relative; after 3 SGD steps at learning rate 0.1 that moves weights by
far less than 1e-2.

XLA really compiles: a planted `tf.numpy_function` (a host op, which no
XLA device can run) trains without XLA and makes the compiled step fail.
"""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import resnet
from layers import transformer
from layers.interlock_module import InterlockModule
from tests import helpers
from tests.keras_models import sequential_cnn
from tf_interlock.keras import split as keras_split
from tf_interlock import module_functions
from tf_interlock import placement as placement_lib
from tf_interlock.keras.model import InterlockModel
from tf_interlock.trainer import InterlockTrainer
from train import config as config_lib

# make test-slow (XLA against no XLA, every network and placement).
pytestmark = pytest.mark.slow

STEPS = 3
BATCH = 8
FLOAT32_TOLERANCE = 1e-5
# float16: 1e-2. 2e-3 held on earlier hosts; on this one the from_keras
# 2-wise-sum cell differs by 4.0e-3 on 4 of 36 weights, main at 756e782
# included (a host-dependent rounding, not a change of ours).
MIXED_TOLERANCE = {"mixed_bfloat16": 2e-2, "mixed_float16": 1e-2}


def _mlp(num_modules):
  return helpers.mlp_modules(num_modules, width=16), helpers.batch(BATCH)


def _resnet(num_modules):
  shape = (8, 8, 3)
  # ResNet-20's blocks, conv and BatchNorm, one block per stage (ResNet-8)
  # at a quarter of the width: the same layers, quick to compile.
  modules = resnet.resnet_modules("resnet20", 10, num_modules, width=0.25,
                                  stage_blocks=(1, 1, 1), aux_head="pool",
                                  input_shape=shape)
  rng = np.random.default_rng(1)
  return modules, (rng.normal(size=(BATCH,) + shape).astype("float32"),
                   rng.integers(0, 10, size=(BATCH,)).astype("int32"))


def _transformer(num_modules):
  vocab, seq = 23, 8
  modules = transformer.transformer_lm_modules(vocab, seq, num_modules, 8,
                                               2, 16, num_modules)
  ids = np.random.default_rng(2).integers(0, vocab, size=(BATCH, seq + 1))
  return modules, (ids[:, :-1].astype("int32"), ids[:, 1:].astype("int32"))


def _from_keras(num_modules):
  modules = keras_split.from_keras(sequential_cnn(size=8), num_modules)
  rng = np.random.default_rng(3)
  return modules, (rng.normal(size=(BATCH, 8, 8, 1)).astype("float32"),
                   rng.integers(0, 10, size=(BATCH,)).astype("int32"))


MODELS = {"mlp": _mlp, "resnet": _resnet, "transformer": _transformer,
          "from_keras": _from_keras}

# (model, K, strategy, variant, M, precision, placement). M = 4 and the
# mixed-precision cells go with the small models, and 3-wise (K = 3) with
# the MLP: the Transformer at K = 3 under 3-wise took twice the time of its
# K = 2 e2e cell. The file must run in under 2 minutes on a 2-core host. (ResNet under mixed_bfloat16 with M = 4
# and the "sum" variant, the Transformer under mixed_bfloat16 and the MLP
# under mixed_float16 with M = 4 also passed, at up to 5x the CPU time.)
CELLS = [
    ("mlp", 3, "3wise", None, 1, "float32", "single"),
    ("mlp", 2, "local", None, 4, "mixed_bfloat16", "simulated"),
    ("from_keras", 2, "e2e", None, 1, "float32", "simulated"),
    ("from_keras", 2, "2wise", "sum", 1, "mixed_float16", "simulated"),
    ("resnet", 2, "2wise", None, 1, "float32", "single"),
    ("transformer", 2, "e2e", None, 1, "float32", "simulated"),
]


def _cell_id(cell):
  model, k, strategy, variant, m, precision, placement = cell
  name = strategy + (f"-{variant}" if variant else "")
  return f"{model}-K{k}-{name}-M{m}-{precision}-{placement}"


class _Policy:
  """Creates layers under a Keras dtype policy, then restores the old."""

  def __init__(self, name):
    self.name = name

  def __enter__(self):
    self.previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(self.name)

  def __exit__(self, *exc):
    keras.mixed_precision.set_global_policy(self.previous)


def _trainer(modules, cell, jit_compile, x):
  _, k, strategy, variant, m, _, placement = cell
  trainer = InterlockTrainer(
      modules, lambda i: keras.optimizers.SGD(0.1), strategy,
      variant=variant, placement=placement_lib.make_placement(placement, k),
      steps_per_loop=STEPS, num_microbatches=m, jit_compile=jit_compile)
  trainer.build(x)
  return trainer


def _train(cell, jit_compile, initial=None):
  """(trainer, metrics, weights before, weights after) of 3 steps."""
  model, k, _, _, _, precision, _ = cell
  with _Policy(precision):
    modules, (x, y) = MODELS[model](k)
    trainer = _trainer(modules, cell, jit_compile, x)
  if initial is not None:
    for module, values in zip(modules, initial):
      module.set_weights(values)
  before = [module.get_weights() for module in modules]
  data = trainer.distribute_dataset(helpers.repeat_dataset(x, y))
  metrics = trainer.train_loop(iter(data))
  return trainer, metrics, before, [m.get_weights() for m in modules]


@pytest.mark.parametrize("cell", CELLS, ids=_cell_id)
def test_compiled_steps_equal_uncompiled(cell):
  plain, plain_metrics, before, plain_after = _train(cell, False)
  jit, jit_metrics, _, jit_after = _train(cell, True, initial=before)
  assert not plain.jit_compile and jit.jit_compile
  precision = cell[5]
  tol = (FLOAT32_TOLERANCE if precision == "float32"
         else MIXED_TOLERANCE[precision])
  changed = 0
  for k, (b, p, j) in enumerate(zip(before, plain_after, jit_after)):
    for w0, wp, wj in zip(b, p, j):
      np.testing.assert_allclose(wj, wp, rtol=tol, atol=tol,
                                 err_msg=f"module {k + 1}")
      changed += not np.array_equal(w0, wp)
  assert changed > 0  # the steps trained: equal weights mean something
  assert set(jit_metrics) == set(plain_metrics)
  for key, value in plain_metrics.items():
    assert jit_metrics[key] == pytest.approx(value, rel=tol, abs=tol), key
  if cell[6] == "simulated":
    # The compiled path calls each module's functions (one XLA program per
    # module and kind of work) even below MIN_CALLS calls, where the plain
    # path runs op by op.
    assert all(jit.step.functions.traces[("body", i)] >= 1
               for i in range(cell[1]))
    if STEPS * cell[4] < module_functions.MIN_CALLS:
      assert not plain.step.functions.traces


@tf.custom_gradient
def _host_identity(x):
  """x, computed by NumPy on the host: an op with no XLA kernel."""
  y = tf.numpy_function(lambda a: a, [x], x.dtype, stateful=False)
  y.set_shape(x.shape)
  return y, lambda dy: dy


def _planted_modules():
  bodies, heads = helpers.mlp_layers(2, width=16)
  bodies[1].insert(0, keras.layers.Lambda(_host_identity))
  return [InterlockModule(b, aux_head=h) for b, h in zip(bodies, heads)]


@pytest.mark.parametrize("placement", ["single", "simulated"])
def test_planted_host_op_fails_only_under_xla(placement):
  x, y = helpers.batch(BATCH)
  cell = ("mlp", 2, "2wise", None, 1, "float32", placement)
  data = helpers.repeat_dataset(x, y)
  plain = _trainer(_planted_modules(), cell, False, x)
  metrics = plain.train_loop(iter(plain.distribute_dataset(data)))
  assert np.isfinite(metrics["module_2/loss"])
  jit = _trainer(_planted_modules(), cell, True, x)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="(?s)unsupported operations.*PyFunc"):
    jit.train_loop(iter(jit.distribute_dataset(data)))


def test_auto_follows_keras(monkeypatch):
  single = placement_lib.make_placement("single", 2)
  default = tf.distribute.get_strategy()
  # This host has CPUs only: "auto" is off, as Keras's.
  assert not tf.config.list_physical_devices("GPU")
  assert module_functions.resolve_jit_compile("auto", single,
                                              default) is False
  assert module_functions.resolve_jit_compile(True, single, default) is True
  gpus = placement_lib.Placement("gpu", ["/gpu:0", "/gpu:1"])
  assert module_functions.resolve_jit_compile("auto", gpus, default) is True
  monkeypatch.setattr(module_functions.tf_private,
                      "op_determinism_enabled", lambda: True)
  assert module_functions.resolve_jit_compile("auto", gpus, default) is False


def test_tpu_always_compiles():
  tpu = placement_lib.Placement("tpu")
  default = tf.distribute.get_strategy()
  assert module_functions.resolve_jit_compile("auto", tpu, default) is True
  with pytest.raises(ValueError, match="Received: jit_compile=False$"):
    module_functions.resolve_jit_compile(False, tpu, default)


def test_refusals_name_the_value(mirrored):
  single = placement_lib.make_placement("single", 2, mirrored)
  assert module_functions.resolve_jit_compile("auto", single,
                                              mirrored) is False
  with pytest.raises(ValueError, match="MirroredStrategy with 2 replicas.*"
                     "Received: jit_compile=True$"):
    module_functions.resolve_jit_compile(True, single, mirrored)
  with pytest.raises(ValueError, match="Received: jit_compile='yes'$"):
    InterlockTrainer(helpers.mlp_modules(2), "sgd", jit_compile="yes")


def _fit(jit_compile, initial=None):
  x, y = helpers.batch(BATCH)
  model = InterlockModel(helpers.mlp_modules(2), "local")
  model.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=jit_compile,
                steps_per_execution=2)
  model.build(x.shape)
  if initial is not None:
    for module, values in zip(model.interlock_modules, initial):
      module.set_weights(values)
  before = [m.get_weights() for m in model.interlock_modules]
  model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
  return model, before


def test_keras_compile_takes_jit_compile():
  plain, before = _fit(False)
  jit, _ = _fit(True, initial=before)
  assert plain.trainer.jit_compile is False and jit.trainer.jit_compile
  config = keras.saving.deserialize_keras_object(jit.get_compile_config())
  assert config["jit_compile"] is True
  after = helpers.weights(jit.interlock_modules)
  assert any(not np.array_equal(a, b) for a, b in
             zip(after, [w for values in before for w in values]))
  for a, b in zip(after, helpers.weights(plain.interlock_modules)):
    np.testing.assert_allclose(a, b, rtol=FLOAT32_TOLERANCE,
                               atol=FLOAT32_TOLERANCE)
  jit.compile(jit_compile="auto")
  assert jit.trainer.jit_compile is False  # a CPU-only host
  with pytest.raises(ValueError, match="Received: jit_compile='on'$"):
    jit.compile(jit_compile="on")


def test_flag_of_the_binaries():
  config = config_lib.Config()
  assert config.devices.jit_compile == "auto"
  assert config_lib.jit_compile_value(config) == "auto"
  assert config_lib.jit_compile_value(
      dataclasses.replace(config, jit_compile="true")) is True
  assert config_lib.jit_compile_value(
      dataclasses.replace(config, jit_compile="false")) is False
  with pytest.raises(ValueError, match="Received: jit_compile='yes'$"):
    config_lib.validate(dataclasses.replace(config, jit_compile="yes"))
  tpu = dataclasses.replace(config, placement="tpu", tpu="grpc://10.0.0.2")
  config_lib.validate(dataclasses.replace(tpu, jit_compile="true"))
  with pytest.raises(ValueError, match="placement=tpu always compiles.*"
                     "Received: jit_compile='false'$"):
    config_lib.validate(dataclasses.replace(tpu, jit_compile="false"))
