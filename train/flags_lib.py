"""absl flags for every `Config` field, plus --preset.

Each field gets a flag of the same name whose default is "unset", so that
only flags given on the command line override the preset. Values are parsed
by the field's type; a bad value is a one-line error naming the flag.
"""

import dataclasses
import typing

from absl import flags

from train import config as config_lib

PRESET = flags.DEFINE_enum("preset", "fashion_mnist_resnet",
                           list(config_lib.PRESETS), "Base configuration.")
_UNSET = "__unset__"
_HELP = {
    "strategy": "e2e, local, pairwise or Nwise (2wise, 3wise, ...).",
    "variant": "only (the released rule) or sum; default: the --strategy "
               "suffix (e.g. 2wise-sum), else only.",
    "placement": "single, simulated (K logical CPUs), gpu, tpu or cluster "
                 "(module k on worker k of --cluster; docs/multi_host.md).",
    "cluster": "placement=cluster: host:port of every worker "
               "(python -m train.worker), comma-separated, in task order; "
               "default: the worker job of TF_CONFIG.",
    "modules_per_worker": "placement=cluster: modules on each worker; "
                          "module k runs on worker k // modules_per_worker.",
    "cluster_timeout_s": "placement=cluster: seconds to wait for every "
                         "worker to accept connections before naming the "
                         "missing ones.",
    "threads_per_device": "placement=simulated: intra-op threads of each "
                          "logical CPU device (0: chosen by the schedule "
                          "model for this host's cores).",
    "modules_per_device": "placement=simulated: modules on each logical CPU "
                          "device; divides num_modules (0: chosen).",
    "split": "Comma-separated block counts per module (model=mlp: hidden "
             "layers per module); default balanced (mlp: 1 each).",
    "epochs": "Train this many passes over the training split; replaces "
              "the preset's train_steps (giving both flags is an error).",
    "train_steps": "Train this many steps; replaces the preset's epochs "
                   "(giving both flags is an error).",
    "time_budget_s": "Stop after this many seconds of training.",
    "on_nan": "stop (exit non-zero) or skip (roll back, move on).",
    "tpu": "Cloud TPU name or grpc:// address (placement=tpu).",
    "resume_from": "Resume from this complete checkpoint (ckpt-N) of the "
                   "run, e.g. when checkpoints/checkpoint is damaged.",
}


def _define_all():
  defined = {}
  for field in dataclasses.fields(config_lib.Config):
    defined[field.name] = flags.DEFINE_string(
        field.name, _UNSET, _HELP.get(field.name, f"Override of {field.name}."))
  return defined


_FIELD_FLAGS = _define_all()


def _parse(field, text):
  """Parses flag text into the field's type."""
  base, optional = field.type, False
  if typing.get_origin(base) is typing.Union:  # Optional[X]
    optional = type(None) in typing.get_args(base)
    base = [t for t in typing.get_args(base) if t is not type(None)][0]
  if optional and text.lower() in ("none", ""):
    return None
  try:
    if base is bool:
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(text)
      return text.lower() in ("true", "1")
    if typing.get_origin(base) is tuple:
      item = typing.get_args(base)[0]
      return tuple(item(part) for part in text.split(",") if part)
    return base(text)
  except ValueError:
    raise ValueError(f"--{field.name}={text!r} is not a valid "
                     f"{getattr(base, '__name__', base)}. "
                     f"Received: {field.name}={text!r}") from None


def given_flags():
  """Names of the Config fields given on the command line."""
  return {field.name for field in dataclasses.fields(config_lib.Config)
          if _FIELD_FLAGS[field.name].value != _UNSET}


def config_from_flags():
  """The preset's `Config` with every flag given on the command line.

  --epochs and --train_steps each say how long to train: the one given
  replaces the preset's other one, and giving both is an error. A preset's
  split (balanced by measured time for its own network and K) is dropped
  when --num_modules or --num_layers is given without --split: the network
  is then balanced by its default.
  """
  config = config_lib.load_preset(PRESET.value)
  overrides = {}
  for field in dataclasses.fields(config_lib.Config):
    text = _FIELD_FLAGS[field.name].value
    if text != _UNSET:
      overrides[field.name] = _parse(field, text)
  given = given_flags()
  if {"epochs", "train_steps"} <= given and None not in (
      overrides["epochs"], overrides["train_steps"]):
    config_lib.fail("epochs", overrides["epochs"], "give --epochs or "
                    "--train_steps, not both (train_steps="
                    f"{overrides['train_steps']})")
  if "epochs" in given:
    overrides.setdefault("train_steps", None)
  if "train_steps" in given:
    overrides.setdefault("epochs", None)
  if given & {"num_modules", "num_layers"} and "split" not in given:
    overrides["split"] = None
  return dataclasses.replace(config, **overrides)
