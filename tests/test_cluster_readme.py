"""The README's "Several hosts" commands train the MLP preset, as written.

The commands run with two changes only: free ports instead of 2222/2223 (a
test must not depend on those being free) and a temporary model_dir. The
two workers are stopped by the fixture's finalizer, also on failure.
"""

import json
import os
import re
import shlex

import pytest

from tests import cluster_procs

pytestmark = pytest.mark.cluster


def readme_commands():
  """The shell commands of the README's "Several hosts" block."""
  with open(os.path.join(cluster_procs.ROOT, "README.md")) as f:
    section = f.read().split("## Several hosts", 1)[1].split("\n## ", 1)[0]
  block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
  return [line.strip() for line in block.replace("\\\n", " ").splitlines()
          if line.strip()]


def test_readme_commands_train_the_mlp_preset(procs, tmp_path):
  commands = readme_commands()
  assert [c.split()[2] for c in commands] == [
      "train.worker", "train.worker", "train.train"], commands
  ports = cluster_procs.free_ports(2)
  model_dir = str(tmp_path / "cluster_mlp")
  argvs = []
  for command in commands:
    command = command.replace("127.0.0.1:2222", f"127.0.0.1:{ports[0]}")
    command = command.replace("127.0.0.1:2223", f"127.0.0.1:{ports[1]}")
    command = command.replace("runs/cluster_mlp", model_dir)
    argv = shlex.split(command.rstrip("&").strip())
    assert argv[:2] == ["python", "-m"], command
    argvs.append(argv[2:])
  for module, *flags in argvs[:2]:
    worker = procs.start(module, *flags)
    assert "ready" in worker.stdout.readline()
  module, *flags = argvs[2]
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
