r"""Evaluates an exported SavedModel: `python -m train.evaluate`.

  python -m train.evaluate --model_dir=/tmp/run       # its export
  python -m train.evaluate --saved_model=/tmp/run/export [--data_dir=...]

The model and data come from the run: its config.json (--model_dir) or the
configuration the export carries in its marker (--saved_model), so no
--preset is needed; data flags (--data_dir, --source_dir, --eval_batches,
--batch_size) still apply. An export without that record (written by
`export_saved_model` directly) needs --preset. Prints one JSON line: loss and
accuracy (or perplexity) and the number of examples, for the final head and
for each early exit.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import dataclasses
import json

from absl import app
from absl import flags

from tf_interlock import evaluation
from train import config as config_lib
from train import datasets
from train import error_boundary
from train import flags_lib
from train import run_io

_SAVED_MODEL = flags.DEFINE_string(
    "saved_model", None, "SavedModel folder written by train.export or "
    "train.train, evaluated with the config it carries; default: the "
    "export of --model_dir's run.")
# --model_dir is the Config flag of train/flags_lib.py: a training run whose
# export (or --saved_model) is evaluated with the run's configuration.
# --help lists the Config flags too (the data flags apply here).
flags.adopt_module_key_flags(flags_lib)


def _given_fields():
  """Config fields set on the command line."""
  return [f.name for f in config_lib.flat_fields()
          if flags.FLAGS[f.name].present]


@error_boundary.guard()
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  flag_config, given = flags_lib.config_from_flags(), _given_fields()
  config, saved_model = run_io.evaluation_config(
      _SAVED_MODEL.value,
      flag_config.run.model_dir if "model_dir" in given else None,
      flag_config, given, preset_given=flags.FLAGS["preset"].present)
  config_lib.validate(config)  # the train binary's rules, e.g. --data_dir
  size = datasets.split_sizes(config)[1]
  if size < config.run.batch_size:  # evaluation drops a partial batch
    config_lib.fail("batch_size", config.run.batch_size,
                    f"must be at most the {size} examples (text: packed "
                    f"sequences) of the evaluation split of {config.data.dataset}")
  task = datasets.make_task(config, with_train=False)
  dataset = task.eval.take(config.run.eval_batches) if config.run.eval_batches else (
      task.eval)
  try:
    results = evaluation.evaluate_saved_model(
        saved_model, dataset,
        task="lm" if task.kind == "lm" else "classification")
  except evaluation.InputMismatch as e:
    raise ValueError(_mismatch_line(e, saved_model, config, given)) from None
  print(json.dumps(results))


# The flags that decide the shape and type of the features evaluated.
_DATA_FLAGS = ("preset", "dataset", "seq_len", "vocab_kind", "vocab_size",
               "source_dir", "data_dir")


def _mismatch_line(mismatch, saved_model, config, given):
  """The one line for data whose features the export cannot take."""
  named = [f"--{name}={flags.FLAGS[name].value}" for name in _DATA_FLAGS
           if name == "preset" and flags.FLAGS["preset"].present or
           name in given]
  data = " ".join(named) or "the run's configuration"
  return (f"--saved_model={saved_model} takes features of shape "
          f"{evaluation.describe_spec(mismatch.expected)}, but the data of "
          f"{data} (dataset={config.data.dataset}) gives "
          f"{evaluation.describe_spec(mismatch.received)}; pass the data "
          "flags the export was trained with (an export without "
          "interlock_export.json needs them)")


if __name__ == "__main__":
  app.run(main)
