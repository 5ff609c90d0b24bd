"""Tests for the ResNet families split into interlocking modules."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import aux_heads
from layers import resnet
from layers.interlock_module import InterlockModule
from tests import helpers
from layers import partition


def _build(modules, input_shape):
  """Builds the modules in order, as an engine would, one per device."""
  shape = (None,) + tuple(input_shape)
  for module in modules:
    module.build(shape)
    shape = module.body.compute_output_shape(shape)
  return shape


def _main_params(modules):
  """Trainable parameters of the main path: the bodies, not the aux heads."""
  return sum(int(np.prod(w.shape))
             for m in modules for w in m.body.trainable_weights)


@pytest.mark.parametrize("preset, num_classes, input_shape, expected", [
    ("resnet20", 10, (32, 32, 3), 269_722),
    ("resnet32", 10, (32, 32, 3), 464_154),
    ("resnet56", 10, (32, 32, 3), 853_018),
    ("resnet110", 10, (32, 32, 3), 1_727_962),
    ("resnet18", 1000, (224, 224, 3), 11_689_512),
    ("resnet34", 1000, (224, 224, 3), 21_797_672),
    ("resnet50", 1000, (224, 224, 3), 25_557_032),
    ("resnet101", 1000, (224, 224, 3), 44_549_160),
])
def test_parameter_counts_match_the_standard_networks(
    preset, num_classes, input_shape, expected):
  modules = resnet.resnet_modules(preset, num_classes, 3)
  assert _build(modules, input_shape) == (None, num_classes)
  assert _main_params(modules) == expected


@pytest.mark.parametrize("preset, gmacs, last_shape", [
    ("resnet50", 4.09, (7, 7, 2048)),
    ("resnet18", 1.81, (7, 7, 512)),
])
def test_flops_match_the_published_figures(preset, gmacs, last_shape):
  # 224x224 ImageNet: ResNet-50 4.1 GMACs, ResNet-18 1.8 GMACs.
  stem, blocks, head = resnet.resnet_layers(preset, 1000)
  flops, shapes = resnet.count_flops([stem] + blocks + [head], (224, 224, 3))
  assert sum(flops) / 2e9 == pytest.approx(gmacs, rel=0.01)
  assert shapes[1] == (56, 56, 64)  # After the stem.
  assert shapes[-1] == last_shape  # What the pool + dense head sees.


def test_modules_stack_into_the_network():
  modules = resnet.resnet_modules("resnet32", 10, 4, split=[4, 3, 5, 3])
  bodies = [m.body.layers for m in modules]
  assert [len(b) for b in bodies] == [5, 3, 5, 4]
  assert isinstance(bodies[0][0], resnet.ResNetStem)
  assert bodies[-1][-1].name == "head"
  blocks = [layer for b in bodies for layer in b
            if isinstance(layer, resnet.BasicBlock)]
  assert len(blocks) == 15 == len(resnet.resnet_layers("resnet32", 10)[1])
  assert [m.has_aux_head for m in modules] == [True, True, True, False]
  assert all(isinstance(m, InterlockModule) for m in modules)


def test_forward_shapes_and_aux_heads():
  modules = resnet.resnet_modules("resnet20", 7, 3, stage_blocks=(1, 1, 1),
                                  aux_head="pool")
  x = tf.random.normal([2, 16, 16, 3])
  out, aux = helpers.stacked_forward(modules, x, training=True)
  assert out.shape == (2, 7)
  assert [a.shape for a in aux] == [(2, 7), (2, 7)]
  # One block per module: the feature maps halve after the first stage.
  assert modules[0].forward(x).shape == (2, 16, 16, 16)
  assert modules[1].body.compute_output_shape((2, 16, 16, 16)) == (
      2, 8, 8, 32)


def test_imagenet_stem_and_width_multiplier():
  modules = resnet.resnet_modules("resnet18", 5, 2, width=0.25,
                                  aux_head=None)
  assert not modules[0].has_aux_head
  x = tf.random.normal([1, 64, 64, 3])
  stem = modules[0].body.layers[0]
  assert stem(x).shape == (1, 16, 16, 16)  # /2 conv, /2 max pool, 64 x 0.25.
  out, _ = helpers.stacked_forward(modules, x)
  assert out.shape == (1, 5)
  assert modules[1].body.layers[-2].out_filters == 128


def test_bottleneck_block_and_projection_shortcut():
  block = resnet.BottleneckBlock(4, strides=2)
  y = block(tf.random.normal([2, 9, 9, 8]), training=True)
  assert y.shape == (2, 5, 5, 16)  # ceil(9 / 2), expansion 4.
  assert block.proj_conv is not None
  # 1x1 8->4, 3x3 4->4, 1x1 4->16, 1x1 projection 8->16 (MACs x 2).
  assert block.flops((9, 9, 8)) == 2 * (81 * 8 * 4 + 25 * 9 * 4 * 4 +
                                        25 * 4 * 16 + 25 * 8 * 16)


def test_pad_shortcut_is_parameter_free_identity():
  block = resnet.BasicBlock(6, strides=2, shortcut="pad")
  x = tf.random.normal([1, 4, 4, 3])
  block.build(x.shape)
  assert block.proj_conv is None
  shortcut = block._shortcut(x, training=False)
  np.testing.assert_array_equal(shortcut[..., :3], x[:, ::2, ::2, :])
  np.testing.assert_array_equal(shortcut[..., 3:], 0.0)
  with pytest.raises(ValueError, match=r"Received: shortcut='pad'"):
    resnet.BasicBlock(2, shortcut="pad").build((1, 4, 4, 3))


def test_balanced_split_by_flops():
  # Main path only: the CIFAR blocks all cost about the same.
  by_main = resnet.resnet_modules("resnet20", 10, 3, balance="main_flops")
  assert [len(m.body.layers) for m in by_main] == [4, 3, 4]
  assert [len(m.body.layers) for m in resnet.resnet_modules(
      "resnet20", 10, 3, balance="blocks")] == [4, 3, 4]
  # With the authors' aux heads, a head on a 32x32 map costs more than the
  # whole network, so "flops" cuts only at the 8x8 end.
  modules = resnet.resnet_modules("resnet20", 10, 3)
  split = [len(modules[0].body.layers) - 1, len(modules[1].body.layers),
           len(modules[2].body.layers) - 1]
  stem, blocks, head = resnet.resnet_layers("resnet20", 10)
  flops, shapes = resnet.count_flops([stem] + blocks + [head], (32, 32, 3))
  costs = flops[1:-1]
  costs[0] += flops[0]
  costs[-1] += flops[-1]
  probe = aux_heads.make_conv_aux_head("authors", 10)
  cuts = [probe.flops(s) for s in shapes[2:]]
  assert split == partition.balanced_split(costs, 3, cut_costs=cuts)
  assert split == [7, 1, 1]
  assert max(partition.module_costs(costs, split, cut_costs=cuts)) < max(
      partition.module_costs(costs, [3, 3, 3], cut_costs=cuts))


@pytest.mark.parametrize("kwargs, message", [
    (dict(split=[3, 3, 2]), r"sums to 8.*Received: split=\[3, 3, 2\]"),
    (dict(split=[9]), r"one block count per module.*Received: split=\[9\]"),
    (dict(split=[0, 4, 5]), r"positive ints.*Received: split=\[0, 4, 5\]"),
    (dict(balance="params"), r"Received: balance='params'"),
    (dict(aux_head="tiny"), r"Received: aux_head='tiny'"),
    (dict(stage_blocks=(1, 1)), r"Received: stage_blocks=\(1, 1\)"),
    (dict(width=0), r"Received: width=0"),
    (dict(shortcut="conv"), r"Received: shortcut='conv'"),
])
def test_bad_arguments_raise_clear_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    resnet.resnet_modules("resnet20", 10, 3, **kwargs)


@pytest.mark.parametrize("synchronized", [True, False])
def test_synchronized_bn_reaches_every_batch_norm(synchronized):
  modules = resnet.resnet_modules("resnet18", 10, 2, width=0.125,
                                  synchronized_bn=synchronized)
  _build(modules, (32, 32, 3))
  norms = [layer for m in modules for layer in m._flatten_layers()
           if isinstance(layer, keras.layers.BatchNormalization)]
  # 1 stem + 8 blocks x 2 + 3 projections + 2 per authors' aux head.
  assert len(norms) == 1 + 16 + 3 + 2
  assert all(n.synchronized == synchronized for n in norms)


def test_bad_preset_and_num_modules():
  with pytest.raises(ValueError, match=r"Received: preset='resnet19'"):
    resnet.resnet_modules("resnet19", 10, 2)
  with pytest.raises(ValueError, match=r"\(9\). Received: num_modules=10"):
    resnet.resnet_modules("ResNet-20", 10, 10)


@pytest.mark.parametrize("layer, shape", [
    (resnet.BasicBlock(8, strides=2, synchronized_bn=False), (2, 6, 6, 4)),
    (resnet.BottleneckBlock(2, shortcut="pad"), (2, 5, 5, 3)),
    (resnet.ResNetStem(4, kind="imagenet"), (2, 16, 16, 3)),
])
def test_layer_config_roundtrip(layer, shape):
  x = tf.random.normal(shape)
  layer(x, training=True)
  clone = layer.__class__.from_config(layer.get_config())
  assert clone.get_config() == layer.get_config()
  clone.build(shape)
  clone.set_weights(layer.get_weights())
  np.testing.assert_allclose(clone(x), layer(x), rtol=1e-5, atol=1e-6)


def test_interlock_module_config_roundtrip():
  modules = resnet.resnet_modules("resnet20", 10, 2, stage_blocks=(1, 1, 1))
  _build(modules, (8, 8, 3))
  x = tf.random.normal([2, 8, 8, 3])
  for module in modules:
    clone = InterlockModule.from_config(module.get_config())
    clone.build((None,) + tuple(x.shape[1:]))
    clone.set_weights(module.get_weights())
    for a, b in zip(tf.nest.flatten(clone(x)), tf.nest.flatten(module(x))):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    x = module.forward(x)


def test_saved_keras_file_roundtrip(tmp_path):
  modules = resnet.resnet_modules("resnet20", 10, 2, stage_blocks=(1, 1, 1))
  inputs = keras.Input((8, 8, 3))
  model = keras.Model(inputs, modules[1](modules[0](inputs)))
  x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
  restored = helpers.assert_keras_round_trip(model, x,
                                             str(tmp_path / "resnet.keras"))
  helpers.assert_aux_head_reloaded(restored, modules[0], x)


def test_checkpoint_restores_every_weight(tmp_path):
  def fresh():
    modules = resnet.resnet_modules("resnet20", 10, 2, stage_blocks=(1, 1, 1))
    _build(modules, (8, 8, 3))
    return modules

  def checkpoint(modules):
    # Each module as an attribute: layers only in a list are not saved.
    return tf.train.Checkpoint(**{f"module{k}": m
                                  for k, m in enumerate(modules)})

  modules = fresh()
  helpers.stacked_forward(modules, tf.random.normal([4, 8, 8, 3]), training=True)  # Moves BN.
  path = checkpoint(modules).write(str(tmp_path / "ckpt"))
  restored = fresh()
  checkpoint(restored).read(path).assert_consumed()
  weights = [(a, b) for m, r in zip(modules, restored)
             for a, b in zip(m.weights, r.weights)]
  assert len(weights) == sum(len(m.weights) for m in modules)
  for a, b in weights:
    assert a.path == b.path
    np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


def test_mixed_bfloat16_forward(mixed_bfloat16):
  del mixed_bfloat16
  modules = resnet.resnet_modules("resnet20", 10, 2, stage_blocks=(1, 1, 1))
  out, aux = helpers.stacked_forward(modules, tf.random.normal([2, 8, 8, 3]), training=True)
  assert out.dtype == tf.bfloat16 and aux[0].dtype == tf.bfloat16
  assert modules[0].body.layers[0].conv.kernel.dtype == "float32"
  assert np.all(np.isfinite(tf.cast(out, tf.float32).numpy()))
