"""from_keras: a user's Sequential or functional model -> K placed modules."""

import keras
import numpy as np
import pytest

from tests.keras_models import (assert_on_devices, residual_model,
                                sequential_cnn)
from tf_interlock.keras import blocks as keras_blocks
from tf_interlock.keras import split as keras_split
from tf_interlock import placement as placement_lib
from tf_interlock.trainer import InterlockTrainer


def layer_names(module):
  return [c["name"] for c in module.body.model_config["layers"][1:]]


def build_placed(modules, x):
  placement = placement_lib.make_placement("simulated", len(modules))
  trainer = InterlockTrainer(modules, lambda k: keras.optimizers.SGD(0.1),
                             strategy="2wise", placement=placement)
  trainer.build(x)
  return trainer, placement


def chained(modules, x):
  for module in modules:
    x = module.body(x, training=False)
  return x.numpy()


def test_sequential_cnn_three_placed_modules_with_source_weights():
  model = sequential_cnn()
  x = np.random.default_rng(0).normal(size=(4, 28, 28, 1)).astype("float32")
  modules = keras_split.from_keras(model, 3)
  assert [m.has_aux_head for m in modules] == [True, True, False]
  # Every module starts right after a ReLU: a Conv-BN-ReLU group per module.
  assert [layer_names(m)[0] for m in modules] == [
      model.layers[i].name for i in (0, 3, 6)]
  trainer, placement = build_placed(modules, x)
  assert_on_devices(trainer, placement)
  copied = [w for m in modules for w in m.body.model.get_weights()]
  for got, want in zip(copied, model.get_weights(), strict=True):
    np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(chained(modules, x), model(x).numpy(),
                             atol=1e-6)


def test_functional_residual_model_cut_between_blocks():
  model = residual_model()
  nodes_before = [len(layer._inbound_nodes) for layer in model.layers]
  x = np.random.default_rng(1).normal(size=(4, 8, 8, 3)).astype("float32")
  modules = keras_split.from_keras(model, 3)
  # Each module ends after a block's output ReLU (or the head): never
  # inside a block, where the skip connection would cross the cut.
  assert [layer_names(m)[-1] for m in modules] == ["b0_out", "b1_out",
                                                   "logits"]
  trainer, placement = build_placed(modules, x)
  assert_on_devices(trainer, placement)
  np.testing.assert_allclose(chained(modules, x), model(x).numpy(),
                             atol=1e-5)
  # The user's model was only read.
  assert [len(layer._inbound_nodes) for layer in model.layers] == nodes_before


@pytest.mark.parametrize("balance", ["params", "time"])
def test_other_balances_give_valid_placed_modules(balance):
  model = residual_model(blocks=2)
  x = np.random.default_rng(2).normal(size=(2, 8, 8, 3)).astype("float32")
  modules = keras_split.from_keras(model, 2, balance=balance, sample=x)
  assert len(modules) == 2
  build_placed(modules, x)
  np.testing.assert_allclose(chained(modules, x), model(x).numpy(),
                             atol=1e-5)


def test_explicit_split_and_aux_head_kinds():
  model = residual_model(blocks=2)
  modules = keras_split.from_keras(model, 2, split=["b0_out"],
                                   aux_head="authors")
  assert layer_names(modules[0])[-1] == "b0_out"
  assert modules[0].aux_head.filters == (128, 64)
  cnn = sequential_cnn()
  counts = keras_split.from_keras(cnn, 2, split=[6, 5])
  assert layer_names(counts[1])[0] == cnn.layers[6].name
  custom = keras_split.from_keras(
      sequential_cnn(), 2, split=[3, 8],
      aux_head=lambda k, shape: keras.layers.Dense(10, name=f"mine{k}"))
  assert custom[0].aux_head.name == "mine1"
  assert keras_split.from_keras(sequential_cnn(), 2,
                                aux_head=None)[0].aux_head is None


def test_cut_through_skip_connection_names_the_layers():
  with pytest.raises(ValueError) as error:
    keras_split.from_keras(residual_model(), 2, split=["b1_conv1"])
  message = str(error.value)
  assert "Cannot cut after layer 'b1_conv1'" in message
  assert "'b1_conv1' -> 'b1_conv2'" in message
  assert "'b0_out' -> 'b1_add'" in message
  assert "Received: split=['b1_conv1']" in message


@pytest.mark.parametrize("kwargs, match", [
    ({"num_modules": 9}, "num_modules must be between 1 and 3"),
    ({"num_modules": 2, "balance": "speed"}, "Received: balance='speed'"),
    ({"num_modules": 2, "aux_head": "big"}, "Received: aux_head='big'"),
    ({"num_modules": 2, "split": [3, 3]}, "Received: split=\\[3, 3\\]"),
    ({"num_modules": 2, "split": ["nope"]}, "Received: split=\\['nope'\\]"),
])
def test_bad_arguments_raise_naming_them(kwargs, match):
  with pytest.raises(ValueError, match=match):
    keras_split.from_keras(residual_model(), **kwargs)


def test_models_without_a_graph_raise():

  class Subclassed(keras.Model):

    def __init__(self):
      super().__init__()
      self.dense = keras.layers.Dense(2)

    def call(self, x):
      return self.dense(x)

  with pytest.raises(ValueError, match="subclassed model has no graph"):
    keras_split.from_keras(Subclassed(), 2)
  with pytest.raises(ValueError, match="authors' needs image features"):
    keras_split.from_keras(keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(2)]),
                           2, split=[1, 1], aux_head="authors")


def bn_resnet(blocks=2):
  """Functional ResNet-style: conv-BN-ReLU stem, post-activation blocks."""
  keras.utils.set_random_seed(0)
  inputs = keras.Input((8, 8, 3))
  h = keras.layers.Conv2D(8, 3, padding="same", name="stem_conv")(inputs)
  h = keras.layers.ReLU(name="stem_relu")(
      keras.layers.BatchNormalization(name="stem_bn")(h))
  for b in range(blocks):
    y = keras.layers.Conv2D(8, 3, padding="same", name=f"b{b}_conv1")(h)
    y = keras.layers.ReLU(name=f"b{b}_relu1")(
        keras.layers.BatchNormalization(name=f"b{b}_bn1")(y))
    y = keras.layers.Conv2D(8, 3, padding="same", name=f"b{b}_conv2")(y)
    y = keras.layers.BatchNormalization(name=f"b{b}_bn2")(y)
    h = keras.layers.ReLU(name=f"b{b}_out")(
        keras.layers.Add(name=f"b{b}_add")([h, y]))
  h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
  return keras.Model(inputs, keras.layers.Dense(5, name="logits")(h))


@pytest.mark.parametrize("num_modules", [2, 3])
def test_flops_balance_keeps_blocks_whole(num_modules):
  # With K = 3 the old balance gave module 1 [stem_conv] alone, cut from
  # its BN and ReLU: a linear module whose linear aux head stayed at chance.
  model = bn_resnet()
  modules = keras_split.from_keras(model, num_modules)
  names = [m.layer_names for m in modules]
  assert names[0][:3] == ["stem_conv", "stem_bn", "stem_relu"]
  for module_names in names[:-1]:
    # Each module ends after an activation: never between a layer and the
    # normalisation, activation or merge that takes its output over.
    assert module_names[-1].endswith(("_relu", "_out")), names
  for module_names in names:
    assert any(n.endswith(("relu", "_out", "relu1")) for n in module_names)
  assert names[-1][-1] == "logits"
  # Each module holds a nonlinearity.
  for module in modules:
    assert any(keras_blocks.is_nonlinear(model.get_layer(n))
               for n in module.layer_names)
  x = np.random.default_rng(3).normal(size=(2, 8, 8, 3)).astype("float32")
  np.testing.assert_allclose(chained(modules, x), model(x).numpy(),
                             atol=1e-5)


def test_split_still_forces_any_single_tensor_cut():
  model = bn_resnet()
  modules = keras_split.from_keras(model, 2, split=["stem_conv"])
  assert modules[0].layer_names == ["stem_conv"]
  assert modules[1].layer_names[0] == "stem_bn"


def test_pre_activation_blocks_cut_after_the_sum():
  # x -> [BN -> ReLU -> conv] + x: the sum feeds the next block's BN; the
  # cut after the sum is the block boundary.
  keras.utils.set_random_seed(0)
  inputs = keras.Input((8,))
  h = keras.layers.Dense(8, name="stem")(inputs)
  for b in range(3):
    y = keras.layers.BatchNormalization(name=f"b{b}_bn")(h)
    y = keras.layers.Dense(8, activation="relu", name=f"b{b}_dense")(y)
    h = keras.layers.Add(name=f"b{b}_add")([h, y])
  model = keras.Model(inputs, keras.layers.Dense(3, name="logits")(h))
  modules = keras_split.from_keras(model, 3)
  assert [m.layer_names[-1] for m in modules] == ["b0_add", "b1_add",
                                                  "logits"]
