r"""Exports a trained run as a SavedModel: `python -m train.export`.

  python -m train.export --model_dir=/tmp/run [--export_dir=/tmp/run/export]

Rebuilds the run's network from model_dir/config.json on one device,
restores the latest checkpoint (or --checkpoint=ckpt-N) and writes a
SavedModel whose `serving_default` returns the final logits and `exit_k` the
logits of leaving after module k. The export replaces only an earlier export
of the same run; it holds model_dir's lock while it works.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

from absl import app
from absl import flags

from train import error_boundary
from train import run_dir
from train import run_io

_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "Run directory of a train.train run (required): its "
    "config.json and checkpoints/ are read, local or gs://.")
_EXPORT_DIR = flags.DEFINE_string(
    "export_dir", None, "Folder the SavedModel is written to; it replaces "
    "only an earlier export of this run (default: model_dir/export).")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "Export this ckpt-N of model_dir/checkpoints "
    "(default: the latest).")


@error_boundary.guard(interrupted="the previous export, if any, is intact "
                      "and the unfinished one was removed")
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  if not _MODEL_DIR.value:
    raise ValueError("--model_dir is required. Received: model_dir=None")
  run_dir.check_lasting(_EXPORT_DIR.value, "--export_dir")
  print(run_io.export_run(_MODEL_DIR.value, _EXPORT_DIR.value,
                          _CHECKPOINT.value))


if __name__ == "__main__":
  app.run(main)
