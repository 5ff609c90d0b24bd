r"""Trains an interlocking network: `python -m train.train`.

  python -m train.train --preset=fashion_mnist_resnet --strategy=2wise \
      --model_dir=/tmp/run

Rerunning the same command resumes from the latest checkpoint in model_dir.
Every Config field is a flag (see train/config.py); --preset picks the base.
One process trains a model_dir at a time (model_dir/lock.json); pass
--break_lock=true only when its holder is known to be dead.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

from absl import app
from absl import flags

from train import error_boundary
from train import flags_lib
from train import run_dir
from train import train_lib

_BREAK_LOCK = flags.DEFINE_bool(
    "break_lock", False, "Take over model_dir/lock.json although its holder "
    "looks alive (it is known to be dead).")
# --help lists the Config flags too, not only --break_lock.
flags.adopt_module_key_flags(flags_lib)


@error_boundary.guard(interrupted="before training started or during a "
                      "save; rerun to resume from the latest checkpoint")
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  config = flags_lib.config_from_flags()
  for name in ("model_dir", "export_dir"):  # must outlive this process
    run_dir.check_lasting(config.get(name), f"--{name}")
  train_lib.run(config, break_lock=_BREAK_LOCK.value)


if __name__ == "__main__":
  app.run(main)
