"""The hostile sweep's containment and bad-input cases (issue 35).

Each case leaves a trap that once made a binary delete or replace files
outside what it owns, or train on bad data without a word: a symbolic link
inside a run (at the top, one level down, as a checkpoint leftover), a
checkpoint pointer naming files elsewhere, a user's file one level down in
a compare run, an export target that is a link or too long for its
temporary sibling, Fashion-MNIST files smaller than one batch, and a
model_fn that is no model function. `keep` is the user's folder, hashed
before and after (LOSS if it changed). Kept apart from hostile_cases.py so
that other branches' new classes merge without conflicts.
"""

import os
import shutil

import numpy as np

from tools.hostile_cases import TT, Case, _mine, _symlink, _then, _trained

RESUME = TT[:1] + ["--train_steps=40", "--model_dir=WORK/run"]
COMPARE = ["--preset=synthetic_mlp", "--strategies=e2e", "--seeds=1",
           "--seed=0", "--train_steps=20", "--eval_points=2", "--noplots",
           "--cost_repeats=1", "--out_dir=WORK/out"]


def _pointer(entry):
  """A setup step: run/checkpoints/checkpoint also lists `entry` (WORK is
  the case's folder), which holds a copy of ckpt-10's files."""
  def step(work):
    outside = os.path.join(work, "outside", "x")
    os.makedirs(outside)
    for suffix in (".index", ".data-00000-of-00001"):
      shutil.copy(os.path.join(work, "run/checkpoints/ckpt-10" + suffix),
                  os.path.join(outside, "ckpt-1" + suffix))
    with open(os.path.join(work, "run/checkpoints/checkpoint"), "w",
              encoding="utf-8") as f:
      f.write(f'model_checkpoint_path: "ckpt-20"\n'
              f'all_model_checkpoint_paths: '
              f'"{entry.replace("WORK", work)}"\n'
              f'all_model_checkpoint_paths: "ckpt-20"\n')
  return step


def _unfinished_compare(work):
  """WORK/out: a compare study whose e2e run was killed midway."""
  from research import study_owner  # pylint: disable=g-import-not-at-top
  out_dir = os.path.join(work, "out")
  owner = study_owner.claim(out_dir, None)
  run_dir = os.path.join(out_dir, "e2e", "seed_0")
  study_owner.prepare(out_dir, run_dir, owner, "e2e", 0)
  os.makedirs(os.path.join(run_dir, "checkpoints"))
  with open(os.path.join(run_dir, "checkpoints", "ckpt-5.index"), "w",
            encoding="utf-8") as f:
    f.write("weights")


def _readme(work):
  with open(os.path.join(work, "out/e2e/seed_0/checkpoints/README.txt"), "w",
            encoding="utf-8") as f:
    f.write("what these are")


def _idx(train):
  """WORK/idx: Fashion-MNIST IDX files with `train` training examples."""
  def step(work):
    source = os.path.join(work, "idx")
    os.makedirs(source)
    for stems, n in ((("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                      train),
                     (("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
                      32)):
      for stem, array in zip(stems, (np.zeros((n, 28, 28), np.uint8),
                                     np.arange(n, dtype=np.uint8) % 10)):
        header = (0x800 + array.ndim).to_bytes(4, "big") + b"".join(
            d.to_bytes(4, "big") for d in array.shape)
        with open(os.path.join(source, stem), "wb") as f:
          f.write(header + array.tobytes())
  return step


def containment_cases():
  """Links at every depth, pointers out, foreign files, exports, sizes."""
  keep = "WORK/mine"
  return [
      Case("train resume, ckpt-7_temp a link to the user's folder",
           "train.train", RESUME, keep=keep,
           setup=_then(_trained, _mine,
                       _symlink("mine", "run/checkpoints/ckpt-7_temp"))),
      Case("train, checkpoints/ a link to another run's", "train.train",
           TT[:1] + ["--train_steps=40", "--keep_checkpoints=1",
                     "--model_dir=WORK/b"], keep="WORK/run",
           setup=_then(_trained, lambda w: os.makedirs(os.path.join(w, "b")),
                       _symlink("run/checkpoints", "b/checkpoints"))),
      Case("train resume, train/ logs a link to the user's folder",
           "train.train", RESUME, keep=keep,
           setup=_then(_trained, _mine, lambda w: shutil.rmtree(
               os.path.join(w, "run/train")), _symlink("mine", "run/train"))),
      Case("train resume, pointer lists an absolute prefix outside",
           "train.train", RESUME + ["--keep_checkpoints=1"],
           keep="WORK/outside",
           setup=_then(_trained, _pointer("WORK/outside/x/ckpt-1"))),
      Case("train resume, pointer lists ../../outside/x/ckpt-1",
           "train.train", RESUME + ["--keep_checkpoints=1"],
           keep="WORK/outside",
           setup=_then(_trained, _pointer("../../outside/x/ckpt-1"))),
      Case("compare rerun, train/ a link to the user's logs",
           "research.compare", COMPARE, keep=keep,
           setup=_then(_unfinished_compare, _mine,
                       _symlink("mine", "out/e2e/seed_0/train"))),
      Case("compare rerun, checkpoints/README.txt of the user's",
           "research.compare", COMPARE,
           keep="WORK/out/e2e/seed_0/checkpoints/README.txt",
           setup=_then(_unfinished_compare, _readme)),
      Case("export into a link to the user's folder", "train.export",
           ["--model_dir=WORK/run", "--export_dir=WORK/served"], keep=keep,
           setup=_then(_trained, _mine, _symlink("mine", "served"))),
      Case("train, export_dir too long for its temporary sibling",
           "train.train", TT + ["--model_dir=WORK/new",
                                "--export_dir=WORK/" + "e" * 240],
           absent="WORK/new"),
      Case("train fashion_mnist, 20 training images < one batch",
           "train.train", ["--preset=fashion_mnist_resnet",
                           "--source_dir=WORK/idx", "--data_dir=WORK/tfds",
                           "--batch_size=32", "--model_dir=WORK/new"],
           setup=_idx(20), absent="WORK/new"),
      Case("compare --model_fn=os:system", "research.compare",
           ["--model_fn=os:system", "--data=tests.test_user_study:tiny_data",
            "--train_steps=2", "--eval_points=2", "--noplots",
            "--out_dir=WORK/out"], absent="WORK/out"),
      Case("compare --model_fn=builtins:exit", "research.compare",
           ["--model_fn=builtins:exit",
            "--data=tests.test_user_study:tiny_data", "--train_steps=2",
            "--eval_points=2", "--noplots", "--out_dir=WORK/out"],
           absent="WORK/out"),
  ]
