"""A TFDS builder for Fashion-MNIST that reads local IDX files.

TFDS's own `fashion_mnist` downloads the archives and checks their checksums.
Machines without network access may still hold the four IDX files (Debian's
dataset-fashion-mnist installs them, recompressed, so the checksums do not
match). This builder reads them from a directory instead, validating every
header so that a damaged file fails with a one-line error naming it.

Usage:
  builder = FashionMnistLocal(source_dir="/path/to/idx", data_dir="/tmp/tfds")
  builder.download_and_prepare()
  ds = builder.as_dataset(split="train", as_supervised=True)
"""

import dataclasses
import gzip
import hashlib
import os
import logging
import zlib
from typing import Optional, Tuple

from absl import logging as absl_logging
import numpy as np
import tensorflow_datasets as tfds

DEFAULT_SOURCE_DIR = "/usr/share/datasets/fashion-mnist"

CLASS_NAMES = ("t-shirt_top", "trouser", "pullover", "dress", "coat",
               "sandal", "shirt", "sneaker", "bag", "ankle_boot")

# File stems per split; each may be present as-is or with a ".gz" suffix.
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

IMAGE_SIZE = 28
_IMAGE_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions.
_LABEL_MAGIC = 0x00000801  # unsigned bytes, 1 dimension.


def resolve_idx_file(source_dir: str, stem: str) -> str:
  """Returns the path of `stem` or `stem.gz` inside `source_dir`.

  Args:
    source_dir: Directory holding the IDX files.
    stem: File name without the optional ".gz" suffix.

  Returns:
    The path of the existing file, preferring the uncompressed one.

  Raises:
    FileNotFoundError: If the directory or both files are missing.
  """
  if not os.path.isdir(source_dir):
    raise FileNotFoundError(
        f"Fashion-MNIST source directory {source_dir} does not exist; expected "
        f"a directory holding the four IDX files. Received: source_dir="
        f"{source_dir}")
  for name in (stem, stem + ".gz"):
    path = os.path.join(source_dir, name)
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(
      f"Fashion-MNIST IDX file {stem}(.gz) not found in {source_dir}; "
      f"expected one of {stem} or {stem}.gz there. "
      f"Received: source_dir={source_dir}")


def _read_bytes(path: str) -> bytes:
  """Reads a file, decompressing it when its name ends in ".gz"."""
  if not path.endswith(".gz"):
    with open(path, "rb") as f:
      return f.read()
  try:
    with gzip.open(path, "rb") as f:
      return f.read()
  except (EOFError, gzip.BadGzipFile, zlib.error) as e:
    # gzip reports truncation as EOFError, a bad header as BadGzipFile and
    # corrupt compressed data as zlib.error.
    raise ValueError(f"{path} is not a complete gzip file ({e}). "
                     f"Received: path={path}") from None


def read_idx(path: str, magic: int, dims: Tuple[Optional[int], ...],
             count: Optional[int] = None) -> np.ndarray:
  """Reads an unsigned-byte IDX file and validates its header.

  Args:
    path: File to read (gzipped when the name ends in ".gz").
    magic: Expected magic number (0x803 for images, 0x801 for labels).
    dims: Expected dimensions after the first (item count) one; None entries
      accept any size.
    count: Expected number of items, or None to accept any.

  Returns:
    A uint8 array of shape (num_items, *dims).

  Raises:
    ValueError: If the magic number, dimensions, count or data length do not
      match.
  """
  data = _read_bytes(path)
  ndim = magic & 0xFF
  header_len = 4 + 4 * ndim
  if len(data) < header_len:
    raise ValueError(f"{path} is truncated: {len(data)} bytes, shorter than "
                     f"the {header_len}-byte IDX header. Received: path={path}")
  found_magic = int.from_bytes(data[:4], "big")
  if found_magic != magic:
    raise ValueError(f"{path} has IDX magic number {found_magic:#010x}, "
                     f"expected {magic:#010x}. Received: path={path}")
  shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
                for i in range(ndim))
  expected = (count,) + tuple(dims)
  if any(e is not None and e != s for e, s in zip(expected, shape)):
    wanted = "x".join("N" if e is None else str(e) for e in expected)
    raise ValueError(f"{path} holds items of shape "
                     f"{'x'.join(map(str, shape))}, expected {wanted}. "
                     f"Received: path={path}")
  num_bytes = int(np.prod(shape))
  payload = len(data) - header_len
  if payload != num_bytes:
    kind = "truncated" if payload < num_bytes else "longer than its header says"
    raise ValueError(f"{path} is {kind}: the header declares "
                     f"{'x'.join(map(str, shape))} = {num_bytes} bytes of data, "
                     f"the file holds {payload}. Received: path={path}")
  return np.frombuffer(data, np.uint8, offset=header_len).reshape(shape)


def read_split(source_dir: str, split: str,
               count: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
  """Reads and cross-checks the images and labels of one split.

  Args:
    source_dir: Directory holding the IDX files.
    split: "train" or "test".
    count: Expected number of examples, or None to accept any.

  Returns:
    (images uint8 [N, 28, 28], labels uint8 [N]).

  Raises:
    FileNotFoundError: If a file is missing.
    ValueError: If a file is malformed or images and labels disagree.
  """
  image_stem, label_stem = SPLIT_FILES[split]
  image_path = resolve_idx_file(source_dir, image_stem)
  label_path = resolve_idx_file(source_dir, label_stem)
  images = read_idx(image_path, _IMAGE_MAGIC, (IMAGE_SIZE, IMAGE_SIZE), count)
  if not len(images):  # TFDS would fail later: "No examples were yielded"
    raise ValueError(f"{image_path} holds 0 images; the {split} split needs "
                     f"at least one. Received: path={image_path}")
  labels = read_idx(label_path, _LABEL_MAGIC, (), count)
  if len(labels) != len(images):
    raise ValueError(f"{label_path} holds {len(labels)} labels, expected "
                     f"{len(images)} to match {image_path}. "
                     f"Received: path={label_path}")
  if labels.size and labels.max() >= len(CLASS_NAMES):
    raise ValueError(f"{label_path} holds label {labels.max()}, expected "
                     f"labels in [0, {len(CLASS_NAMES)}). "
                     f"Received: path={label_path}")
  return images, labels


def split_counts(source_dir: str) -> Tuple[int, int]:
  """(train, test) example counts, from the label files' IDX headers.

  Read before anything is prepared, so that a run's epochs count the data
  actually given (a custom source_dir need not hold 60,000 images).

  Raises:
    FileNotFoundError: a file is missing.
    ValueError: a label file is truncated or not a label file, or an
      image file holds no image.
  """
  counts = []
  for split in ("train", "test"):
    image_stem, label_stem = SPLIT_FILES[split]
    # The label file is small: read whole, its header and length checked.
    labels = read_idx(resolve_idx_file(source_dir, label_stem),
                      _LABEL_MAGIC, ())
    image_path = resolve_idx_file(source_dir, image_stem)
    opener = gzip.open if image_path.endswith(".gz") else open
    try:
      with opener(image_path, "rb") as f:
        header = f.read(8)
    except (EOFError, OSError, zlib.error) as e:
      raise ValueError(f"{image_path} is not a readable IDX file ({e}). "
                       f"Received: path={image_path}") from None
    if len(header) == 8 and not int.from_bytes(header[4:8], "big"):
      raise ValueError(f"{image_path} holds 0 images; the {split} split "
                       f"needs at least one. Received: path={image_path}")
    counts.append(len(labels))
  return counts[0], counts[1]


def source_signature(source_dir: str) -> str:
  """A digest of the bytes of the IDX files in `source_dir`.

  Part of a custom config's name: a prepared copy is used only for the
  very files it was prepared from; replaced files get a copy of their own
  (and are validated while it is made) instead of training on stale data.
  Files that are missing are left to the reader to report.
  """
  digest = hashlib.sha256()
  for stems in SPLIT_FILES.values():
    for stem in stems:
      try:
        path = resolve_idx_file(source_dir, stem)
      except FileNotFoundError:
        continue
      digest.update(path.encode())
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          digest.update(block)
  return digest.hexdigest()


@dataclasses.dataclass
class FashionMnistLocalConfig(tfds.core.BuilderConfig):
  """Where the IDX files are and how many examples each split must hold.

  Attributes:
    source_dir: Directory holding the four IDX files.
    num_examples: Expected (train, test) example counts, or None to accept
      any count (small hand-made files in tests).
  """
  source_dir: str = DEFAULT_SOURCE_DIR
  num_examples: Optional[Tuple[int, int]] = None


def make_config(source_dir: str, num_examples: Optional[Tuple[int, int]] = None
               ) -> FashionMnistLocalConfig:
  """Returns a config whose name is unique to `source_dir` and its files.

  TFDS keeps one prepared copy per config name under data_dir, so distinct
  source directories must not share a name, nor the same directory once
  its files were replaced (`source_signature`).

  Args:
    source_dir: Directory holding the four IDX files.
    num_examples: Expected (train, test) counts, or None to accept any.

  Returns:
    The config.
  """
  source_dir = os.path.abspath(source_dir)
  digest = hashlib.sha1(repr((source_dir, num_examples, source_signature(
      source_dir))).encode()).hexdigest()
  return FashionMnistLocalConfig(
      name="dir_" + digest[:12], source_dir=source_dir,
      num_examples=num_examples, description=f"IDX files in {source_dir}")


class _ExpectedConfigFilter(logging.Filter):
  """Drops TFDS's "Using custom data configuration" warning for this
  builder: a config per source_dir is how it is meant to be used."""

  def filter(self, record):
    return not record.getMessage().startswith(
        "Using custom data configuration: FashionMnistLocalConfig")


absl_logging.get_absl_logger().addFilter(_ExpectedConfigFilter())


class FashionMnistLocal(tfds.core.GeneratorBasedBuilder):
  """Fashion-MNIST from local IDX files (registered as `fashion_mnist_local`).

  The prepared copy under data_dir is keyed by the source directory's path
  and its files' bytes: files replaced in place are prepared (and checked)
  anew, never served from the copy of the old ones.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Reads the four IDX files from a local directory."}
  BUILDER_CONFIGS = [
      FashionMnistLocalConfig(
          name="default", source_dir=DEFAULT_SOURCE_DIR,
          num_examples=(60000, 10000),
          description=f"Debian's dataset-fashion-mnist in {DEFAULT_SOURCE_DIR}")
  ]

  def __init__(self, *, source_dir: Optional[str] = None,
               num_examples: Optional[Tuple[int, int]] = None, **kwargs):
    """Creates the builder.

    Args:
      source_dir: Directory holding the IDX files; None uses
        DEFAULT_SOURCE_DIR with the official split sizes.
      num_examples: Expected (train, test) counts for a custom source_dir,
        or None to accept any.
      **kwargs: Passed to tfds.core.GeneratorBasedBuilder (data_dir, config,
        version, ...).
    """
    if source_dir is not None:
      kwargs["config"] = make_config(source_dir, num_examples)
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description="Zalando's Fashion-MNIST: 28x28 grayscale images of 10 "
                    "clothing categories, read from local IDX files.",
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(
                shape=(IMAGE_SIZE, IMAGE_SIZE, 1), dtype=np.uint8),
            "label": tfds.features.ClassLabel(names=CLASS_NAMES),
        }),
        supervised_keys=("image", "label"),
        homepage="https://github.com/zalandoresearch/fashion-mnist",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    config = self.builder_config
    counts = config.num_examples or (None, None)
    # Read and validate both splits before TFDS writes anything, so that a bad
    # test file does not leave a half-prepared train split behind.
    arrays = {split: read_split(config.source_dir, split, count)
              for split, count in zip(SPLIT_FILES, counts)}
    return {split: self._generate_examples(images, labels)
            for split, (images, labels) in arrays.items()}

  def _generate_examples(self, images: np.ndarray, labels: np.ndarray):
    for index, (image, label) in enumerate(zip(images, labels)):
      yield index, {"image": image[..., None], "label": int(label)}
