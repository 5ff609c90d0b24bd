"""docs/multi_host.md's loopback recipe (the README points to it) trains
the MLP preset and `make demo`'s model (the fashion_mnist_resnet preset),
as written.

The commands run with three changes only: free ports instead of 2222/2223
(a test must not depend on those being free), a temporary model_dir, and,
for the demo model, a few steps on Fashion-MNIST-shaped IDX files the test
writes (it never depends on `make data`). The two workers are stopped by
the fixture's finalizer, also on failure.
"""

import json
import os
import re
import shlex

import numpy as np
import pytest

from tests import cluster_jobs
from tests import cluster_procs
from tests import idx_files
from train.data import images

pytestmark = pytest.mark.cluster


def readme_commands():
  """The shell commands of docs/multi_host.md's loopback recipe, in order."""
  with open(os.path.join(cluster_procs.ROOT, "docs", "multi_host.md")) as f:
    section = f.read().split("### Recipe: one machine, over loopback",
                             1)[1].split("\n#", 1)[0]
  return [line.strip() for block in re.findall(r"```sh\n(.*?)```", section,
                                               re.S)
          for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def start_readme_cluster(procs, tmp_path):
  """The recipe's two workers on free ports; returns the commands as argvs
  (python -m dropped) with those ports and model_dirs under tmp_path."""
  commands = readme_commands()
  assert [c.split()[2] for c in commands] == [
      "train.worker", "train.worker", "train.train", "train.train"], commands
  ports = cluster_procs.free_ports(2)
  argvs = []
  for command in commands:
    command = command.replace("127.0.0.1:2222", f"127.0.0.1:{ports[0]}")
    command = command.replace("127.0.0.1:2223", f"127.0.0.1:{ports[1]}")
    command = command.replace("runs/", f"{tmp_path}/")
    argv = shlex.split(command.rstrip("&").strip())
    assert argv[:2] == ["python", "-m"], command
    argvs.append(argv[2:])
  for module, *flags in argvs[:2]:
    worker = procs.start(module, *flags)
    assert "ready" in worker.stdout.readline()
  return argvs


def test_readme_commands_train_the_mlp_preset(procs, tmp_path):
  module, *flags = start_readme_cluster(procs, tmp_path)[2]
  model_dir = str(tmp_path / "cluster_mlp")
  assert f"--model_dir={model_dir}" in flags
  trainer = procs.start(module, *flags)
  out, err = trainer.communicate(timeout=600)
  assert trainer.returncode == 0, err[-3000:]
  summary = json.loads(out.strip().splitlines()[-1])
  assert summary["step"] == 20  # the synthetic_mlp preset's train_steps
  # The network's exit is module K, K as the README's command sets it.
  (k,) = [int(f.split("=")[1]) for f in flags
          if f.startswith("--num_modules=")]
  assert summary["eval"][f"module_{k}"]["accuracy"] > 0.3  # 10 classes
  assert os.path.exists(os.path.join(model_dir, "checkpoints", "checkpoint"))
  assert os.path.exists(os.path.join(model_dir, "export", "saved_model.pb"))


# A few steps of make demo's model: 4 modules on 2 shared cores trace for
# minutes; the weights are compared, not the accuracy.
SHORT = ["--train_steps=4", "--warmup_steps=2", "--steps_per_loop=2",
         "--eval_every_steps=4", "--eval_batches=1",
         "--checkpoint_every_steps=4", "--deterministic=true"]


def _fashion_mnist_files(tmp_path):
  """--source_dir and --data_dir flags for Fashion-MNIST-shaped IDX files of
  random images (512 train, 256 test) and their TFDS folder, prepared here.

  Prepared here, before either run, so that the two runs compared differ
  only in placement (a run that prepares the data ends as one that reads
  it: tests/test_first_run_reproducible.py).
  """
  source_dir = tmp_path / "idx"
  source_dir.mkdir()
  rng = np.random.default_rng(0)
  for split, n in (("train", 512), ("test", 256)):
    idx_files.write_split(str(source_dir), split,
                          rng.integers(0, 256, (n, 28, 28)),
                          np.arange(n) % 10, gz=False)
  data_dir = str(tmp_path / "tfds")
  images.image_dataset("fashion_mnist", "test", 128, training=False,
                       data_dir=data_dir, source_dir=str(source_dir))
  return [f"--source_dir={source_dir}", f"--data_dir={data_dir}"]


def test_readme_commands_train_make_demos_model(procs, tmp_path):
  module, *flags = start_readme_cluster(procs, tmp_path)[3]
  data = _fashion_mnist_files(tmp_path)
  assert "--preset=fashion_mnist_resnet" in flags  # make demo's preset
  one_process = [f for f in flags if not f.startswith(
      ("--placement=", "--cluster=", "--modules_per_worker=", "--model_dir="))]
  runs = {"cluster": flags + SHORT + data,
          "one_process": one_process + SHORT + data + [
      f"--model_dir={tmp_path / 'one_process'}"]}
  for name, argv in runs.items():
    trainer = procs.start(module, *argv)
    out, err = trainer.communicate(timeout=1500)
    assert trainer.returncode == 0, (name, err[-3000:])
    assert json.loads(out.strip().splitlines()[-1])["step"] == 4, name
  model_dir = str(tmp_path / "cluster_demo")
  assert f"--model_dir={model_dir}" in flags
  assert os.path.exists(os.path.join(model_dir, "export", "saved_model.pb"))
  cluster_jobs.assert_same_checkpoints(model_dir, str(tmp_path / "one_process"),
                                       atol=1e-6)
