"""The run's data from a `Config`: train and eval pipelines, split sizes.

Synthetic Gaussian clusters, the image datasets (`train.data.images`)
and the text corpora (`train.data.text`), each as a `Task`: the
datasets plus what the model and its loss need to know about them.
"""

import dataclasses
import functools
import os
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tf_interlock import op_errors
from train.data import fashion_mnist_local
from train.data import images
from train.data import text

SYNTHETIC_DIM = 32
SYNTHETIC_CLASSES = 10
# Examples per split of the synthetic dataset.
SYNTHETIC_SIZES = {"train": 4096, "eval": 1024}


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
  train_size: Optional[int] = None  # examples (text: packed sequences)


def _synthetic(config, training):
  """Gaussian clusters: learnable, generated, no files."""
  rng = np.random.default_rng(1234)
  centers = rng.normal(size=(SYNTHETIC_CLASSES, SYNTHETIC_DIM))
  count = SYNTHETIC_SIZES["train" if training else "eval"]
  labels = rng.integers(0, SYNTHETIC_CLASSES, size=count)
  x = centers[labels] + rng.normal(size=(count, SYNTHETIC_DIM)) * 1.5
  ds = tf.data.Dataset.from_tensor_slices(
      (x.astype("float32"), labels.astype("int32")))
  if training:
    ds = ds.shuffle(count, seed=config.run.seed).repeat()
  return ds.batch(config.run.batch_size, drop_remainder=True)


@functools.lru_cache(maxsize=4)
def _text_data(dataset, data_dir, source_dir, vocab_kind, vocab_size):
  """(corpus, vocabulary), built once per process: validation and
  make_task share them, and with them the token counts `text` caches."""
  if dataset == "lm1b":
    corpus = text.TextCorpus(source="lm1b", data_dir=data_dir)
  else:
    corpus = text.TextCorpus(paths=source_dir or text.DEFAULT_TEXT_DIR)
  vocab = text.get_vocabulary(
      corpus, kind=vocab_kind, vocab_size=vocab_size,
      cache_dir=os.path.join(data_dir, "vocab") if data_dir else None)
  return corpus, vocab


def _text(config):
  return _text_data(config.data.dataset, config.data.data_dir, config.data.source_dir,
                    config.data.vocab_kind, config.data.vocab_size)


def split_sizes(config):
  """(train, eval) examples of the dataset; packed sequences for text.

  Synthetic and image sizes are static, but for Fashion-MNIST read from a
  --source_dir (its IDX headers); text sizes count the tokens of each
  split, so the corpus is read and its vocabulary learnt (or loaded).
  """
  if config.data.dataset == "synthetic":
    return SYNTHETIC_SIZES["train"], SYNTHETIC_SIZES["eval"]
  if config.is_text:
    corpus, vocab = _text(config)
    # lm_dataset packs the token stream (EOS after each document) into
    # windows of seq_len + 1 tokens.
    return tuple(
        text.num_tokens(corpus, vocab, split) // (config.network.seq_len + 1)
        for split in text.SPLITS)
  info = images.dataset_info(config.data.dataset)
  if config.data.source_dir and info.tfds_name == "fashion_mnist_local":
    # The files given, not the official 60,000: --epochs counts these.
    return fashion_mnist_local.split_counts(config.data.source_dir)
  return info.splits["train"], info.splits[info.eval_split]


def name_damaged_file(config, error):
  """After `error`, a DataLossError while training read its data: the
  prepared image files are read through, and a damaged one is named.

  Raises:
    ValueError: the file (`images.check_prepared_files`), with TF's error;
      nothing when the data is not a prepared image data set or no file
      is found damaged.
  """
  if config.data.dataset == "synthetic" or config.is_text:
    return
  try:
    images.check_prepared_dataset(
        config.data.dataset, data_dir=config.data.data_dir,
        source_dir=config.data.source_dir, read_all=True)
  except ValueError as e:
    head, _, received = str(e).rpartition(" Received: ")
    reason = op_errors.kernel_message(getattr(error, "message", error))
    raise ValueError(f"{head} (training read: {type(error).__name__}: "
                     f"{reason}). Received: {received}") from None


def make_task(config, with_train=True):
  """Train and eval datasets (global batches) and the task's shape.

  Args:
    config: the `Config`.
    with_train: False leaves `Task.train` None (evaluation and export need
      no shuffled, repeated training pipeline).
  """
  train_size, _ = split_sizes(config)
  if config.data.dataset == "synthetic":
    return Task("classification", SYNTHETIC_CLASSES, (SYNTHETIC_DIM,),
                tf.float32, _synthetic(config, True) if with_train else None,
                _synthetic(config, False), train_size=train_size)
  if config.is_text:
    corpus, vocab = _text(config)
    common = dict(batch_size=config.run.batch_size, seq_len=config.network.seq_len,
                  seed=config.run.seed, deterministic=config.run.deterministic)
    return Task(
        "lm", vocab.size, (config.network.seq_len,), tf.int32,
        text.lm_dataset(corpus, vocab, "train", training=True, **common)
        if with_train else None,
        text.lm_dataset(corpus, vocab, "validation", training=False,
                        **common),
        unigram_perplexity=text.unigram_perplexity(corpus, vocab),
        train_size=train_size)
  info = images.dataset_info(config.data.dataset)
  common = dict(batch_size=config.run.batch_size, data_dir=config.data.data_dir,
                source_dir=config.data.source_dir, seed=config.run.seed,
                deterministic=config.run.deterministic)
  return Task(
      "classification", info.num_classes, info.image_shape, tf.float32,
      images.image_dataset(config.data.dataset, "train", training=True,
                           augment=config.data.augment, **common)
      if with_train else None,
      images.image_dataset(config.data.dataset, info.eval_split,
                           training=False, **common),
      train_size=train_size)
