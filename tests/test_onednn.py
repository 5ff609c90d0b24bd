"""oneDNN kernels on (train.runtime_env's default on x86-64) keep
--deterministic=true runs bitwise reproducible, through the real binary;
research.onednn_effect measures both settings, each in its own process."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import binaries

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--preset=synthetic_mlp", "--placement=simulated", "--mlp_width=256",
         "--train_steps=10", "--steps_per_loop=5", "--deterministic=true",
         "--checkpoint_every_steps=10", "--eval_every_steps=10"]


def _weights(model_dir):
  reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints"))
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if "VARIABLE_VALUE" in n and not n.startswith("save_counter")}


@pytest.mark.slow
def test_deterministic_runs_are_bitwise_equal_with_onednn(tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT,
             TF_ENABLE_ONEDNN_OPTS="1")
  runs = {}
  for name in ("a", "b"):
    model_dir = str(tmp_path / name)
    runs[model_dir] = subprocess.Popen(
        [sys.executable, "-m", "train.train", *FLAGS,
         f"--model_dir={model_dir}"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  for proc in runs.values():
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
  a, b = (_weights(d) for d in runs)
  assert a.keys() == b.keys() and len(a) >= 8
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
def test_onednn_effect_measures_both_settings_in_their_own_processes(
    tmp_path):
  out_dir = tmp_path / "effect"
  binaries.run_binary(
      "research.onednn_effect", "--presets=synthetic_mlp", "--rounds=1",
      "--repeats=2", "--strategies=e2e,local",
      "--extra_flags=mlp_width=32,batch_size=16", f"--out_dir={out_dir}")
  with open(out_dir / "onednn_effect.json") as f:
    results = json.load(f)
  row = results["presets"]["synthetic_mlp"]
  for setting in ("off", "on"):
    assert row[setting]["work_s"] > 0
    # e2e waits for every module's backward pass; local skips the input
    # VJPs, and its modules overlap. (work_s also counts ops a one-batch
    # step never runs, such as the microbatch accumulate, so it bounds
    # nothing: measured costs of microsecond ops are noisy.)
    e2e, local = (row[setting]["step_s"][s] for s in ("e2e", "local"))
    fewer = f"{min(results['cores'], 4)} cores"
    assert set(e2e) == {fewer, "4 cores"}
    assert 0 < local["4 cores"] <= e2e["4 cores"] <= e2e[fewer]
  report = (out_dir / "onednn_effect.md").read_text()
  assert "| one-thread work per step |" in report
  assert "| local step, 4 cores (model) |" in report


@pytest.mark.slow
def test_onednn_effect_refuses_an_unknown_preset(tmp_path):
  proc = binaries.run_binary("research.onednn_effect", "--presets=mnist",
                             f"--out_dir={tmp_path / 'x'}", check=False)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "error: --presets='mnist' is invalid: must be one of")
  assert not (tmp_path / "x").exists()
