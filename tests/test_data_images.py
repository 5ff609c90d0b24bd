"""Tests for the TFDS image pipelines, on tfds.testing.mock_data."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from train.data import images

NUM_EXAMPLES = 16
BATCH = 8


def _take(ds, n):
  return [(x.numpy(), y.numpy()) for x, y in ds.take(n)]


def _raw(info):
  """The mocked examples in file order, as uint8 images and labels."""
  ds = tfds.load(info.tfds_name, split="train", as_supervised=True)
  return [(x.numpy(), int(y)) for x, y in ds]


def _denormalize(images_array, info):
  return images_array * np.array(info.std) * 255 + np.array(info.mean) * 255


def test_dataset_info():
  info = images.dataset_info("cifar100")
  assert (info.num_classes, info.image_shape) == (100, (32, 32, 3))
  assert info.splits == {"train": 50000, "test": 10000}
  assert images.dataset_info("imagenet2012").image_shape == (224, 224, 3)
  assert images.dataset_info("imagenet2012").splits["validation"] == 50000
  assert images.dataset_info("fashion_mnist").image_shape == (28, 28, 1)
  with pytest.raises(ValueError, match=r"expected one of \['cifar10', "
                     r"'cifar100', 'fashion_mnist', 'imagenet2012'\]\. "
                     r"Received: name='mnist'"):
    images.dataset_info("mnist")


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "imagenet2012",
                                  "fashion_mnist"])
@pytest.mark.parametrize("training", [True, False])
def test_shapes_and_dtypes(name, training):
  info = images.dataset_info(name)
  with tfds.testing.mock_data(num_examples=NUM_EXAMPLES):
    ds = images.image_dataset(name, "train", BATCH, training=training, seed=0)
    batches = _take(ds, 3)
  image_spec, label_spec = ds.element_spec
  assert image_spec.shape == (BATCH,) + info.image_shape
  assert (image_spec.dtype, label_spec.dtype) == (tf.float32, tf.int32)
  assert len(batches) == (3 if training else NUM_EXAMPLES // BATCH)
  for x, y in batches:
    assert np.isfinite(x).all()
    assert ((y >= 0) & (y < info.num_classes)).all()
    pixels = _denormalize(x, info)
    assert pixels.min() > -1e-3 and pixels.max() < 255 + 1e-3


def test_evaluation_normalizes_per_channel():
  info = images.dataset_info("cifar10")
  with tfds.testing.mock_data(num_examples=NUM_EXAMPLES):
    raw = _raw(info)
    ds = images.image_dataset("cifar10", "train", BATCH, training=False)
    batches = _take(ds, -1)
  got = np.concatenate([x for x, _ in batches])
  labels = np.concatenate([y for _, y in batches])
  expected = (np.stack([x for x, _ in raw]) / 255.0 - info.mean) / info.std
  np.testing.assert_allclose(got, expected, atol=1e-5)
  np.testing.assert_array_equal(labels, [y for _, y in raw])


def _crops(image, padding):
  """All (padding*2+1)^2 crops of the zero-padded image, and their mirrors."""
  h, w, _ = image.shape
  padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
  crops = {}
  for dy in range(2 * padding + 1):
    for dx in range(2 * padding + 1):
      crop = padded[dy:dy + h, dx:dx + w]
      crops[crop.tobytes()] = ((dy, dx), False)
      crops.setdefault(crop[:, ::-1].tobytes(), ((dy, dx), True))
  return crops


@pytest.mark.parametrize("name, flip", [("cifar10", True),
                                        ("fashion_mnist", False)])
def test_training_augmentation_is_pad_crop_and_flip(name, flip):
  info = images.dataset_info(name)
  with tfds.testing.mock_data(num_examples=NUM_EXAMPLES):
    raw = _raw(info)
    # A one-element shuffle buffer keeps file order, so example i of the
    # stream is raw[i % NUM_EXAMPLES].
    ds = images.image_dataset(name, "train", BATCH, training=True, seed=5,
                              shuffle_buffer=1, deterministic=True)
    batches = _take(ds, 4)
  offsets, flips = set(), set()
  stream = np.concatenate([x for x, _ in batches])
  for i, augmented in enumerate(stream):
    original, label = raw[i % NUM_EXAMPLES]
    assert batches[i // BATCH][1][i % BATCH] == label
    pixels = np.round(_denormalize(augmented, info)).astype(np.uint8)
    offset, flipped = _crops(original, 4)[pixels.tobytes()]
    offsets.add(offset)
    flips.add(flipped)
  assert len(offsets) > 5  # Crops really move around.
  assert flips == ({False, True} if flip else {False})


def test_same_seed_same_batches():
  with tfds.testing.mock_data(num_examples=NUM_EXAMPLES):
    def run(seed):
      return _take(images.image_dataset("cifar10", "train", BATCH,
                                        training=True, seed=seed,
                                        deterministic=True), 3)
    first, again, other = run(1), run(1), run(2)
  for (x1, y1), (x2, y2) in zip(first, again):
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
  assert any(not np.array_equal(a[0], b[0]) for a, b in zip(first, other))


def test_imagenet_evaluation_takes_central_crop():
  # The shorter side is already 256, so resizing is the identity and the
  # output must be exactly the central 224x224 window.
  image = np.random.default_rng(0).integers(0, 256, (256, 320, 3), np.uint8)

  def as_dataset(self, split, **kwargs):
    del self, split, kwargs
    # image_dataset decodes itself, so the mock serves encoded images.
    return tf.data.Dataset.from_tensors(
        {"image": tf.io.encode_png(image), "label": np.int64(7),
         "file_name": "a.png"})

  info = images.dataset_info("imagenet2012")
  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    (x, y), = _take(images.image_dataset(
        "imagenet2012", "validation", 1, training=False), 1)
  np.testing.assert_allclose(_denormalize(x[0], info),
                             image[16:240, 48:272], atol=1e-3)
  assert y[0] == 7


def test_errors():
  with tfds.testing.mock_data(num_examples=0):
    with pytest.raises(ValueError, match=r"Split 'train' of cifar10 is empty"):
      images.image_dataset("cifar10", "train", BATCH, training=True)
  with pytest.raises(ValueError, match="only read by the fashion_mnist_local"):
    images.image_dataset("cifar10", "train", BATCH, training=True,
                         source_dir="/tmp")
  with pytest.raises(ValueError, match="Received: name='svhn'"):
    images.image_dataset("svhn", "train", BATCH, training=True)
