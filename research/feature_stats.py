r"""What each module's output carries, as its LayerNorm-ed heads see it.

  python -m research.feature_stats --model_dir=runs/study_fortunes_lm/2wise/seed_0

Restores a language-model run's latest checkpoint, runs `--batches` batches
of the validation split through its modules and prints, per module output
h_k: the mean norm of h_k, the share of the variance of LayerNorm(h_k) that
the current token's identity explains, and the effective rank of the
per-token means (participation ratio of their singular values, with the
share of the top direction). A collapsed module, as 2-wise "only" gives on
the fortunes LM (docs/results/study_fortunes_lm/reading.md), shows a norm
far above e2e's and an effective rank near 1: every token maps to nearly
the same direction, so every head it feeds sees a constant.
"""
# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import json

from absl import app
from absl import flags
import tensorflow as tf

from tf_interlock import exits
from train.run_dir import RunDir
from step_model import representation
from train import config as config_lib
from train import datasets
from train import error_boundary
from train import run_io
from train import runtime_setup

_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "Run directory of a train.train language-model run "
    "(required); its latest checkpoint is read.")
_BATCHES = flags.DEFINE_integer(
    "batches", 8, "Batches (>= 1) of the validation split the statistics "
    "are computed over.")


def run_stats(model_dir, batches):
  """{"h_k": feature_stats} for modules 1..K-1 of a restored LM run."""
  run = RunDir(model_dir)
  config = config_lib.on_one_device(run_io.config_from_run(run))
  if not config.is_text:
    raise ValueError(f"feature_stats reads language-model runs; this run "
                     f"trains on {config.data.dataset}. "
                     f"Received: model_dir={model_dir!r}")
  latest = run.latest_checkpoint(None, flag="--model_dir", for_writing=False)
  if latest is None:
    raise FileNotFoundError(f"No checkpoint in {run.checkpoint_dir}. "
                            f"Received: model_dir={model_dir!r}")
  runtime_setup.setup_runtime(config)
  task = datasets.make_task(config, with_train=False)
  modules = run_io.restored_modules(config, task, latest, model_dir)
  ids = tf.concat([x for x, _ in task.eval.take(batches)], axis=0)
  stats = {}
  for found in exits.exits(modules[:-1], ids, heads=()):
    h = found.outputs
    stats[f"h_{found.index + 1}"] = representation.feature_stats(
        tf.reshape(h, [-1, h.shape[-1]]).numpy(),
        tf.reshape(ids, [-1]).numpy())
  return stats


@error_boundary.guard()
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  if not _MODEL_DIR.value:
    raise ValueError("--model_dir is required. Received: model_dir=None")
  print(json.dumps(run_stats(_MODEL_DIR.value, _BATCHES.value)))


if __name__ == "__main__":
  app.run(main)
