"""Image classification input pipelines built on TFDS and tf.data.

`image_dataset` returns batches of (float32 image normalised per channel,
int32 label) with static shapes, ready for the ResNet experiments:

  ds = image_dataset("cifar10", "train", 128, training=True, seed=0)
  images, labels = next(iter(ds))  # [128, 32, 32, 3] float32, [128] int32

Training pipelines shuffle, repeat and augment (pad-and-crop plus horizontal
flip at 32x32 and 28x28, random-resized-crop plus flip for ImageNet at 224).
Augmentation uses stateless random ops seeded per example, so a fixed seed
with deterministic=True gives the same batches on every run.
"""

import dataclasses
import os
import random
from typing import Mapping, Optional, Tuple

import tensorflow as tf
import tensorflow_datasets as tfds

from train.data import fashion_mnist_local

# ImageNet evaluation resizes the shorter side to 224 / 0.875 = 256, then
# takes the central 224x224 crop (the usual ResNet protocol).
_IMAGENET_SIZE = 224
_IMAGENET_RESIZE = 256


@dataclasses.dataclass(frozen=True)
class ImageDatasetInfo:
  """Static facts about one supported image dataset.

  Attributes:
    name: Name accepted by `image_dataset`.
    tfds_name: TFDS builder that `image_dataset` loads by default.
    num_classes: Number of label classes.
    image_shape: (height, width, channels) of the images `image_dataset`
      returns.
    splits: Number of examples per split of the full dataset.
    mean: Per-channel mean of the training images, on a [0, 1] scale.
    std: Per-channel standard deviation, on a [0, 1] scale.
    crop_padding: Zero padding before the random crop when training; 0 means
      ImageNet-style random-resized-crop instead.
    flip: Whether training flips images horizontally by default.
  """
  name: str
  tfds_name: str
  num_classes: int
  image_shape: Tuple[int, int, int]
  splits: Mapping[str, int]
  mean: Tuple[float, ...]
  std: Tuple[float, ...]
  crop_padding: int
  flip: bool

  @property
  def eval_split(self) -> str:
    """The held-out split evaluation reads ("test", or ImageNet's
    "validation")."""
    return "validation" if "validation" in self.splits else "test"


_DATASETS = {
    info.name: info for info in (
        ImageDatasetInfo(
            name="cifar10", tfds_name="cifar10", num_classes=10,
            image_shape=(32, 32, 3), splits={"train": 50000, "test": 10000},
            mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
            crop_padding=4, flip=True),
        ImageDatasetInfo(
            name="cifar100", tfds_name="cifar100", num_classes=100,
            image_shape=(32, 32, 3), splits={"train": 50000, "test": 10000},
            mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762),
            crop_padding=4, flip=True),
        ImageDatasetInfo(
            name="imagenet2012", tfds_name="imagenet2012", num_classes=1000,
            image_shape=(_IMAGENET_SIZE, _IMAGENET_SIZE, 3),
            splits={"train": 1281167, "validation": 50000},
            mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
            crop_padding=0, flip=True),
        # Mirrored clothes are still clothes, but the Fashion-MNIST literature
        # mostly trains without flips; flip=True remains available.
        ImageDatasetInfo(
            name="fashion_mnist", tfds_name="fashion_mnist_local",
            num_classes=10, image_shape=(28, 28, 1),
            splits={"train": 60000, "test": 10000},
            mean=(0.2860,), std=(0.3530,), crop_padding=4, flip=False),
    )
}


def dataset_info(name: str) -> ImageDatasetInfo:
  """Returns the static facts about a supported image dataset.

  Args:
    name: One of "cifar10", "cifar100", "imagenet2012", "fashion_mnist".

  Returns:
    The dataset's ImageDatasetInfo.

  Raises:
    ValueError: If `name` is not supported.
  """
  if name not in _DATASETS:
    raise ValueError(f"Unknown image dataset; expected one of "
                     f"{sorted(_DATASETS)}. Received: name={name!r}")
  return _DATASETS[name]


def _decode(encoded: tf.Tensor, info: ImageDatasetInfo) -> tf.Tensor:
  """Decodes a PNG or JPEG; fixed-size datasets get their static shape."""
  image = tf.io.decode_image(encoded, channels=info.image_shape[-1],
                             expand_animations=False)
  if info.crop_padding:  # Only ImageNet-style data comes in varied sizes.
    image = tf.ensure_shape(image, info.image_shape)
  return image


def _normalize(image: tf.Tensor, info: ImageDatasetInfo) -> tf.Tensor:
  """Maps pixel values in [0, 255] to (x / 255 - mean) / std per channel."""
  image = tf.cast(image, tf.float32) / 255.0
  return (image - tf.constant(info.mean)) / tf.constant(info.std)


def _pad_and_crop(image: tf.Tensor, padding: int, seed: tf.Tensor) -> tf.Tensor:
  """Zero-pads each side by `padding`, then crops back to the input size."""
  height, width, channels = image.shape
  padded = tf.image.resize_with_crop_or_pad(
      image, height + 2 * padding, width + 2 * padding)
  return tf.image.stateless_random_crop(
      padded, (height, width, channels), seed=seed)


def _random_resized_crop(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """Crops 8%-100% of the area at aspect 3/4-4/3, resized to 224x224."""
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
      seed=seed, min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3),
      area_range=(0.08, 1.0), max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  crop = tf.slice(image, begin, size)
  return tf.image.resize(crop, (_IMAGENET_SIZE, _IMAGENET_SIZE))


def _center_crop(image: tf.Tensor) -> tf.Tensor:
  """Resizes the shorter side to 256, then takes the central 224x224 crop."""
  shape = tf.cast(tf.shape(image)[:2], tf.float32)
  scale = _IMAGENET_RESIZE / tf.reduce_min(shape)
  resized = tf.image.resize(image, tf.cast(tf.round(shape * scale), tf.int32))
  return tf.image.resize_with_crop_or_pad(resized, _IMAGENET_SIZE,
                                          _IMAGENET_SIZE)


def _augment(image: tf.Tensor, seed: tf.Tensor, info: ImageDatasetInfo,
             flip: bool) -> tf.Tensor:
  """Applies the training augmentation of `info` with a [2] stateless seed."""
  crop_seed, flip_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, num=2))
  if info.crop_padding:
    image = _pad_and_crop(image, info.crop_padding, crop_seed)
  else:
    image = _random_resized_crop(image, crop_seed)
  if flip:
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
  return image


def _num_examples(ds: tf.data.Dataset) -> Optional[int]:
  """Returns the size of a finite dataset: known cardinality, else 0 or None.

  TFDS datasets usually know their cardinality. When they do not (mocked or
  filtered data), one element is read to tell an empty split from a
  non-empty one of unknown size.
  """
  cardinality = int(ds.cardinality())
  if cardinality >= 0:
    return cardinality
  return 0 if next(iter(ds.take(1)), None) is None else None


# TFRecord framing around each serialized example: a uint64 length, a uint32
# CRC of the length, the example, a uint32 CRC of the example.
_TFRECORD_OVERHEAD = 16


def _builder_kwargs(tfds_name: str, source_dir: Optional[str]) -> dict:
  if source_dir is None:
    return {}
  if tfds_name != "fashion_mnist_local":
    raise ValueError(f"source_dir is only read by the fashion_mnist_local "
                     f"builder, not {tfds_name!r}. "
                     f"Received: source_dir={source_dir!r}")
  return {"source_dir": source_dir}


def check_prepared_dataset(name: str, *, data_dir: Optional[str] = None,
                           source_dir: Optional[str] = None,
                           tfds_name: Optional[str] = None,
                           read_all: bool = False) -> None:
  """`check_prepared_files` on the training and evaluation splits of an
  image dataset, before any pipeline is built; a dataset not prepared yet
  has nothing to check.

  Args:
    name, data_dir, source_dir, tfds_name: as for `image_dataset`.
    read_all: as for `check_prepared_files`.

  Raises:
    ValueError: naming a damaged file.
  """
  info = dataset_info(name)
  tfds_name = tfds_name or info.tfds_name
  root = (data_dir or os.environ.get("TFDS_DATA_DIR") or
          tfds.core.constants.DATA_DIR)
  if not tf.io.gfile.exists(os.path.join(root, tfds_name)):
    return  # Never prepared here (and no builder to warn about it).
  builder = tfds.builder(tfds_name, data_dir=data_dir,
                         **_builder_kwargs(tfds_name, source_dir))
  if builder.is_prepared():
    check_prepared_files(builder, f"train+{info.eval_split}",
                         read_all=read_all)


def check_prepared_files(builder: tfds.core.DatasetBuilder,
                         split: str, read_all: bool = False) -> None:
  """Refuses a prepared split whose TFRecord files are not as TFDS wrote them.

  TFDS records each split's example count and serialized bytes, so its
  files must hold num_bytes + 16 x num_examples bytes in all. A truncated
  file would otherwise fail with a DataLossError only once training reads
  that far. Only a mismatch reads the files, to name the damaged one,
  unless `read_all`: a flipped byte keeps the sizes, and only reading
  every record (its CRC) finds it.

  Args:
    builder: the prepared builder.
    split: the split read, e.g. "train" or "test[:10%]".
    read_all: read every file even when the sizes match (after a
      DataLossError, to name the file).

  Raises:
    ValueError: naming the damaged file (or the split's folder).
  """
  if builder.info.file_format != tfds.core.FileFormat.TFRECORD:
    return
  for name in {part.split("[")[0] for part in split.split("+")}:
    info = builder.info.splits[name] if name in builder.info.splits else None
    if info is None or not int(info.num_bytes):
      continue  # TFDS did not record the sizes: nothing to compare.
    paths = [str(p) for p in info.filepaths]
    sizes = [tf.io.gfile.stat(p).length if tf.io.gfile.exists(p) else -1
             for p in paths]
    expected = int(info.num_bytes) + _TFRECORD_OVERHEAD * info.num_examples
    sizes_match = sum(sizes) == expected and -1 not in sizes
    if sizes_match and not read_all:
      continue
    bad = next((p for p, size in zip(paths, sizes) if size < 0), None)
    for path in paths if bad is None else ():
      try:
        for _ in tf.data.TFRecordDataset(path):
          pass
      except tf.errors.OpError:
        bad = path
        break
    if sizes_match and bad is None:
      continue
    what = (f"{bad} is missing, truncated or corrupt" if bad else
            f"the {name} files under {builder.data_dir} hold {sum(sizes)} "
            f"bytes, not the {expected} TFDS wrote")
    raise ValueError(f"Prepared data is damaged: {what}; delete "
                     f"{builder.data_dir} to prepare it again. "
                     f"Received: split={name!r}")


def image_dataset(name: str, split: str, batch_size: int, *, training: bool,
                  data_dir: Optional[str] = None,
                  source_dir: Optional[str] = None,
                  seed: Optional[int] = None, deterministic: bool = False,
                  drop_remainder: bool = True, flip: Optional[bool] = None,
                  augment: bool = True,
                  shuffle_buffer: int = 10000,
                  tfds_name: Optional[str] = None,
                  download: bool = True) -> tf.data.Dataset:
  """Returns batches of (normalised float32 image, int32 label).

  Args:
    name: One of "cifar10", "cifar100", "imagenet2012", "fashion_mnist".
    split: TFDS split string, e.g. "train", "test", "train[:10%]".
    batch_size: Examples per batch.
    training: If True, shuffle, repeat forever and augment.
    data_dir: TFDS data directory (prepared datasets); None uses TFDS's.
    source_dir: For fashion_mnist only: directory of the IDX files read by
      the local builder; None uses fashion_mnist_local.DEFAULT_SOURCE_DIR.
    seed: Seed for file order, shuffling and augmentation; None draws one.
    deterministic: If True, tf.data keeps element order fixed, so that a
      fixed seed reproduces the same batches; False lets parallel stages
      reorder elements for speed.
    drop_remainder: Drop the last partial batch, so the batch dimension is
      static.
    augment: Random crops (and flips) when training; False feeds the
      images as they are (short runs learn faster without).
    flip: Random horizontal flips when training; None uses the dataset's
      default (on except for fashion_mnist).
    shuffle_buffer: Examples held in the shuffle buffer when training.
    tfds_name: TFDS builder to load instead of the default one, e.g.
      "fashion_mnist" for TFDS's own downloader.
    download: Let TFDS download and prepare the data if missing.

  Returns:
    A tf.data.Dataset of (images [B, H, W, C] float32, labels [B] int32).

  Raises:
    ValueError: If `name` is unknown, `source_dir` is given for a builder
      that does not read local files, the split is empty, or an evaluation
      split is smaller than one batch with drop_remainder=True.
  """
  info = dataset_info(name)
  tfds_name = tfds_name or info.tfds_name
  builder_kwargs = _builder_kwargs(tfds_name, source_dir)
  if seed is None:
    seed = random.SystemRandom().randrange(2**31)
  flip = info.flip if flip is None else flip
  options = tf.data.Options()
  options.deterministic = deterministic

  empty_error = ValueError(f"Split {split!r} of {tfds_name} is empty; "
                           f"expected at least one example. "
                           f"Received: split={split!r}")
  try:
    # Images stay encoded until after the shuffle buffer: 10000 decoded
    # ImageNet images would take gigabytes.
    ds = tfds.load(
        tfds_name, split=split, data_dir=data_dir, as_supervised=True,
        shuffle_files=training, download=download,
        builder_kwargs=builder_kwargs,
        decoders={"image": tfds.decode.SkipDecoding()},
        # No autocache: a run that stops mid-epoch, or an evaluation of
        # eval_batches, would leave the cache partly read (TF warns).
        read_config=tfds.ReadConfig(shuffle_seed=seed, options=options,
                                    try_autocache=False))
  except ValueError as e:
    # TFDS rejects an empty slice such as "test[:0]" with a cryptic message.
    if "corresponds to no data" in str(e):
      raise empty_error from e
    raise
  except RuntimeError as e:
    # TFDS wraps a failed write while preparing (a full disk) in a
    # RuntimeError whose cause is the OS's or TF's error.
    if not isinstance(e.__cause__, (OSError, tf.errors.OpError)):
      raise
    folder = data_dir or tfds.core.constants.DATA_DIR
    reason = (str(e.__cause__).splitlines() or [""])[0]
    raise OSError(
        f"Could not prepare {tfds_name} in {folder}: {reason}; TFDS writes "
        f"into a temporary folder and removed it, so nothing half-prepared "
        f"is left: free space (or pick another --data_dir) and rerun. "
        f"Received: data_dir={data_dir!r}") from None
  check_prepared_files(
      tfds.builder(tfds_name, data_dir=data_dir, **builder_kwargs), split)
  num_examples = _num_examples(ds)
  if num_examples == 0:
    raise empty_error
  if ((training or drop_remainder) and num_examples is not None and
      num_examples < batch_size):
    # Training repeats the split: one batch would hold some images twice.
    why = ("every batch would repeat images" if training else
           "drop_remainder=True would yield nothing")
    raise ValueError(f"Split {split!r} of {tfds_name} has {num_examples} "
                     f"examples, fewer than one batch, so {why}: give more "
                     f"examples or a batch_size of at most {num_examples}. "
                     f"Received: batch_size={batch_size}")

  height, width, channels = info.image_shape
  if training:
    ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat()
    # Bind each example to its position in the stream, so that its
    # augmentation seed does not depend on which parallel map call runs it.
    ds = ds.enumerate()

    def preprocess(index, example):
      encoded, label = example
      example_seed = tf.stack([tf.constant(seed, tf.int64), index])
      image = _decode(encoded, info)
      if augment:
        image = _augment(image, example_seed, info, flip)
      elif not info.crop_padding:
        image = _center_crop(image)
      return image, label
  else:

    def preprocess(encoded, label):
      image = _decode(encoded, info)
      if not info.crop_padding:
        image = _center_crop(image)
      return image, label

  def finish(image, label):
    image = tf.ensure_shape(_normalize(image, info), (height, width, channels))
    return image, tf.cast(label, tf.int32)

  ds = ds.map(lambda *args: finish(*preprocess(*args)),
              num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(batch_size, drop_remainder=drop_remainder)
  return ds.prefetch(tf.data.AUTOTUNE).with_options(options)
