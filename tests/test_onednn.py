"""oneDNN kernels on (train.runtime_env's default on x86-64) keep
--deterministic=true runs bitwise reproducible, through the real binary."""

import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--preset=synthetic_mlp", "--placement=simulated", "--mlp_width=256",
         "--train_steps=10", "--steps_per_loop=5", "--deterministic=true",
         "--checkpoint_every_steps=10", "--eval_every_steps=10"]


def _weights(model_dir):
  reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints"))
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if "VARIABLE_VALUE" in n and not n.startswith("save_counter")}


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
