r"""Trains an interlocking network: `python -m train.train`.

  python -m train.train --preset=fashion_mnist_resnet --strategy=2wise \
      --model_dir=/tmp/run

Rerunning the same command resumes from the latest checkpoint in model_dir.
Every Config field is a flag (see train/config.py); --preset picks the base.
"""

import sys

from absl import app

from train import flags_lib
from train import train_lib


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    config = flags_lib.config_from_flags()
    train_lib.run(config)
  except (ValueError, FileNotFoundError, train_lib.TrainingError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
