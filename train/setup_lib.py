"""Builds what a run needs from a `Config`: runtime, strategy, data, model.

Small top-level functions, each one concept, used by the train, export,
evaluate and compare binaries.
"""

import dataclasses
import os
from typing import Any, Optional

import keras
import numpy as np
import tensorflow as tf

from layers import resnet
from layers import transformer
from layers.interlock_module import InterlockModule
from tf_interlock import placement as placement_lib
from tf_interlock.data import images
from tf_interlock.data import text

SYNTHETIC_DIM = 32
SYNTHETIC_CLASSES = 10


@dataclasses.dataclass
class Task:
  """What the data looks like: enough to build the model and its loss."""
  kind: str  # "classification" or "lm"
  num_classes: int
  input_shape: tuple
  input_dtype: Any
  train: Optional[tf.data.Dataset]
  eval: tf.data.Dataset
  unigram_perplexity: Optional[float] = None


def setup_runtime(config):
  """Process-wide settings; must run before the first TF op."""
  if config.placement == "simulated":
    placement_lib.configure_simulated_devices(config.num_modules)
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  keras.utils.set_random_seed(config.seed)
  keras.mixed_precision.set_global_policy(
      "mixed_bfloat16" if config.mixed_precision == "bfloat16" else "float32")


def make_distribute(config):
  """TPUStrategy (with K cores per replica), Mirrored on GPUs, or default."""
  if config.placement == "tpu":
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=config.tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    topology = tf.tpu.experimental.initialize_tpu_system(resolver)
    assignment = placement_lib.tpu_device_assignment(topology,
                                                     config.num_modules)
    return tf.distribute.TPUStrategy(
        resolver, experimental_device_assignment=assignment)
  gpus = tf.config.list_logical_devices("GPU")
  if config.placement == "single" and len(gpus) > 1:
    return tf.distribute.MirroredStrategy()
  return tf.distribute.get_strategy()


def _synthetic(config, training):
  """Gaussian clusters: learnable, generated, no files."""
  rng = np.random.default_rng(1234)
  centers = rng.normal(size=(SYNTHETIC_CLASSES, SYNTHETIC_DIM))
  count = 4096 if training else 1024
  labels = rng.integers(0, SYNTHETIC_CLASSES, size=count)
  x = centers[labels] + rng.normal(size=(count, SYNTHETIC_DIM)) * 1.5
  ds = tf.data.Dataset.from_tensor_slices(
      (x.astype("float32"), labels.astype("int32")))
  if training:
    ds = ds.shuffle(count, seed=config.seed).repeat()
  return ds.batch(config.batch_size, drop_remainder=True)


def _text_corpus(config):
  if config.dataset == "lm1b":
    return text.TextCorpus(source="lm1b", data_dir=config.data_dir)
  return text.TextCorpus(paths=config.source_dir or text.DEFAULT_TEXT_DIR)


def make_task(config, with_train=True):
  """Train and eval datasets (global batches) and the task's shape.

  Args:
    config: the `Config`.
    with_train: False leaves `Task.train` None (evaluation and export need
      no shuffled, repeated training pipeline).
  """
  if config.dataset == "synthetic":
    return Task("classification", SYNTHETIC_CLASSES, (SYNTHETIC_DIM,),
                tf.float32, _synthetic(config, True) if with_train else None,
                _synthetic(config, False))
  if config.is_text:
    corpus = _text_corpus(config)
    vocab = text.get_vocabulary(
        corpus, kind=config.vocab_kind, vocab_size=config.vocab_size,
        cache_dir=os.path.join(config.data_dir, "vocab")
        if config.data_dir else None)
    common = dict(batch_size=config.batch_size, seq_len=config.seq_len,
                  seed=config.seed, deterministic=config.deterministic)
    return Task(
        "lm", vocab.size, (config.seq_len,), tf.int32,
        text.lm_dataset(corpus, vocab, "train", training=True, **common)
        if with_train else None,
        text.lm_dataset(corpus, vocab, "validation", training=False,
                        **common),
        unigram_perplexity=text.unigram_perplexity(corpus, vocab))
  info = images.dataset_info(config.dataset)
  common = dict(batch_size=config.batch_size, data_dir=config.data_dir,
                source_dir=config.source_dir, seed=config.seed,
                deterministic=config.deterministic)
  return Task(
      "classification", info.num_classes, info.image_shape, tf.float32,
      images.image_dataset(config.dataset, "train", training=True,
                           augment=config.augment, **common)
      if with_train else None,
      images.image_dataset(config.dataset, "test", training=False, **common))


def make_modules(config, task):
  """The network as K InterlockModules (unbuilt)."""
  if config.model == "resnet":
    return resnet.resnet_modules(
        config.resnet_preset, task.num_classes, config.num_modules,
        split=list(config.split) if config.split else None,
        input_shape=task.input_shape, width=config.resnet_width,
        aux_head=None if config.aux_head == "none" else config.aux_head)
  if config.model == "transformer":
    return transformer.transformer_lm_modules(
        task.num_classes, config.seq_len, config.num_layers, config.d_model,
        config.num_heads, config.mlp_dim, config.num_modules,
        split=list(config.split) if config.split else None)
  modules = []
  for k in range(config.num_modules):
    last = k == config.num_modules - 1
    body = [keras.layers.Dense(config.mlp_width, activation="relu")]
    if last:
      body.append(keras.layers.Dense(task.num_classes))
    head = None if last else keras.layers.Dense(task.num_classes)
    modules.append(InterlockModule(body, aux_head=head, name=f"mlp{k + 1}"))
  return modules


def total_steps(config, task_train_size=None):
  """Training steps of the run (None when only a time budget bounds it)."""
  if config.train_steps is not None:
    return config.train_steps
  if config.epochs is not None:
    size = task_train_size or images.dataset_info(config.dataset).splits[
        "train"]
    return int(config.epochs * size // config.batch_size)
  return None


def learning_rate(config, steps):
  """The LR schedule of every module: warmup, then constant/step/cosine."""
  base = config.learning_rate
  if config.lr_schedule == "constant" or steps is None:
    schedule = base
  elif config.lr_schedule == "step":
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay(
        [int(f * steps) for f in config.lr_decay_fractions],
        [base * config.lr_decay_factor ** i
         for i in range(len(config.lr_decay_fractions) + 1)])
  elif config.warmup_steps:
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, max(1, steps - config.warmup_steps), warmup_target=base,
        warmup_steps=config.warmup_steps)
  else:
    schedule = keras.optimizers.schedules.CosineDecay(base, steps)
  return schedule


def make_optimizer(config, steps):
  """One module's optimizer (call once per module, inside the scope)."""
  lr = learning_rate(config, steps)
  if config.optimizer == "sgd":
    return keras.optimizers.SGD(lr, momentum=config.momentum,
                                weight_decay=config.weight_decay or None)
  if config.optimizer == "adam":
    return keras.optimizers.Adam(lr, weight_decay=config.weight_decay or None)
  return keras.optimizers.AdamW(lr, weight_decay=config.weight_decay)
