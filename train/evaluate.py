r"""Evaluates an exported SavedModel: `python -m train.evaluate`.

  python -m train.evaluate --saved_model=/tmp/run/export \
      --preset=fashion_mnist_resnet [--dataset=... --data_dir=...]

Prints one JSON line: loss and accuracy (or perplexity) and the number of
examples, for the final head and for each early exit.
"""

import json
import sys

from absl import app
from absl import flags

from tf_interlock import evaluation
from train import flags_lib
from train import setup_lib

_SAVED_MODEL = flags.DEFINE_string("saved_model", None, "Export dir.")


def main(argv):
  del argv
  try:
    if not _SAVED_MODEL.value:
      raise ValueError("--saved_model is required. Received: saved_model=None")
    config = flags_lib.config_from_flags()
    task = setup_lib.make_task(config, with_train=False)
    dataset = task.eval.take(config.eval_batches) if config.eval_batches else (
        task.eval)
    results = evaluation.evaluate_saved_model(
        _SAVED_MODEL.value, dataset,
        task="lm" if task.kind == "lm" else "classification")
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
