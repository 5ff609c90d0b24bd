"""Tests for the language-model text pipelines."""

import collections
import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from train.data import text

WORDS = ("the cat dog sat ran on under a mat log quickly slowly big small "
         "red blue house tree fish bird").split()


@pytest.fixture(name="corpus_dir")
def fixture_corpus_dir(tmp_path):
  """A fortunes-style directory: % separated entries plus files to skip."""
  rng = np.random.default_rng(0)
  corpus_dir = tmp_path / "fortunes"
  corpus_dir.mkdir()
  for name, n in (("animals", 150), ("houses", 90)):
    entries = [" ".join(rng.choice(WORDS, rng.integers(5, 25))).capitalize()
               + "." for _ in range(n)]
    (corpus_dir / name).write_text("\n%\n".join(entries) + "\n%\n")
    (corpus_dir / (name + ".dat")).write_bytes(bytes(range(256)))
    os.symlink(corpus_dir / name, corpus_dir / (name + ".u8"))
  (corpus_dir / ".hidden").write_text("never read")
  return str(corpus_dir)


def _corpus(corpus_dir, **kwargs):
  return text.TextCorpus(paths=(corpus_dir,), val_fraction=0.2, **kwargs)


def _documents(corpus, split):
  return [d.decode() for d in corpus.documents(split).as_numpy_iterator()]


def test_read_documents_skips_indexes_and_links(corpus_dir, tmp_path):
  docs = text.read_documents([corpus_dir])
  assert len(docs) == 240 and text.read_documents(corpus_dir) == docs
  assert all(d.endswith(".") and "%" not in d for d in docs)
  assert [os.path.basename(p) for p in text.list_text_files([corpus_dir])] == [
      "animals", "houses"]
  paragraphs = tmp_path / "paragraphs.txt"
  paragraphs.write_text("one\ntwo\n\n  \nthree 50%\n%\nfour\n")
  assert text.read_documents([str(paragraphs)], separator="") == [
      "one\ntwo", "three 50%\n%\nfour"]


def test_missing_and_empty_corpora(tmp_path):
  missing = str(tmp_path / "missing")
  with pytest.raises(FileNotFoundError, match=f"Received: path={missing}$"):
    text.read_documents([missing])
  with pytest.raises(FileNotFoundError, match="No text files in directory"):
    text.read_documents([str(tmp_path)])
  empty = tmp_path / "empty"
  empty.write_text("%\n\n%\n")
  with pytest.raises(ValueError, match=f"no document in .*{empty}"):
    text.read_documents([str(empty)])
  with pytest.raises(ValueError, match="Received: source='wiki'"):
    text.TextCorpus(source="wiki")


def test_validation_split_is_disjoint_and_stable(corpus_dir):
  corpus = _corpus(corpus_dir)
  train, val = _documents(corpus, "train"), _documents(corpus, "validation")
  assert not set(train) & set(val)
  assert sorted(train + val) == sorted(text.read_documents([corpus_dir]))
  assert 20 < len(val) < 80  # About 20% of 240.
  assert _documents(corpus, "validation") == val
  with pytest.raises(ValueError, match="Received: split='test'"):
    corpus.documents("test")
  tiny = text.TextCorpus(paths=(corpus_dir,), val_fraction=1e-4)
  with pytest.raises(ValueError, match="validation split .* is empty"):
    tiny.documents("validation")


def test_wordpiece_vocabulary_is_cached(corpus_dir, tmp_path):
  corpus, cache_dir = _corpus(corpus_dir), str(tmp_path / "cache")
  vocab = text.get_vocabulary(corpus, vocab_size=300, cache_dir=cache_dir)
  assert vocab.tokens[:3] == text.RESERVED_TOKENS
  assert {"the", "cat", "quickly"} <= set(vocab.tokens)
  assert os.path.dirname(vocab.path) == cache_dir
  ids = vocab.tokenize(["The cat sat on a zebra."]).numpy()[0]
  assert [vocab.tokens[i] for i in ids[:5]] == ["the", "cat", "sat", "on",
                                                "a"]
  assert max(ids) < vocab.size

  # Mark the cached file: the second call must return the marked tokens.
  with open(vocab.path, encoding="utf-8") as f:
    cached = json.load(f)
  cached["tokens"].append("zzcachedzz")
  with open(vocab.path, "w", encoding="utf-8") as f:
    json.dump(cached, f)
  again = text.get_vocabulary(corpus, vocab_size=300, cache_dir=cache_dir)
  assert again.path == vocab.path and again.tokens[-1] == "zzcachedzz"

  # Changing the corpus invalidates the cache key.
  with open(os.path.join(corpus_dir, "houses"), "a") as f:
    f.write("A new entry.\n%\n")
  changed = text.get_vocabulary(corpus, vocab_size=300, cache_dir=cache_dir)
  assert changed.path != vocab.path and "zzcachedzz" not in changed.tokens


def test_packing_matches_token_stream(corpus_dir, tmp_path):
  corpus = _corpus(corpus_dir)
  vocab = text.get_vocabulary(corpus, kind="char", vocab_size=100,
                              lower_case=False, cache_dir=str(tmp_path))
  assert set("the cat.") <= set(vocab.tokens)
  stream = []
  for doc in _documents(corpus, "validation"):
    stream += [vocab.tokens.index(c) for c in doc] + [text.EOS_ID]
  seq_len, batch = 16, 4
  ds = text.lm_dataset(corpus, vocab, "validation", batch, seq_len,
                       training=False)
  assert ds.element_spec[0].shape == (batch, seq_len)
  inputs = np.concatenate([x for x, _ in ds.as_numpy_iterator()])
  targets = np.concatenate([y for _, y in ds.as_numpy_iterator()])
  num_windows = len(stream) // (seq_len + 1) // batch * batch
  assert inputs.shape == (num_windows, seq_len) and inputs.dtype == np.int32
  windows = np.reshape(stream[:num_windows * (seq_len + 1)], (-1, seq_len + 1))
  np.testing.assert_array_equal(inputs, windows[:, :-1])
  np.testing.assert_array_equal(targets, windows[:, 1:])
  np.testing.assert_array_equal(targets[:, :-1], inputs[:, 1:])


def test_training_batches_are_seeded(corpus_dir, tmp_path):
  corpus = _corpus(corpus_dir)
  vocab = text.get_vocabulary(corpus, kind="char", vocab_size=100,
                              cache_dir=str(tmp_path))

  def batches(seed):
    ds = text.lm_dataset(corpus, vocab, "train", 4, 256, training=True,
                         seed=seed, deterministic=True, shuffle_buffer=64)
    return [x for x, _ in ds.take(5).as_numpy_iterator()]

  first, again, other = batches(3), batches(3), batches(4)
  np.testing.assert_array_equal(first, again)
  assert not np.array_equal(first, other)
  assert first[0].shape == (4, 256)
  # Documents strictly inside a window are complete: all from training.
  train = {d.lower() for d in _documents(corpus, "train")}
  inner = []
  for row in np.concatenate(first):
    chunks = "".join(vocab.tokens[i] if i != text.EOS_ID else "\x00"
                     for i in row).split("\x00")
    inner += chunks[1:-1]
  assert len(inner) > 10 and set(inner) <= train


def test_unigram_perplexity(corpus_dir, tmp_path):
  corpus = _corpus(corpus_dir)
  vocab = text.get_vocabulary(corpus, kind="char", vocab_size=100,
                              lower_case=False, cache_dir=str(tmp_path))
  counts = {}
  for split in text.SPLITS:
    docs = _documents(corpus, split)
    counts[split] = collections.Counter("".join(docs))
    counts[split][None] = len(docs)  # One EOS per document.
  total = sum(counts["train"].values()) + vocab.size
  log_likelihood = sum(n * np.log((counts["train"][tok] + 1) / total)
                       for tok, n in counts["validation"].items())
  expected = np.exp(-log_likelihood / sum(counts["validation"].values()))
  got = text.unigram_perplexity(corpus, vocab)
  assert got == pytest.approx(expected, rel=1e-9)
  assert 1.0 < got < vocab.size


def test_lm1b_from_mock_data(tmp_path):
  with tfds.testing.mock_data(num_examples=40):
    corpus = text.TextCorpus(source="lm1b")
    vocab = text.get_vocabulary(corpus, vocab_size=64, cache_dir=str(tmp_path))
    ds = text.lm_dataset(corpus, vocab, "train", 2, 8, training=True, seed=0,
                         shuffle_buffer=16)
    inputs, targets = next(ds.as_numpy_iterator())
    ppl = text.unigram_perplexity(corpus, vocab)
  assert inputs.shape == targets.shape == (2, 8)
  np.testing.assert_array_equal(targets[:, :-1], inputs[:, 1:])
  assert vocab.tokens[:3] == text.RESERVED_TOKENS and vocab.size <= 64
  assert 1.0 < ppl < vocab.size


def test_real_fortunes():
  """Reads Debian's fortunes when installed, else checks the missing error."""
  if not os.path.isdir(text.DEFAULT_TEXT_DIR):
    with pytest.raises(FileNotFoundError, match=text.DEFAULT_TEXT_DIR):
      text.read_documents([text.DEFAULT_TEXT_DIR])
    return
  docs = text.read_documents([text.DEFAULT_TEXT_DIR])
  assert len(docs) > 10000
  assert not any(line.strip() == "%" for d in docs for line in d.split("\n"))
  assert all(not p.endswith((".dat", ".u8"))
             for p in text.list_text_files([text.DEFAULT_TEXT_DIR]))
