"""Epochs and sizes come from the data given (issue 35, §2).

Through train.train's main on small Fashion-MNIST IDX files in a
--source_dir: --epochs counts their examples (not the static 60,000), a
training split smaller than one batch is refused, and files replaced
after a first run are prepared and checked anew, never served from the
stale prepared copy.
"""

import glob
import json
import os

import numpy as np
import pytest

from tests.binaries import run_main
from tests.idx_files import write_split

# The binaries under attack: make test-slow (pytest.ini).
pytestmark = pytest.mark.slow

FLAGS = ["--preset=fashion_mnist_resnet", "--eval_batches=1", "--warmup_steps=0",
         "--batch_size=32", "--steps_per_loop=1", "--eval_every_steps=1000",
         "--checkpoint_every_steps=1000"]


def _source(tmp_path, train=64, test=32, train_labels=None):
  rng = np.random.default_rng(0)
  source_dir = str(tmp_path / "idx")
  os.makedirs(source_dir, exist_ok=True)
  for split, n in (("train", train), ("test", test)):
    labels = np.arange(n, dtype=np.uint8) % 10
    if split == "train" and train_labels is not None:
      labels = labels[:train_labels]
    write_split(source_dir, split,
                rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), labels,
                gz=False)
  return source_dir


def _train(tmp_path, capfd, source_dir, name, *flags):
  return run_main("train.train", [
      *FLAGS, f"--source_dir={source_dir}", f"--data_dir={tmp_path / 'tfds'}",
      f"--model_dir={tmp_path / name}", *flags], capfd)


def _error(err):
  lines = [line for line in err.splitlines() if line.startswith("error:")]
  assert len(lines) == 1 and "Traceback" not in err, err
  return lines[0]


def test_epochs_count_the_examples_given(tmp_path, capfd):
  code, out, err = _train(tmp_path, capfd, _source(tmp_path), "run",
                          "--epochs=1")
  assert code == 0, err
  assert json.loads(out.strip().splitlines()[-1])["step"] == 2  # 64 / 32


def test_a_training_split_smaller_than_one_batch_is_refused(tmp_path, capfd):
  code, _, err = _train(tmp_path, capfd, _source(tmp_path, train=20), "run",
                        "--train_steps=4")
  assert code == 1, err
  line = _error(err)
  assert "training split" in line and "holds 20 examples" in line, line
  assert "fewer than one batch of 32" in line, line
  assert not os.path.exists(tmp_path / "run")


def test_replaced_source_files_are_checked_not_served_stale(tmp_path, capfd):
  source_dir = _source(tmp_path)
  code, _, err = _train(tmp_path, capfd, source_dir, "first",
                        "--train_steps=2")
  assert code == 0, err
  _source(tmp_path, train_labels=40)  # 64 images, 40 labels: inconsistent
  code, _, err = _train(tmp_path, capfd, source_dir, "second",
                        "--train_steps=2")
  assert code == 1, err
  line = _error(err)
  assert "train-labels-idx1-ubyte holds 40 labels, expected 64" in line, line


def test_a_flipped_byte_in_a_prepared_record_names_the_file(tmp_path, capfd):
  # The sizes still match what TFDS wrote: only reading the record (its
  # CRC) finds the damage, once training reads that far. The line names
  # the file, not only TF's "corrupted record at N".
  source_dir = _source(tmp_path, train=256)
  code, _, err = _train(tmp_path, capfd, source_dir, "first",
                        "--train_steps=1")
  assert code == 0, err
  (record,) = glob.glob(str(tmp_path / "tfds" / "**" / "*-train.tfrecord*"),
                        recursive=True)
  with open(record, "r+b") as f:
    f.seek(os.path.getsize(record) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))
  code, _, err = _train(tmp_path, capfd, source_dir, "second",
                        "--train_steps=16")
  assert code == 1, err
  line = _error(err)
  assert f"{record} is missing, truncated or corrupt" in line, line
  assert "DataLossError: corrupted record at" in line, line
