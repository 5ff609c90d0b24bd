"""A whole run on TF's in-memory ram:// file system, standing in for gs://.

ram:// lives in one process, so the cycle train -> kill -> resume -> export
-> evaluate runs in this process through the binaries' library functions;
the kill is an action raising after step 15 (the step-10 checkpoint is the
latest, no final save, no export), as a SIGKILL would leave it. Nothing may
appear on the local disk: every file operation must go through tf.io.gfile.
"""

import dataclasses
import io
import os
import uuid

import pytest
import tensorflow as tf

from tests.binaries import ROOT
from tf_interlock import evaluation
from train import config as config_lib
from train import export_dir as export_dir_lib
from train import run_io
from train import train_lib


class Killed(Exception):
  pass


class KillAfter:
  def __init__(self, step):
    self.step = step

  def after_loop(self, loop):
    if loop.step >= self.step:
      raise Killed(loop.step)


def test_train_kill_resume_export_evaluate_on_ram(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # a relative local write would land here
  model_dir = f"ram://cycle_{uuid.uuid4().hex[:8]}/run"
  config = dataclasses.replace(
      config_lib.load_preset("synthetic_mlp"), model_dir=model_dir,
      train_steps=20, steps_per_loop=5, checkpoint_every_steps=10,
      eval_every_steps=10, eval_batches=2)
  with pytest.raises(Killed):
    train_lib.run(config, out=io.StringIO(), extra_actions=[KillAfter(15)])
  checkpoints = tf.io.gfile.listdir(f"{model_dir}/checkpoints")
  assert "ckpt-10.index" in checkpoints and "ckpt-15.index" not in checkpoints
  assert not tf.io.gfile.exists(f"{model_dir}/export")
  assert not tf.io.gfile.exists(f"{model_dir}/lock.json")

  out = io.StringIO()
  summary = train_lib.run(config, out=out)
  assert "at step 10" in out.getvalue() and summary["step"] == 20
  assert summary["export_dir"] == f"{model_dir}/export"
  assert sorted(tf.io.gfile.listdir(model_dir)) == [
      "checkpoints", "config.json", "eval", "export", "run.json", "train"]

  # train.export replaces the run's own export (same run id)...
  assert run_io.export_run(model_dir) == f"{model_dir}/export"
  # ...and train.evaluate reads the run's configuration, no --preset.
  eval_config, saved_model = run_io.evaluation_config(
      None, model_dir, config_lib.Config(), given=[])
  assert eval_config.network.model == "mlp" and eval_config.data.dataset == "synthetic"
  task = train_lib.datasets.make_task(eval_config, with_train=False)
  results = evaluation.evaluate_saved_model(
      saved_model, task.eval.take(eval_config.run.eval_batches))
  for head in ("module_1", "module_2", "module_3", "module_4"):
    assert abs(results[head]["accuracy"] -
               summary["eval"][head]["accuracy"]) < 1e-6, head
  assert export_dir_lib.read_marker(saved_model)["model_dir"] == model_dir
  # os.path.abspath("ram://x") is "<cwd>/ram:/x": nothing of the sort here,
  # nor in the repository.
  assert os.listdir(tmp_path) == []
  assert not os.path.exists(os.path.join(ROOT, "ram:"))
