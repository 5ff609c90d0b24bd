"""Layer helpers shared by the networks: conv + BN, tracking, the split.

Every network here (ResNet, Transformer LM) is a stack of blocks with
layers before the first (stem, embeddings) and after the last (output
head). `split_modules` cuts that stack depthwise into K interlocking modules
(Gomez et al., 2022, arXiv:2010.04116): module 1 gets the layers before the
blocks, module K the output head and no aux head, every module k < K an aux
head A_k on its output, and each module a contiguous run of blocks, either
as given or balanced by `partition.balanced_split` to minimise the slowest
module's cost.

Costs use one convention, `layer.flops(input_shape)`: FLOPs (2 x
multiply-adds) of one example whose shape, without the batch axis, is
`input_shape` ((H, W, C) for images, (T, d) for sequences).
"""

import keras

from layers.interlock_module import InterlockModule
from layers import partition

BALANCE_MODES = ("flops", "main_flops", "blocks")


def conv2d(filters, kernel_size, strides=1, *, dtype=None, name=None):
  """A 'same'-padded Conv2D for conv + BN pairs.

  No bias: the BN that follows subtracts the mean, and its beta plays that
  role. Weights are He-normal over fan-out (He et al., 2015), as in common
  ResNet code.

  Args:
    filters: output channels.
    kernel_size: side of the square kernel.
    strides: spatial stride.
    dtype: dtype policy (pass the parent layer's `dtype_policy`).
    name: layer name.

  Returns:
    An unbuilt `keras.layers.Conv2D`.
  """
  return keras.layers.Conv2D(
      filters, kernel_size, strides=strides, padding="same", use_bias=False,
      kernel_initializer=keras.initializers.VarianceScaling(
          scale=2.0, mode="fan_out", distribution="untruncated_normal"),
      dtype=dtype, name=name)


def check_bool(name, value):
  """`value` when it is a bool; else one line naming it.

  Python's truth value would take 'no', 'False' or 0.0 as a setting
  (`bool('no')` is True), so a flag of the API takes True or False only.

  Raises:
    ValueError: for anything but True or False.
  """
  if not isinstance(value, bool):
    raise ValueError(f"{name} must be True or False. "
                     f"Received: {name}={value!r}")
  return value


def batch_norm(synchronized=True, *, dtype=None, name=None):
  """BatchNormalization; `synchronized` all-reduces statistics over replicas.

  Under MirroredStrategy, unsynchronized BN lets the moving statistics drift
  apart per replica; synchronized BN works unchanged with the default
  strategy (one replica), so it is the safe default.

  Args:
    synchronized: passed to `keras.layers.BatchNormalization`.
    dtype: dtype policy (pass the parent layer's `dtype_policy`).
    name: layer name.

  Returns:
    An unbuilt `keras.layers.BatchNormalization`.
  """
  check_bool("synchronized_bn", synchronized)
  return keras.layers.BatchNormalization(synchronized=synchronized,
                                         dtype=dtype, name=name)


def track_as_attributes(layer, sublayers):
  """Makes `layer` track each of `sublayers` as an attribute named after it.

  tf.train.Checkpoint does not save Keras 3 layers held only in a Python list
  (keras-team/keras#18398), and says nothing: the restore leaves them at
  their initial values. An attribute per sublayer gets them saved.

  Args:
    layer: the owning Keras layer.
    sublayers: Keras layers with names unique within `layer`.
  """
  for sublayer in sublayers:
    setattr(layer, sublayer.name, sublayer)


def check_balance(balance):
  """Refuses a balance mode outside `BALANCE_MODES`."""
  if balance not in BALANCE_MODES:
    raise ValueError(
        f"balance must be one of {BALANCE_MODES}. Received: "
        f"balance={balance!r}")


def split_modules(first, blocks, last, num_modules, *, split=None,
                  balance="flops", costs=None, new_aux_head=None, name):
  """Cuts first + blocks + last depthwise into K `InterlockModule`s.

  With `split=None` the blocks are partitioned to minimise the slowest
  module's cost: balance="blocks" gives each block cost 1; "flops" and
  "main_flops" take per-block costs (and, for "flops", the cost of the aux
  head a module ending after each block would run) from `costs`.

  Args:
    first: layers before the first block; they join module 1.
    blocks: the blocks to split.
    last: layers after the last block (the output head); they join
      module K.
    num_modules: number of modules K, 1 <= K <= len(blocks).
    split: optional K positive block counts summing to len(blocks).
    balance: "flops", "main_flops" or "blocks", used when `split` is None.
    costs: callable(balance) -> (block costs, cut costs or None), the costs
      of `partition.balanced_split`; needed for "flops" and "main_flops".
    new_aux_head: callable(k) -> the aux head of module k < K, or None.
    name: prefix of the module names (`{name}_module{k}`).

  Returns:
    A list of K unbuilt `InterlockModule`s.
  """
  partition.check_num_modules(num_modules, len(blocks))
  check_balance(balance)
  if split is not None:
    split = partition.check_split(split, len(blocks), num_modules)
  elif balance == "blocks":
    split = partition.balanced_split([1] * len(blocks), num_modules)
  else:
    block_costs, cut_costs = costs(balance)
    split = partition.balanced_split(block_costs, num_modules,
                                     cut_costs=cut_costs)
  modules = []
  for k, group in enumerate(partition.take(blocks, split), start=1):
    is_last = k == len(split)
    body = (list(first) if k == 1 else []) + group + (
        list(last) if is_last else [])
    aux_head = None if is_last or new_aux_head is None else new_aux_head(k)
    modules.append(InterlockModule(body, aux_head=aux_head,
                                   name=f"{name}_module{k}"))
  return modules
