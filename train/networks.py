"""The network of a `Config` as K InterlockModules: ResNet, Transformer, MLP.

Each takes --aux_head, any registered kind (`layers.aux_heads.KINDS`) that
fits its features; "auto" is the network's own (`AUTO_AUX_HEAD`).

The training, export and evaluation binaries and the research benchmarks
all build their modules here, so a network of a given Config is the same
network everywhere.
"""

import keras

from layers import aux_heads
from layers import resnet
from layers import transformer
from layers.interlock_module import InterlockModule


def mlp_modules(num_classes, num_modules, width, split=None,
                aux_head="linear"):
  """The MLP as K InterlockModules (unbuilt).

  Module k holds split[k] hidden Dense(width, relu) layers; module K ends
  with the Dense(num_classes) output layer, every other module has an aux
  head of kind `aux_head` on its output.

  Args:
    num_classes: output classes.
    num_modules: K.
    width: units of every hidden layer.
    split: K positive counts of hidden layers; None gives one per module.
    aux_head: a registered kind (`layers.aux_heads.names()`) that takes
      flat features [B, width] ("linear": one Dense(num_classes)).
  """
  modules = []
  for k, layers in enumerate(split or (1,) * num_modules):
    last = k == num_modules - 1
    body = [keras.layers.Dense(width, activation="relu")
            for _ in range(layers)]
    if last:
      body.append(keras.layers.Dense(num_classes))
    if last:
      head = None
    elif aux_head == "linear":
      # The MLP's own head, one bare Dense as before --aux_head reached the
      # MLP: the checkpoints of earlier runs hold it so, and resume.
      head = keras.layers.Dense(num_classes, name=f"aux_head{k + 1}")
    else:
      head = aux_heads.make_aux_head(
          aux_head, num_classes, (None, width),
          output_shape=(None, num_classes), name=f"aux_head{k + 1}")
    modules.append(InterlockModule(body, aux_head=head, name=f"mlp{k + 1}"))
  return modules


# What --aux_head=auto builds: the network's own kind.
AUTO_AUX_HEAD = {"resnet": "authors", "transformer": "linear", "mlp": "linear"}


def aux_head_kind(config):
  """The registered aux head kind of `config` (--aux_head, "auto" resolved
  per network)."""
  kind = config.network.aux_head
  return AUTO_AUX_HEAD[config.network.model] if kind == "auto" else kind


def same_aux_head(saved_kind, config):
  """Whether a run recorded with --aux_head=`saved_kind` has the aux heads
  `config` builds: the same kind once "auto" is resolved, or a run made
  before --aux_head reached the MLP and the Transformer, which recorded the
  flag's old default "authors" and built the network's own head."""
  own = AUTO_AUX_HEAD[config.network.model]
  if saved_kind == "auto" or (saved_kind == "authors"
                              and config.network.model != "resnet"):
    saved_kind = own
  return saved_kind == aux_head_kind(config)


def make_modules(config, task, synchronized_bn=True):
  """The network as K InterlockModules (unbuilt).

  Args:
    config: the `Config`: model, its shape fields, num_modules, split.
    task: the `datasets.Task` (num_classes, input_shape).
    synchronized_bn: ResNet only: BatchNormalization all-reduces its
      statistics over replicas (needed under a MirroredStrategy; a
      benchmark on one replica may leave it off, as plain Keras does).
  """
  split = list(config.interlock.split) if config.interlock.split else None
  network, num_modules = config.network, config.interlock.num_modules
  aux_head = aux_head_kind(config)
  if network.model == "resnet":
    return resnet.resnet_modules(
        network.resnet_preset, task.num_classes, num_modules, split=split,
        input_shape=task.input_shape, width=network.resnet_width,
        aux_head=aux_head, synchronized_bn=synchronized_bn)
  if network.model == "transformer":
    return transformer.transformer_lm_modules(
        task.num_classes, network.seq_len, network.num_layers,
        network.d_model, network.num_heads, network.mlp_dim, num_modules,
        split=split, aux_head=aux_head)
  # The MLP's split counts the hidden Dense layers of each module.
  return mlp_modules(task.num_classes, num_modules, network.mlp_width, split,
                     aux_head=aux_head)
