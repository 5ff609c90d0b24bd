"""Thin clients of a finished run: its config, its export, its evaluation.

`train.export` and `train.evaluate` (and compare) read a run directory
through these functions and `train.run_dir.RunDir`; none of them
reads flags.
"""

import dataclasses
import json
import sys
import typing

import tensorflow as tf

from tf_interlock import exits as exits_lib
from train import config as config_lib
from train import datasets
from train import export_dir as export_dir_lib
from train import networks
from train import owned_dir
from train import paths
from train import run_dir as run_dir_lib
from train import run_lock
from train import runtime_setup
from train import train_lib


def _type_problem(kind, value):
  """Why `value` cannot be a `Config` field declared `kind`, or None. JSON
  gives lists for tuples and ints for whole floats."""
  optional = False
  if typing.get_origin(kind) is typing.Union:  # Optional[X]
    optional = type(None) in typing.get_args(kind)
    kind = [t for t in typing.get_args(kind) if t is not type(None)][0]
  if value is None:
    return None if optional else "must not be null"
  if typing.get_origin(kind) is tuple:
    item = typing.get_args(kind)[0]
    if not isinstance(value, list) or any(_type_problem(item, v)
                                          for v in value):
      return f"must be a list of {item.__name__}s"
    return None
  if kind is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  elif kind is int:
    ok = isinstance(value, int) and not isinstance(value, bool)
  else:
    ok = isinstance(value, kind)
  article = "an" if kind is int else "a"
  return None if ok else f"must be {article} {kind.__name__}"


def config_from_dict(fields, source):
  """A `Config` from a run's recorded fields; `source` names their file.

  The record is checked as strictly as flags are: every field must have its
  declared type, and the values pass `config.validate` (the data folders
  aside: evaluate may point them elsewhere, and the run checks them then).

  Raises:
    ValueError: one line naming `source`, the field and its value.
  """
  fields = dict(fields)
  fields.pop("history", None)  # earlier starts' changes (train_lib)
  known = {f.name: f for f in config_lib.flat_fields()}
  unknown = sorted(set(fields) - set(known))
  if unknown:
    raise ValueError(f"{source} has fields this version does not know: "
                     f"{unknown}. Received: config={source!r}")
  for name, value in fields.items():
    problem = _type_problem(known[name].type, value)
    if problem:
      raise ValueError(f"{source} has {name}={value!r}, which {problem}; "
                       f"nothing was changed: repair or move it. Received: "
                       f"config={source!r}")
  for name in ("split", "lr_decay_fractions"):
    if fields.get(name) is not None:
      fields[name] = tuple(fields[name])
  config = config_lib.Config(**fields)
  try:
    config_lib.validate(dataclasses.replace(config, data_dir=None,
                                            source_dir=None))
  except ValueError as e:
    raise ValueError(f"{source} holds an invalid value: {e}") from None
  return config


def config_from_run(run):
  """The `Config` a run wrote to its config.json."""
  fields = run.read_config()
  if fields is None:
    raise FileNotFoundError(f"No {run.config_path}: not a training run. "
                            f"Received: model_dir={run.path!r}")
  return config_from_dict(fields, run.config_path)


def restored_modules(config, task, checkpoint, model_dir):
  """The run's modules, built on one eval batch, weights from `checkpoint`.

  Raises:
    ValueError: for a corrupt checkpoint or one from another model.
  """
  modules = networks.make_modules(config, task)
  # Builds every weight before restoring.
  exits_lib.build(modules, next(iter(task.eval.take(1)))[0])
  try:
    train_lib.check_checkpoint(checkpoint, modules)
  except train_lib.TrainingError as e:
    raise ValueError(f"{e}. Received: model_dir={model_dir!r}") from None
  restorable = tf.train.Checkpoint(**{
      f"module_{k + 1}": m for k, m in enumerate(modules)})
  try:
    restorable.restore(checkpoint).expect_partial(
    ).assert_existing_objects_matched()
  except (tf.errors.OpError, AssertionError, ValueError, IndexError,
          KeyError) as e:
    raise ValueError(f"{train_lib.restore_error(checkpoint, e)}. Received: "
                     f"model_dir={model_dir!r}") from None
  return modules


def export_run(model_dir, export_dir=None, checkpoint=None):
  """Restores a run's checkpoint and exports it; returns the export path.

  Args:
    model_dir: the run directory.
    export_dir: the target (default: model_dir/export).
    checkpoint: "ckpt-N", or None for the latest.
  """
  run = run_dir_lib.RunDir(model_dir)
  run.check_layout()
  run.check_nesting()
  config = config_lib.on_one_device(config_from_run(run))
  latest = run.latest_checkpoint(checkpoint, flag="--checkpoint",
                                 for_writing=False)
  if latest is None:
    raise FileNotFoundError(f"No checkpoint in {run.checkpoint_dir}. "
                            f"Received: model_dir={model_dir!r}")
  export_dir = run.check_export_dir(export_dir or config.run.export_dir)
  with run_lock.held(run.path):  # one writer, as in train_lib.run
    runtime_setup.setup_runtime(config)
    task = datasets.make_task(config, with_train=False)
    modules = restored_modules(config, task, latest, model_dir)
    return export_dir_lib.export_owned(
        modules, tf.TensorSpec((None,) + tuple(task.input_shape),
                               task.input_dtype), export_dir,
        owner=run.run_id(create=True),
        metadata={"model_dir": run.path,
                  "config": json.loads(config.to_json()),
                  "step": train_lib.checkpoint_step(latest)})


def export_record(saved_model):
  """The configuration an export of the binaries records, or None.

  The binaries write `interlock_export.json` with the run's "config" (and
  model_dir, step) into every export; `export_saved_model` called directly
  writes none, and then the data flags decide. A marker that is there but
  unreadable, of another shape or without its "config" object is damaged:
  evaluated as if it were absent, its data would be guessed from the flags
  and the failure would speak of feature shapes, never of the file.

  Raises:
    ValueError: one line naming the damaged file and what is wrong.
  """
  marker_path = paths.join(saved_model, export_dir_lib.MARKER)
  if not tf.io.gfile.exists(marker_path) and (
      paths.special_kind(marker_path) is None):
    return None
  received = f"Received: saved_model={saved_model!r}"
  try:
    marker = owned_dir.load_json(marker_path, {"config": dict})
  except ValueError as e:
    raise ValueError(
        f"{marker_path} {e}; nothing was evaluated: it records the "
        f"configuration the export was trained with, so export the run "
        f"again (train.export), or move the file away and pass the data "
        f"flags the export was trained with. {received}") from None
  return marker


def check_export_of(saved_model, recorded, model_dir):
  """Raises if `saved_model` was exported from a run of another network.

  An export records what it was made from in its marker (the run's
  model_dir, config and checkpoint step); evaluated with --model_dir, it
  must be of that run's architecture and data. An export without that
  record (`export_saved_model` called directly) is not checked.

  Args:
    saved_model: --saved_model.
    recorded: the `Config` of --model_dir's run.
    model_dir: --model_dir.

  Raises:
    ValueError: one line naming the first field that differs.
  """
  marker = export_record(saved_model)
  if marker is None:
    return
  made_from = config_from_dict(
      marker["config"], f"{saved_model}/{export_dir_lib.MARKER}")
  for name in train_lib.ARCHITECTURE_FIELDS:
    if name != "optimizer" and made_from.get(name) != recorded.get(name):
      raise ValueError(
          f"--saved_model={saved_model} was exported from the run "
          f"{marker.get('model_dir')} with {name}={made_from.get(name)!r}, "
          f"but --model_dir={model_dir} has {name}={recorded.get(name)!r}: "
          f"evaluate it with its own run's --model_dir, or with "
          f"--saved_model alone. Received: saved_model={saved_model!r}")


def evaluation_config(saved_model, model_dir, flag_config, given,
                      preset_given=False, err=None):
  """The Config to evaluate with, and the SavedModel path.

  Args:
    saved_model: --saved_model or None.
    model_dir: --model_dir or None.
    flag_config: the Config of --preset and the flags.
    given: the Config fields set on the command line.
    preset_given: --preset was on the command line (it is then unused).
    err: where a note about an unused --preset goes (default: stderr).

  Returns:
    (config, saved_model path).
  """
  recorded = None
  if model_dir:
    run = run_dir_lib.RunDir(model_dir)
    run.check_layout()
    recorded = config_from_run(run)
    if saved_model:
      check_export_of(saved_model, recorded, model_dir)
    saved_model = saved_model or recorded.run.export_dir or run.default_export_dir
  elif not saved_model:
    raise ValueError("--saved_model or --model_dir is required. Received: "
                     "saved_model=None")
  else:
    run_dir_lib.check_literal(paths.normalize(saved_model), "--saved_model")
    marker = export_record(saved_model)
    if marker is not None:
      recorded = config_from_dict(
          marker["config"], f"{saved_model}/{export_dir_lib.MARKER}")
  if recorded is None:
    return flag_config, saved_model
  for name in given:
    value = flag_config.get(name)
    if (name in train_lib.ARCHITECTURE_FIELDS and
        value != recorded.get(name)):
      raise ValueError(f"--{name}={value} differs from the run's "
                       f"{name}={recorded.get(name)!r}; the model's "
                       f"architecture comes from the run. Received: "
                       f"{name}={value!r}")
  if preset_given:
    print("note: --preset is not used: the run records its configuration",
          file=err or sys.stderr)
  return dataclasses.replace(config_lib.on_one_device(recorded), **{
      name: flag_config.get(name) for name in given
      if name not in ("model_dir", "export_dir", "placement")}), saved_model
