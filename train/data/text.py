"""Language-model input pipelines: documents, vocabularies and packing.

A `TextCorpus` yields documents, either TFDS's `lm1b` sentences or entries of
local text files (by default Debian's fortunes, whose entries are separated
by lines holding a single `%`). Local documents are split into train and
validation by a hash of their text, so the split is stable across runs and
duplicated entries never straddle it.

  corpus = TextCorpus()
  vocab = get_vocabulary(corpus, kind="wordpiece", vocab_size=8000)
  ds = lm_dataset(corpus, vocab, "train", 32, 128, training=True, seed=0)
  inputs, targets = next(iter(ds))  # [32, 128] int32 each
  baseline = unigram_perplexity(corpus, vocab)  # an LM must beat this
"""

import collections
import dataclasses
import functools
import hashlib
import json
import os
import random
import re
import zlib
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
import tensorflow_text as tf_text
from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset

from train import owned_dir
from train import paths

DEFAULT_TEXT_DIR = "/usr/share/games/fortunes"
DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache",
                                 "tf_interlock", "vocab")
SOURCES = ("local", "lm1b")
SPLITS = ("train", "validation")
TOKENIZERS = ("wordpiece", "char")
RESERVED_TOKENS = ("[PAD]", "[UNK]", "[EOS]")
PAD_ID, UNK_ID, EOS_ID = 0, 1, 2

# lm1b ships its own held-out sentences; local corpora are split by hash.
_LM1B_SPLITS = {"train": "train", "validation": "test"}
_HASH_BUCKETS = 10000


def list_text_files(paths: Union[str, Sequence[str]]) -> List[str]:
  """Expands files and directories (not recursively) into text files.

  In a directory every regular file counts except hidden ones and `*.dat`
  (strfile's binary indexes); links to a file already listed (the fortunes
  `*.u8` links) are skipped.

  Args:
    paths: A file or directory, or a sequence of them.

  Returns:
    Paths of the text files in sorted order, each real file once.

  Raises:
    FileNotFoundError: If a path does not exist or a directory holds no file.
  """
  files, seen = [], set()
  for path in [paths] if isinstance(paths, str) else paths:
    if os.path.isdir(path):
      found = [os.path.join(path, name) for name in sorted(os.listdir(path))
               if not name.startswith(".") and not name.endswith(".dat")]
      found = [f for f in found if os.path.isfile(f)]
      if not found:
        raise FileNotFoundError(f"No text files in directory {path}; expected "
                                f"at least one. Received: path={path}")
    elif os.path.isfile(path):
      found = [path]
    else:
      raise FileNotFoundError(f"Text corpus path {path} does not exist; "
                              f"expected a file or directory. "
                              f"Received: path={path}")
    for f in found:
      if os.path.realpath(f) not in seen:
        seen.add(os.path.realpath(f))
        files.append(f)
  return files


def read_documents(paths: Union[str, Sequence[str]],
                   separator: str = "%") -> List[str]:
  """Returns the non-empty, stripped documents of text files, in file order.

  Args:
    paths: Files or directories, see `list_text_files`.
    separator: A line holding only this (and blanks) ends a document; ""
      splits on blank lines. A file without separators is one document.

  Raises:
    FileNotFoundError: If a path does not exist.
    ValueError: If the files hold no document.
  """
  pattern = re.compile(rf"^[ \t]*{re.escape(separator)}[ \t]*$", re.MULTILINE)
  documents = []
  for path in list_text_files(paths):
    with open(path, encoding="utf-8", errors="replace") as f:
      documents += [d.strip() for d in pattern.split(f.read()) if d.strip()]
  if not documents:
    raise ValueError(f"The text corpus is empty: no document in {paths}. "
                     f"Received: paths={paths}")
  return documents


def is_validation(document: str, val_fraction: float) -> bool:
  """Whether a document belongs to the held-out split (stable CRC32 hash)."""
  bucket = zlib.crc32(document.encode("utf-8")) % _HASH_BUCKETS
  return bucket < val_fraction * _HASH_BUCKETS


@dataclasses.dataclass(frozen=True)
class TextCorpus:
  """A source of documents split into "train" and "validation".

  Attributes:
    source: "local" (text files) or "lm1b" (TFDS; validation is its test
      split, and paths, separator and val_fraction are unused).
    paths: Text files or directories (or one) for "local".
    separator: Document separator line for "local", see `read_documents`.
    val_fraction: Fraction of local documents held out for validation.
    data_dir: TFDS data directory for "lm1b".
  """
  source: str = "local"
  paths: Union[str, Tuple[str, ...]] = DEFAULT_TEXT_DIR
  separator: str = "%"
  val_fraction: float = 0.05
  data_dir: Optional[str] = None

  def __post_init__(self):
    if self.source not in SOURCES:
      raise ValueError(f"Unknown text source; expected one of {SOURCES}. "
                       f"Received: source={self.source!r}")
    if not 0.0 < self.val_fraction < 1.0:
      raise ValueError(f"val_fraction must be in (0, 1). "
                       f"Received: val_fraction={self.val_fraction}")

  def documents(self, split: str,
                max_documents: Optional[int] = None) -> tf.data.Dataset:
    """Returns the documents of a split as a dataset of scalar strings.

    Args:
      split: "train" or "validation".
      max_documents: Keep at most this many (the first ones); None keeps all.

    Raises:
      ValueError: If `split` is unknown or holds no document.
    """
    if split not in SPLITS:
      raise ValueError(f"Unknown text split; expected one of {SPLITS}. "
                       f"Received: split={split!r}")
    if self.source == "lm1b":
      ds = tfds.load("lm1b", split=_LM1B_SPLITS[split],
                     data_dir=self.data_dir).map(lambda ex: ex["text"])
      empty = next(iter(ds.take(1)), None) is None
    else:
      held_out = split == "validation"
      docs = [d for d in read_documents(self.paths, self.separator)
              if is_validation(d, self.val_fraction) == held_out]
      ds = tf.data.Dataset.from_tensor_slices(tf.constant(docs, tf.string))
      empty = not docs
    if empty:
      where = "lm1b" if self.source == "lm1b" else self.paths
      raise ValueError(f"The {split} split of the text corpus {where} is "
                       f"empty; expected at least one document. "
                       f"Received: split={split!r}")
    return ds if max_documents is None else ds.take(max_documents)

  def fingerprint(self) -> str:
    """Returns a short hash that changes when the training text may change."""
    if self.source == "lm1b":
      key = ["lm1b"]
    else:
      key = [self.separator, self.val_fraction]
      for path in list_text_files(self.paths):
        stat = os.stat(path)
        key.append((os.path.abspath(path), stat.st_size, stat.st_mtime_ns))
    return hashlib.sha1(json.dumps(key).encode()).hexdigest()[:16]


def _check_kind(kind: str) -> None:
  if kind not in TOKENIZERS:
    raise ValueError(f"Unknown tokenizer; expected one of {TOKENIZERS}. "
                     f"Received: kind={kind!r}")


class Vocabulary:
  """Token strings plus the TF tokenizer mapping text to their ids.

  Attributes:
    tokens: Token strings, starting with RESERVED_TOKENS ([PAD], [UNK] and
      [EOS] have ids 0, 1, 2); a "char" vocabulary then holds one Unicode
      character per token.
    kind: "wordpiece" or "char".
    lower_case: Whether text is case-folded before tokenization.
    path: The cache file the tokens came from, if any.
  """

  def __init__(self, tokens: Sequence[str], kind: str, lower_case: bool,
               path: Optional[str] = None):
    _check_kind(kind)
    if tuple(tokens[:len(RESERVED_TOKENS)]) != RESERVED_TOKENS:
      raise ValueError(f"A vocabulary must start with {RESERVED_TOKENS}. "
                       f"Received: tokens[:3]={list(tokens[:3])}")
    self.tokens = tuple(tokens)
    self.kind = kind
    self.lower_case = lower_case
    self.path = path
    ids = tf.range(len(self.tokens), dtype=tf.int64)
    if kind == "wordpiece":
      table = tf.lookup.StaticVocabularyTable(
          tf.lookup.KeyValueTensorInitializer(list(self.tokens), ids),
          num_oov_buckets=1)
      self._bert = tf_text.BertTokenizer(
          table, lower_case=lower_case, unknown_token=RESERVED_TOKENS[UNK_ID],
          token_out_type=tf.int64)
    else:
      codepoints = [ord(t) for t in self.tokens[len(RESERVED_TOKENS):]]
      self._chars = tf.lookup.StaticHashTable(
          tf.lookup.KeyValueTensorInitializer(
              tf.constant(codepoints, tf.int64), ids[len(RESERVED_TOKENS):]),
          default_value=UNK_ID)

  @property
  def size(self) -> int:
    return len(self.tokens)

  def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
    """Maps a [batch] string tensor to ragged int64 token ids [batch, None]."""
    if self.kind == "wordpiece":
      return self._bert.tokenize(texts).merge_dims(-2, -1)
    if self.lower_case:
      texts = tf_text.case_fold_utf8(texts)
    codepoints = tf_text.UnicodeCharTokenizer().tokenize(texts)
    return tf.ragged.map_flat_values(
        self._chars.lookup, tf.cast(codepoints, tf.int64))


def _learn_chars(docs: tf.data.Dataset, vocab_size: int,
                 lower_case: bool) -> List[str]:
  """Returns the vocab_size - 3 most frequent characters, ties by code point."""
  counts = collections.Counter()
  for batch in docs:
    if lower_case:
      batch = tf_text.case_fold_utf8(batch)
    codepoints = tf_text.UnicodeCharTokenizer().tokenize(batch).flat_values
    counts.update(codepoints.numpy().tolist())
  ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
  return [chr(c) for c, _ in ranked[:vocab_size - len(RESERVED_TOKENS)]]


def get_vocabulary(corpus: TextCorpus, *, kind: str = "wordpiece",
                   vocab_size: int = 8000, lower_case: bool = True,
                   cache_dir: Optional[str] = None,
                   max_documents: Optional[int] = 200000) -> Vocabulary:
  """Loads the vocabulary of a corpus from the cache, learning it if absent.

  WordPiece vocabularies are learnt with bert_vocab_from_dataset (pure Python:
  about 1.5 minutes for the 2.5 MB fortunes corpus on one core), which is why
  they are cached. The cache key covers the corpus files, their sizes and
  modification times, and every argument below except cache_dir.

  Args:
    corpus: Its train split is the learning text.
    kind: "wordpiece" or "char".
    vocab_size: Maximum number of tokens, reserved ones included.
    lower_case: Case-fold text (WordPiece also strips accents).
    cache_dir: Directory of vocabulary files; None uses DEFAULT_CACHE_DIR.
    max_documents: Learn from at most this many training documents (lm1b
      has 30M); None uses all.

  Returns:
    The Vocabulary, with `path` set to its cache file.

  Raises:
    ValueError: If `kind` is unknown, vocab_size leaves no room for tokens,
      or (wordpiece) is smaller than the corpus's characters need.
  """
  _check_kind(kind)
  if vocab_size <= len(RESERVED_TOKENS):
    raise ValueError(f"vocab_size must exceed the {len(RESERVED_TOKENS)} "
                     f"reserved tokens. Received: vocab_size={vocab_size}")
  cache_dir = cache_dir or DEFAULT_CACHE_DIR
  case = "lower" if lower_case else "cased"
  path = os.path.join(cache_dir, f"{corpus.source}-{kind}-{vocab_size}-{case}-"
                      f"{max_documents}-{corpus.fingerprint()}.json")
  if os.path.exists(path):
    try:
      tokens = owned_dir.load_json(path, {"tokens": list})["tokens"]
    except ValueError as e:
      raise ValueError(f"The cached vocabulary {path} {e}; delete it to "
                       f"learn it again. Received: cache_dir={cache_dir!r}"
                       ) from None
    return Vocabulary(tokens, kind, lower_case, path)

  docs = corpus.documents("train", max_documents).batch(1024).prefetch(
      tf.data.AUTOTUNE)
  if kind == "wordpiece":
    tokens = bert_vocab_from_dataset.bert_vocab_from_dataset(
        docs, vocab_size, list(RESERVED_TOKENS),
        bert_tokenizer_params={"lower_case": lower_case})
    # The learner always keeps every character (and its "##" form), so a
    # small vocab_size yields more tokens than asked.
    if len(tokens) > vocab_size:
      raise ValueError(
          f"vocab_size={vocab_size} is too small for a wordpiece vocabulary "
          f"of this corpus: its characters alone take {len(tokens)} tokens; "
          f"use vocab_size >= {len(tokens)} or kind='char'. "
          f"Received: vocab_size={vocab_size}")
  else:
    tokens = list(RESERVED_TOKENS) + _learn_chars(docs, vocab_size, lower_case)
  os.makedirs(cache_dir, exist_ok=True)
  # A concurrent or interrupted run never leaves a partial file that a later
  # run would trust.
  paths.write_atomic(path, json.dumps(
      {"kind": kind, "lower_case": lower_case, "tokens": tokens},
      ensure_ascii=False))
  return Vocabulary(tokens, kind, lower_case, path)


def _flat_ids(docs: tf.data.Dataset, vocab: Vocabulary,
              batch_size: int = 256) -> tf.data.Dataset:
  """Tokenizes batches of documents into 1-D id vectors, each doc + EOS."""

  def tokenize(texts):
    ids = vocab.tokenize(texts)
    eos = tf.fill([ids.nrows(), 1], tf.constant(EOS_ID, tf.int64))
    return tf.concat([ids, eos], axis=1).flat_values

  return docs.batch(batch_size).map(tokenize,
                                    num_parallel_calls=tf.data.AUTOTUNE)


def lm_dataset(corpus: TextCorpus, vocab: Vocabulary, split: str,
               batch_size: int, seq_len: int, *, training: bool,
               seed: Optional[int] = None, deterministic: bool = False,
               drop_remainder: bool = True,
               shuffle_buffer: int = 10000) -> tf.data.Dataset:
  """Returns batches of packed (inputs, targets) for next-token prediction.

  Each document's tokens and an EOS token are concatenated into one stream,
  cut into windows of seq_len + 1; a window w gives inputs w[:-1], targets
  w[1:]. Windows cross document boundaries, so no padding is needed.

  Args:
    corpus, vocab: The corpus and its vocabulary.
    split: "train" or "validation".
    batch_size: Sequences per batch.
    seq_len: Tokens per sequence.
    training: If True, shuffle documents and sequences and repeat forever.
      Validation always keeps its order, so it packs the same sequences on
      every pass.
    seed: Shuffle seed; None draws one.
    deterministic: Keep element order fixed while training, so that a fixed
      seed reproduces the same batches.
    drop_remainder: Drop the last partial batch (static batch dimension).
    shuffle_buffer: Documents, and packed sequences, held in each shuffle
      buffer when training.

  Returns:
    A tf.data.Dataset of (inputs [B, seq_len], targets [B, seq_len]), int32,
    where targets[:, i] is the token following inputs[:, i].
  """
  if seed is None:
    seed = random.SystemRandom().randrange(2**31)
  options = tf.data.Options()
  options.deterministic = deterministic or not training
  docs = corpus.documents(split)
  if training:
    docs = docs.shuffle(shuffle_buffer, seed=seed).repeat()
  # rebatch cuts the stream of variable-length id vectors into fixed windows
  # regardless of where the vectors end.
  windows = _flat_ids(docs, vocab).rebatch(seq_len + 1, drop_remainder=True)
  if training:
    windows = windows.shuffle(shuffle_buffer, seed=seed + 1)
  ds = windows.map(lambda w: (tf.cast(w[:-1], tf.int32),
                              tf.cast(w[1:], tf.int32)))
  ds = ds.batch(batch_size, drop_remainder=drop_remainder)
  return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


@functools.lru_cache(maxsize=8)
def _token_counts(corpus: TextCorpus, vocab: Vocabulary, split: str,
                  max_documents: Optional[int]) -> np.ndarray:
  """Counts each token id in a split, EOS tokens included.

  Cached per (corpus, vocabulary object, split): the sizes and the unigram
  baseline of a run read the corpus once. Callers must not modify the
  returned array.
  """
  docs = corpus.documents(split, max_documents)
  counts = np.zeros(vocab.size, np.int64)
  for batch in _flat_ids(docs, vocab, 1024).as_numpy_iterator():
    counts += np.bincount(batch, minlength=vocab.size)
  return counts


def num_tokens(corpus: TextCorpus, vocab: Vocabulary, split: str) -> int:
  """Tokens of a split, one EOS per document included: the length of the
  stream `lm_dataset` packs into windows of seq_len + 1."""
  return int(_token_counts(corpus, vocab, split, None).sum())


def unigram_perplexity(corpus: TextCorpus, vocab: Vocabulary, *,
                       max_documents: Optional[int] = None) -> float:
  """Returns exp(mean -log p) of validation tokens under training unigrams.

  The unigram probabilities use add-one smoothing over the whole vocabulary,
  so that tokens unseen in training keep a finite cost. A language model's
  validation perplexity on the same tokens must be lower to have learnt
  anything beyond token frequencies.

  Args:
    corpus, vocab: The corpus and its vocabulary.
    max_documents: Use at most this many documents of each split.
  """
  train = _token_counts(corpus, vocab, "train", max_documents)
  val = _token_counts(corpus, vocab, "validation", max_documents)
  log_probs = np.log(train + 1.0) - np.log(train.sum() + vocab.size)
  return float(np.exp(-(val * log_probs).sum() / val.sum()))
