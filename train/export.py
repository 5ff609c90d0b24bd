r"""Exports a trained run as a SavedModel: `python -m train.export`.

  python -m train.export --model_dir=/tmp/run [--export_dir=/tmp/run/export]

Rebuilds the run's network from model_dir/config.json on one device,
restores the latest checkpoint and writes a SavedModel whose
`serving_default` returns the final logits and `exit_k` the logits of
leaving after module k.
"""

import dataclasses
import json
import os
import sys

from absl import app
from absl import flags
import tensorflow as tf

from tf_interlock import export as export_lib
from train import config as config_lib
from train import setup_lib

_MODEL_DIR = flags.DEFINE_string("model_dir", None, "A training run's dir.")
_EXPORT_DIR = flags.DEFINE_string("export_dir", None,
                                  "Output (default: model_dir/export).")


def load_run_config(model_dir):
  """The `Config` a run wrote to model_dir/config.json."""
  path = os.path.join(model_dir, "config.json")
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"No config.json in --model_dir: not a training "
                            f"run. Received: model_dir={model_dir!r}")
  with tf.io.gfile.GFile(path) as f:
    fields = json.load(f)
  for name in ("split", "lr_decay_fractions"):
    if fields.get(name) is not None:
      fields[name] = tuple(fields[name])
  return config_lib.Config(**fields)


def export_run(model_dir, export_dir=None):
  """Restores the latest checkpoint of a run and exports it."""
  config = dataclasses.replace(load_run_config(model_dir),
                               placement="single")
  latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  if latest is None:
    raise FileNotFoundError(f"No checkpoint under {model_dir}/checkpoints. "
                            f"Received: model_dir={model_dir!r}")
  setup_lib.setup_runtime(config)
  task = setup_lib.make_task(config, with_train=False)
  modules = setup_lib.make_modules(config, task)
  h = next(iter(task.eval.take(1)))[0]
  for module in modules:  # build every weight before restoring
    h = module(h)
    h = h[0] if module.has_aux_head else h
  checkpoint = tf.train.Checkpoint(**{
      f"module_{k + 1}": m for k, m in enumerate(modules)})
  checkpoint.restore(latest).expect_partial().assert_existing_objects_matched()
  export_dir = export_dir or os.path.join(model_dir, "export")
  export_lib.export_saved_model(
      modules, tf.TensorSpec((None,) + tuple(task.input_shape),
                             task.input_dtype), export_dir, overwrite=True)
  return export_dir


def main(argv):
  del argv
  if not _MODEL_DIR.value:
    print("error: --model_dir is required. Received: model_dir=None",
          file=sys.stderr)
    sys.exit(1)
  try:
    print(export_run(_MODEL_DIR.value, _EXPORT_DIR.value))
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
