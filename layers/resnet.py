"""ResNets (He et al., 2016) split depthwise into interlocking modules.

The ResNet experiments of Gomez et al. (2022, arXiv:2010.04116) cut a ResNet
between residual blocks into K modules, each but the last with an auxiliary
classifier. `resnet_modules` gives the stem to module 1, the output head
(pool + dense) to module K and a contiguous run of blocks to each module.

Presets (`PRESETS`): CIFAR ResNet-20/32/56/110 (He et al., 2016, Sec. 4.2,
parameter-free "pad" shortcuts, 0.27M parameters for ResNet-20) and ImageNet
ResNet-18/34/50/101 (1x1 conv + BN "projection" shortcuts).
"""

import keras
from keras import ops

from layers import aux_heads
from layers import common
from layers.aux_heads import ConvAuxHead
from layers.common import batch_norm, conv2d, track_as_attributes

# name -> (stem kind, block kind, blocks per stage)
PRESETS = {
    "resnet20": ("cifar", "basic", (3, 3, 3)),
    "resnet32": ("cifar", "basic", (5, 5, 5)),
    "resnet56": ("cifar", "basic", (9, 9, 9)),
    "resnet110": ("cifar", "basic", (18, 18, 18)),
    "resnet18": ("imagenet", "basic", (2, 2, 2, 2)),
    "resnet34": ("imagenet", "basic", (3, 4, 6, 3)),
    "resnet50": ("imagenet", "bottleneck", (3, 4, 6, 3)),
    "resnet101": ("imagenet", "bottleneck", (3, 4, 23, 3)),
}
STAGE_WIDTHS = {"cifar": (16, 32, 64), "imagenet": (64, 128, 256, 512)}
DEFAULT_INPUT_SHAPES = {"cifar": (32, 32, 3), "imagenet": (224, 224, 3)}
DEFAULT_SHORTCUTS = {"cifar": "pad", "imagenet": "projection"}
BALANCE_MODES = common.BALANCE_MODES
SHORTCUTS = ("pad", "projection")


def _output_size(size, strides):
  """Spatial size after a 'same'-padded stride: ceil(size / strides)."""
  return None if size is None else -(-size // strides)


class _ResidualBlock(keras.layers.Layer):
  """y = relu(F(x) + shortcut(x)), F a chain of conv + BN (+ ReLU but last).

  Subclasses set `expansion` (output channels / filters) and `_branch()`.

  Args:
    filters: base width of the block.
    strides: 1, or 2 to halve the resolution.
    shortcut: "projection" (1x1 conv + BN when the shape changes, option B
      of He et al., 2016) or "pad" (parameter-free, option A).
    synchronized_bn: use synchronized BatchNormalization.
    **kwargs: base `keras.layers.Layer` arguments.

  Call arguments: inputs [B, H, W, C]; training, a Python bool for BN.

  Returns:
    [B, ceil(H / strides), ceil(W / strides), expansion * filters].
  """

  expansion = 1

  def __init__(self, filters, strides=1, shortcut="projection",
               synchronized_bn=True, **kwargs):
    super().__init__(**kwargs)
    if shortcut not in SHORTCUTS:
      raise ValueError(
          f"shortcut must be one of {SHORTCUTS}. Received: "
          f"shortcut={shortcut!r}")
    if strides not in (1, 2):
      raise ValueError(f"strides must be 1 or 2. Received: strides={strides!r}")
    self.filters = int(filters)
    self.strides = int(strides)
    self.shortcut = shortcut
    self.synchronized_bn = common.check_bool("synchronized_bn",
                                             synchronized_bn)
    self.out_filters = self.expansion * self.filters
    self.specs = self._branch()
    policy, sync = self.dtype_policy, self.synchronized_bn
    self.convs = [conv2d(f, k, s, dtype=policy, name=f"conv{i + 1}")
                  for i, (k, s, f) in enumerate(self.specs)]
    self.norms = [batch_norm(sync, dtype=policy, name=f"bn{i + 1}")
                  for i in range(len(self.specs))]
    track_as_attributes(self, self.convs + self.norms)
    self.proj_conv = None
    self.proj_bn = None

  def _branch(self):
    """(kernel size, strides, filters) of each conv of F, in order."""
    raise NotImplementedError

  def _reshapes(self, in_filters):
    return self.strides != 1 or in_filters != self.out_filters

  def build(self, input_shape):
    in_filters = input_shape[-1]
    shape = tuple(input_shape)
    for conv, norm in zip(self.convs, self.norms):
      conv.build(shape)
      shape = conv.compute_output_shape(shape)
      norm.build(shape)
    if self.shortcut == "pad" and in_filters > self.out_filters:
      raise ValueError(
          f"A 'pad' shortcut cannot shrink {in_filters} channels to "
          f"{self.out_filters}; use shortcut='projection'. Received: "
          f"shortcut={self.shortcut!r}")
    if self.shortcut == "projection" and self._reshapes(in_filters):
      self.proj_conv = conv2d(self.out_filters, 1, self.strides,
                              dtype=self.dtype_policy, name="proj_conv")
      self.proj_conv.build(input_shape)
      self.proj_bn = batch_norm(self.synchronized_bn, dtype=self.dtype_policy,
                                name="proj_bn")
      self.proj_bn.build(shape)

  def _shortcut(self, x, training):
    if self.proj_conv is not None:
      return self.proj_bn(self.proj_conv(x), training=training)
    if not self._reshapes(x.shape[-1]):
      return x
    # Option A of He et al. (2016): subsample, then zero-pad the new channels,
    # so the shortcut stays an identity on the existing ones.
    x = x[:, ::self.strides, ::self.strides, :]
    return ops.pad(x, [[0, 0], [0, 0], [0, 0],
                       [0, self.out_filters - x.shape[-1]]])

  def call(self, inputs, training=False):
    x = inputs
    for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
      x = norm(conv(x), training=training)
      # The last ReLU comes after the addition (He et al., 2016, Fig. 2).
      if i < len(self.convs) - 1:
        x = ops.relu(x)
    return ops.relu(x + self._shortcut(inputs, training))

  def compute_output_shape(self, input_shape):
    return (input_shape[0], _output_size(input_shape[1], self.strides),
            _output_size(input_shape[2], self.strides), self.out_filters)

  def flops(self, input_shape):
    """FLOPs (2 x multiply-adds) of one example with input shape (H, W, C)."""
    height, width, channels = input_shape[-3:]
    total = 0
    for kernel, strides, filters in self.specs:
      height, width = (_output_size(height, strides),
                       _output_size(width, strides))
      total += 2 * height * width * kernel * kernel * channels * filters
      channels = filters
    if self.shortcut == "projection" and self._reshapes(input_shape[-1]):
      total += 2 * height * width * input_shape[-1] * self.out_filters
    return total

  def get_config(self):
    config = super().get_config()
    config.update(filters=self.filters, strides=self.strides,
                  shortcut=self.shortcut,
                  synchronized_bn=self.synchronized_bn)
    return config


@keras.saving.register_keras_serializable(package="tf_interlock")
class BasicBlock(_ResidualBlock):
  """Two 3x3 convs, stride on the first (He et al., 2016, Fig. 5 left).

  Output channels = filters. Arguments as for `_ResidualBlock`.
  """

  def _branch(self):
    return [(3, self.strides, self.filters), (3, 1, self.filters)]


@keras.saving.register_keras_serializable(package="tf_interlock")
class BottleneckBlock(_ResidualBlock):
  """1x1 reduce -> 3x3 -> 1x1 expand (He et al., 2016, Fig. 5 right).

  Output channels = 4 * filters. The stride sits on the 3x3 conv ("ResNet
  v1.5", as in torchvision), which changes neither parameter count nor
  output shape. Arguments as for `_ResidualBlock`.
  """

  expansion = 4

  def _branch(self):
    return [(1, 1, self.filters), (3, self.strides, self.filters),
            (1, 1, self.out_filters)]


@keras.saving.register_keras_serializable(package="tf_interlock")
class ResNetStem(keras.layers.Layer):
  """The input stem: CIFAR 3x3 conv, or ImageNet 7x7/2 conv + 3x3/2 max pool.

  Args:
    filters: output channels.
    kind: "cifar" or "imagenet".
    synchronized_bn: use synchronized BatchNormalization.
    **kwargs: base `keras.layers.Layer` arguments.

  Call arguments: inputs [B, H, W, 3]; training, a Python bool for BN.

  Returns:
    [B, H, W, filters] (CIFAR) or [B, ceil(H/4), ceil(W/4), filters].
  """

  def __init__(self, filters, kind="cifar", synchronized_bn=True, **kwargs):
    super().__init__(**kwargs)
    if kind not in STAGE_WIDTHS:
      raise ValueError(
          f"kind must be one of {sorted(STAGE_WIDTHS)}. Received: "
          f"kind={kind!r}")
    self.filters = int(filters)
    self.kind = kind
    self.synchronized_bn = common.check_bool("synchronized_bn",
                                             synchronized_bn)
    self.kernel, self.strides = (3, 1) if kind == "cifar" else (7, 2)
    self.conv = conv2d(self.filters, self.kernel, self.strides,
                       dtype=self.dtype_policy, name="conv")
    self.bn = batch_norm(self.synchronized_bn, dtype=self.dtype_policy,
                         name="bn")
    self.pool = (None if kind == "cifar" else keras.layers.MaxPooling2D(
        3, strides=2, padding="same", dtype=self.dtype_policy, name="pool"))

  def build(self, input_shape):
    self.conv.build(input_shape)
    self.bn.build(self.conv.compute_output_shape(input_shape))

  def call(self, inputs, training=False):
    x = ops.relu(self.bn(self.conv(inputs), training=training))
    return x if self.pool is None else self.pool(x)

  def compute_output_shape(self, input_shape):
    reduction = 1 if self.pool is None else 4
    return (input_shape[0], _output_size(input_shape[1], reduction),
            _output_size(input_shape[2], reduction), self.filters)

  def flops(self, input_shape):
    """FLOPs (2 x multiply-adds) of one example with input shape (H, W, C)."""
    height, width, channels = input_shape[-3:]
    out = _output_size(height, self.strides) * _output_size(width, self.strides)
    return 2 * out * self.kernel * self.kernel * channels * self.filters

  def get_config(self):
    config = super().get_config()
    config.update(filters=self.filters, kind=self.kind,
                  synchronized_bn=self.synchronized_bn)
    return config


def _preset(preset):
  """Looks up a preset by name ("resnet50", "ResNet-50", "resnet_50")."""
  key = str(preset).lower().replace("-", "").replace("_", "")
  if key not in PRESETS:
    raise ValueError(
        f"preset must be one of {sorted(PRESETS)}. Received: "
        f"preset={preset!r}")
  return PRESETS[key]


def resnet_layers(preset, num_classes, *, width=1.0, stage_blocks=None,
                  shortcut=None, synchronized_bn=True):
  """The whole network as (stem, blocks, head) Keras layers, unbuilt.

  Args:
    preset: a key of `PRESETS`, e.g. "resnet20" or "resnet50".
    num_classes: number of output classes.
    width: width multiplier applied to the stem and every stage.
    stage_blocks: optional blocks per stage overriding the preset's depth
      (e.g. (7, 7, 7) turns "resnet20" into ResNet-44).
    shortcut: "pad" or "projection" for shape-changing shortcuts; None uses
      the preset family's default.
    synchronized_bn: use synchronized BatchNormalization (see
      `common.batch_norm`).

  Returns:
    (`ResNetStem`, list of residual blocks, pool + dense head).
  """
  stem_kind, block_kind, default_blocks = _preset(preset)
  widths = STAGE_WIDTHS[stem_kind]
  stage_blocks = default_blocks if stage_blocks is None else stage_blocks
  if (len(stage_blocks) != len(widths) or
      any(int(n) < 1 for n in stage_blocks)):
    raise ValueError(
        f"stage_blocks must be {len(widths)} positive ints, one per stage of "
        f"{preset!r}. Received: stage_blocks={stage_blocks!r}")
  if isinstance(width, bool) or not (
      isinstance(width, (int, float)) and width > 0):
    raise ValueError(
        f"width must be a positive number. Received: width={width!r}")
  shortcut = DEFAULT_SHORTCUTS[stem_kind] if shortcut is None else shortcut

  def scaled(w):
    return max(1, int(round(w * width)))

  stem = ResNetStem(scaled(widths[0]), kind=stem_kind,
                    synchronized_bn=synchronized_bn, name="stem")
  block_cls = BasicBlock if block_kind == "basic" else BottleneckBlock
  blocks = []
  for stage, (w, n) in enumerate(zip(widths, stage_blocks)):
    for b in range(int(n)):
      # Every stage after the first halves the resolution in its first block.
      strides = 2 if stage > 0 and b == 0 else 1
      blocks.append(block_cls(
          scaled(w), strides=strides, shortcut=shortcut,
          synchronized_bn=synchronized_bn,
          name=f"stage{stage + 1}_block{b + 1}"))
  return stem, blocks, ConvAuxHead(num_classes, filters=(), name="head")


def count_flops(layers, input_shape):
  """FLOPs (2 x multiply-adds) per example of each layer of a chain.

  Only convolutions and dense layers count: BN, ReLU, pooling and additions
  cost a few operations per activation, negligible next to them.

  Args:
    layers: layers applied in sequence, each with a `flops(shape)` method.
    input_shape: per-example input shape (H, W, C), without batch axis.

  Returns:
    (flops, shapes): FLOPs of each layer, and each layer's input shape.
  """
  shape, flops, shapes = tuple(input_shape), [], []
  for layer in layers:
    shapes.append(shape)
    flops.append(layer.flops(shape))
    shape = tuple(layer.compute_output_shape((None,) + shape)[1:])
  return flops, shapes


def resnet_modules(preset, num_classes, num_modules, *, split=None,
                   balance="flops", input_shape=None, aux_head="authors",
                   width=1.0, stage_blocks=None, shortcut=None,
                   synchronized_bn=True, name="resnet"):
  """Splits a ResNet depthwise into K interlocking modules.

  Module 1 gets the stem, module K the output head and no aux head, every
  module k < K an aux head on its output; stacked, the bodies are the whole
  network. Modules are returned unbuilt: build each under its own device or
  strategy scope.

  With `split=None` the blocks are partitioned to minimise the slowest
  module's estimated cost (`partition.balanced_split`). balance="flops"
  counts a module's blocks, the stem (module 1), the head (module K) and its
  aux head, which runs on the same device; "main_flops" leaves out the aux
  heads; "blocks" gives each block cost 1. The authors' aux head is costly on
  large feature maps (on 32x32 CIFAR maps, more than all of ResNet-20), so
  "flops" moves cuts towards the low-resolution end of the network.

  Args:
    preset: a key of `PRESETS`, e.g. "resnet56" or "resnet50".
    num_classes: number of output classes.
    num_modules: number of modules K, 1 <= K <= number of blocks.
    split: optional list of K positive block counts summing to the blocks.
    balance: "flops", "main_flops" or "blocks", used when `split` is None.
    input_shape: per-example input shape (H, W, C) for the cost estimate;
      defaults to 32x32x3 (CIFAR presets) or 224x224x3 (ImageNet presets).
    aux_head: a registered kind (`aux_heads.names()`, described by
      `aux_heads.describe()`), a list of conv widths, or None for no aux
      heads.
    width, stage_blocks, shortcut, synchronized_bn: as for `resnet_layers`.
    name: prefix of the module names (`{name}_module{k}`).

  Returns:
    A list of K `InterlockModule`s.
  """
  stem, blocks, head = resnet_layers(
      preset, num_classes, width=width, stage_blocks=stage_blocks,
      shortcut=shortcut, synchronized_bn=synchronized_bn)

  def new_aux_head(k):
    if aux_head is None:
      return None
    if isinstance(aux_head, str):
      return aux_heads.make_aux_head(
          aux_head, num_classes, aux_heads.IMAGE_FEATURES,
          synchronized_bn=synchronized_bn, name=f"aux_head{k}")
    return aux_heads.make_conv_aux_head(
        aux_head, num_classes, synchronized_bn=synchronized_bn,
        name=f"aux_head{k}")

  probe = new_aux_head(0)  # Fails early on a bad `aux_head`, even for K = 1.

  def costs(balance):
    shape = input_shape or DEFAULT_INPUT_SHAPES[_preset(preset)[0]]
    flops, shapes = count_flops([stem] + blocks + [head], shape)
    block_costs = flops[1:-1]
    block_costs[0] += flops[0]
    block_costs[-1] += flops[-1]
    # shapes[j + 2] is the output shape of block j, what A_k would see.
    # A head without a FLOP count ("linear": one dense layer) is left out.
    cuts = ([probe.flops(s) for s in shapes[2:]]
            if hasattr(probe, "flops") and balance == "flops" else None)
    return block_costs, cuts

  return common.split_modules(
      [stem], blocks, [head], num_modules, split=split, balance=balance,
      costs=costs, new_aux_head=new_aux_head, name=name)
