"""Small IDX files (the Fashion-MNIST format) written by tests."""

import gzip
import os

import numpy as np

from train.data import fashion_mnist_local as fm


def write_idx(path, array, magic=None, keep_bytes=None):
  """Writes `array` as an unsigned-byte IDX file, gzipped if path ends .gz."""
  magic = 0x800 + array.ndim if magic is None else magic
  header = magic.to_bytes(4, "big") + b"".join(
      d.to_bytes(4, "big") for d in array.shape)
  data = (header + array.astype(np.uint8).tobytes())[:keep_bytes]
  with (gzip.open if path.endswith(".gz") else open)(path, "wb") as f:
    f.write(data)


def write_split(source_dir, split, images_array, labels, gz):
  """Writes one split's image and label files into `source_dir`."""
  suffix = ".gz" if gz else ""
  image_stem, label_stem = fm.SPLIT_FILES[split]
  write_idx(os.path.join(source_dir, image_stem + suffix), images_array)
  write_idx(os.path.join(source_dir, label_stem + suffix), labels)
