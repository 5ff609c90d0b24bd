"""Thin clients of a finished run: its config, its export, its evaluation.

`train.export` and `train.evaluate` (and compare) read a run directory
through these functions and `tf_interlock.run_dir.RunDir`; none of them
reads flags.
"""

import dataclasses
import json
import sys

import tensorflow as tf

from tf_interlock import export as export_lib
from tf_interlock.run_dir import RunDir
from tf_interlock.run_lock import RunLock
from train import config as config_lib
from train import setup_lib
from train import train_lib


def config_from_dict(fields, source):
  """A `Config` from a run's recorded fields; `source` names their file."""
  fields = dict(fields)
  for name in ("split", "lr_decay_fractions"):
    if fields.get(name) is not None:
      fields[name] = tuple(fields[name])
  known = {f.name for f in dataclasses.fields(config_lib.Config)}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise ValueError(f"{source} has fields this version does not know: "
                     f"{unknown}. Received: config={source!r}")
  return config_lib.Config(**fields)


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
  modules = setup_lib.make_modules(config, task)
  h = next(iter(task.eval.take(1)))[0]
  for module in modules:  # build every weight before restoring
    h = module(h)
    h = h[0] if module.has_aux_head else h
  restorable = tf.train.Checkpoint(**{
      f"module_{k + 1}": m for k, m in enumerate(modules)})
  try:
    restorable.restore(checkpoint).expect_partial(
    ).assert_existing_objects_matched()
  except (tf.errors.OpError, AssertionError, ValueError, IndexError,
          KeyError) as e:
    first = (str(e).strip().splitlines() or [""])[0][:160]
    raise ValueError(f"cannot restore checkpoint {checkpoint} "
                     f"({type(e).__name__}: {first}); it is corrupt or from "
                     f"another model. Received: model_dir={model_dir!r}"
                     ) from None
  return modules


def export_run(model_dir, export_dir=None, checkpoint=None):
  """Restores a run's checkpoint and exports it; returns the export path.

  Args:
    model_dir: the run directory.
    export_dir: the target (default: model_dir/export).
    checkpoint: "ckpt-N", or None for the latest.
  """
  run = RunDir(model_dir)
  run.check_layout()
  run.check_nesting()
  config = dataclasses.replace(config_from_run(run),
                               placement="single")
  latest = run.latest_checkpoint(checkpoint, flag="--checkpoint",
                                 for_writing=False)
  if latest is None:
    raise FileNotFoundError(f"No checkpoint in {run.checkpoint_dir}. "
                            f"Received: model_dir={model_dir!r}")
  export_dir = run.check_export_dir(export_dir or config.export_dir)
  lock = RunLock(run.lock_path)
  lock.acquire()
  try:
    setup_lib.setup_runtime(config)
    task = setup_lib.make_task(config, with_train=False)
    modules = restored_modules(config, task, latest, model_dir)
    return export_lib.export_saved_model(
        modules, tf.TensorSpec((None,) + tuple(task.input_shape),
                               task.input_dtype), export_dir,
        owner=run.run_id(create=True),
        metadata={"model_dir": run.path,
                  "config": json.loads(config.to_json())})
  finally:
    lock.release()


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
    run = RunDir(model_dir)
    run.check_layout()
    recorded = config_from_run(run)
    saved_model = saved_model or recorded.export_dir or run.default_export_dir
  elif not saved_model:
    raise ValueError("--saved_model or --model_dir is required. Received: "
                     "saved_model=None")
  else:
    marker = export_lib.read_marker(saved_model) or {}
    if isinstance(marker.get("config"), dict):
      recorded = config_from_dict(
          marker["config"], f"{saved_model}/{export_lib.MARKER}")
  if recorded is None:
    return flag_config, saved_model
  for name in given:
    value = getattr(flag_config, name)
    if (name in train_lib.ARCHITECTURE_FIELDS and
        value != getattr(recorded, name)):
      raise ValueError(f"--{name}={value} differs from the run's "
                       f"{name}={getattr(recorded, name)!r}; the model's "
                       f"architecture comes from the run. Received: "
                       f"{name}={value!r}")
  if preset_given:
    print("note: --preset is not used: the run records its configuration",
          file=err or sys.stderr)
  return dataclasses.replace(recorded, placement="single", **{
      name: getattr(flag_config, name) for name in given
      if name not in ("model_dir", "export_dir", "placement")}), saved_model
