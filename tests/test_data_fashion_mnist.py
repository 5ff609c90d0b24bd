"""Tests for the local Fashion-MNIST TFDS builder and its image pipeline."""

import os

import numpy as np
import pytest

from train.data import fashion_mnist_local as fm
from train.data import images
from tests.idx_files import write_idx, write_split

NUM_TRAIN, NUM_TEST = 40, 12


@pytest.fixture(name="source")
def fixture_source(tmp_path):
  """Small IDX files: train gzipped, test plain, to cover both readers."""
  rng = np.random.default_rng(0)
  source_dir = str(tmp_path / "idx")
  os.makedirs(source_dir)
  arrays = {}
  for split, n, gz in (("train", NUM_TRAIN, True), ("test", NUM_TEST, False)):
    arrays[split] = (rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
                     np.arange(n, dtype=np.uint8) % 10)
    write_split(source_dir, split, *arrays[split], gz=gz)
  return source_dir, arrays


def _one_line(excinfo):
  return "\n" not in str(excinfo.value)


def test_read_split_round_trips(source):
  source_dir, arrays = source
  for split in ("train", "test"):
    got_images, got_labels = fm.read_split(source_dir, split)
    np.testing.assert_array_equal(got_images, arrays[split][0])
    np.testing.assert_array_equal(got_labels, arrays[split][1])


def test_builder_prepares_both_splits(source, tmp_path):
  source_dir, arrays = source
  builder = fm.FashionMnistLocal(source_dir=source_dir,
                                 data_dir=str(tmp_path / "tfds"))
  builder.download_and_prepare()
  assert builder.info.splits["train"].num_examples == NUM_TRAIN
  assert builder.info.splits["test"].num_examples == NUM_TEST
  assert builder.info.features["label"].num_classes == 10
  ds = builder.as_dataset(split="test", as_supervised=True, batch_size=-1)
  got_images, got_labels = (t.numpy() for t in ds)
  assert got_images.shape == (NUM_TEST, 28, 28, 1)
  assert got_images.dtype == np.uint8
  # TFDS may reorder examples; compare them as (label, pixels) multisets.
  def as_set(images_array, labels):
    return sorted((int(l), i.tobytes()) for i, l in zip(images_array, labels))
  assert as_set(got_images[..., 0], got_labels) == as_set(*arrays["test"])


def test_configs_are_keyed_by_source_dir(tmp_path):
  first = fm.FashionMnistLocal(source_dir=str(tmp_path / "a"))
  second = fm.FashionMnistLocal(source_dir=str(tmp_path / "b"))
  assert first.builder_config.name != second.builder_config.name
  assert fm.FashionMnistLocal().builder_config.source_dir == (
      fm.DEFAULT_SOURCE_DIR)


def test_missing_file_names_it(source, tmp_path):
  source_dir, _ = source
  os.remove(os.path.join(source_dir, "t10k-labels-idx1-ubyte"))
  builder = fm.FashionMnistLocal(source_dir=source_dir,
                                 data_dir=str(tmp_path / "tfds"))
  with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte") as e:
    builder.download_and_prepare()
  assert source_dir in str(e.value) and _one_line(e)


def test_missing_directory(tmp_path):
  missing = str(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError,
                     match=f"source directory {missing} does not exist"):
    fm.read_split(missing, "train")


@pytest.mark.parametrize("case, message", [
    ("truncated", r"is truncated: the header declares 12x28x28 = 9408 bytes"),
    ("short_header", r"shorter than the 16-byte IDX header"),
    ("bad_magic", r"magic number 0x00000801, expected 0x00000803"),
    ("wrong_shape", r"holds items of shape 12x32x32, expected Nx28x28"),
    ("wrong_count", r"holds items of shape 12x28x28, expected 10000x28x28"),
])
def test_malformed_images_file(source, case, message):
  source_dir, arrays = source
  path = os.path.join(source_dir, "t10k-images-idx3-ubyte")
  test_images = arrays["test"][0]
  if case == "truncated":
    write_idx(path, test_images, keep_bytes=16 + test_images.size - 5)
  elif case == "short_header":
    write_idx(path, test_images, keep_bytes=10)
  elif case == "bad_magic":
    write_idx(path, test_images, magic=0x801)
  elif case == "wrong_shape":
    write_idx(path, np.zeros((NUM_TEST, 32, 32), np.uint8))
  count = 10000 if case == "wrong_count" else None
  with pytest.raises(ValueError, match=message) as e:
    fm.read_split(source_dir, "test", count)
  assert f"Received: path={path}" in str(e.value) and _one_line(e)


def test_truncated_gzip_and_mismatched_labels(source):
  source_dir, arrays = source
  path = os.path.join(source_dir, "train-images-idx3-ubyte.gz")
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[:len(data) // 2])
  with pytest.raises(ValueError, match="is not a complete gzip file") as e:
    fm.read_split(source_dir, "train")
  assert path in str(e.value) and _one_line(e)

  labels_path = os.path.join(source_dir, "t10k-labels-idx1-ubyte")
  write_idx(labels_path, arrays["test"][1][:-1])
  with pytest.raises(ValueError, match=f"holds {NUM_TEST - 1} labels, "
                     f"expected {NUM_TEST}"):
    fm.read_split(source_dir, "test")


def test_image_pipeline_on_local_builder(source, tmp_path):
  source_dir, _ = source
  data_dir = str(tmp_path / "tfds")
  ds = images.image_dataset("fashion_mnist", "test", 4, training=False,
                            source_dir=source_dir, data_dir=data_dir)
  batches = list(ds)
  assert len(batches) == NUM_TEST // 4
  assert batches[0][0].shape == (4, 28, 28, 1)
  with pytest.raises(ValueError, match="fewer than one batch"):
    images.image_dataset("fashion_mnist", "test", 64, training=False,
                         source_dir=source_dir, data_dir=data_dir)
  with pytest.raises(ValueError, match="is empty"):
    images.image_dataset("fashion_mnist", "test[:0]", 4, training=False,
                         source_dir=source_dir, data_dir=data_dir)


def test_real_fashion_mnist(tmp_path):
  """Validates Debian's files and their statistics, or the missing-dir error."""
  if not os.path.isdir(fm.DEFAULT_SOURCE_DIR):
    builder = fm.FashionMnistLocal(data_dir=str(tmp_path / "tfds"))
    with pytest.raises(FileNotFoundError, match=fm.DEFAULT_SOURCE_DIR):
      builder.download_and_prepare()
    return
  info = images.dataset_info("fashion_mnist")
  for split, count in info.splits.items():
    split_images, labels = fm.read_split(fm.DEFAULT_SOURCE_DIR, split, count)
    np.testing.assert_array_equal(np.bincount(labels), [count // 10] * 10)
  scaled = split_images / 255.0
  assert abs(scaled.mean() - info.mean[0]) < 2e-3
  assert abs(scaled.std() - info.std[0]) < 2e-3
  # Preparing all 70000 images takes about 18 s here, so the pipeline runs
  # on a real subset instead.
  subset = str(tmp_path / "subset")
  os.makedirs(subset)
  for split in ("train", "test"):
    write_split(subset, split, split_images[:512], labels[:512], gz=False)
  ds = images.image_dataset("fashion_mnist", "test", 128, training=False,
                            source_dir=subset, data_dir=str(tmp_path / "tfds"))
  pixels = np.concatenate([x.numpy() for x, _ in ds])
  assert pixels.shape == (512, 28, 28, 1)
  assert abs(pixels.mean()) < 0.1 and abs(pixels.std() - 1.0) < 0.1
