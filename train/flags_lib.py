"""absl flags for every `Config` field, plus --preset.

Each field gets a flag of the same name whose default is "unset", so that
only flags given on the command line override the preset. A flag's help is
the text stored beside its field in `train/config.py` (`field_help`).
Values are parsed by the field's type; a bad value is a one-line error
naming the flag.
"""

import dataclasses
import typing

from absl import flags

from train import config as config_lib
from train import stop_watchdog

PRESET = flags.DEFINE_enum(
    "preset", "fashion_mnist_resnet", list(config_lib.PRESETS),
    "Base configuration (train/presets/NAME.py); every other flag given "
    "overrides one of its fields.")
# The default of every field flag: "not given", so the preset's value stands
# (--help shows it as the default).
_UNSET = "<the preset's>"


def _define_all():
  defined = {}
  for field in config_lib.flat_fields():
    defined[field.name] = flags.DEFINE_string(
        field.name, _UNSET, config_lib.field_help(field.name))
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
  if typing.get_origin(base) is tuple and not all(
      part.strip() for part in text.split(",")):  # never dropped silently
    raise ValueError(f"--{field.name}={text!r} has an empty entry: give one "
                     f"value between each two commas. Received: "
                     f"{field.name}={text!r}")
  try:
    if base is bool:
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(text)
      return text.lower() in ("true", "1")
    if typing.get_origin(base) is tuple:
      item = typing.get_args(base)[0]
      return tuple(item(part) for part in text.split(","))
    return base(text)
  except ValueError:
    kind = "list" if typing.get_origin(base) is tuple else base.__name__
    raise ValueError(f"--{field.name}={text!r} is not a valid {kind}: "
                     f"{_expected(field, base, optional)}. "
                     f"Received: {field.name}={text!r}") from None


# What each kind of flag takes, with an example (the value it has now).
_KINDS = {int: "a whole number in digits", float: "a number",
          bool: "true or false", str: "text"}


def _expected(field, base, optional):
  """What a flag of `field` takes, e.g. "a whole number in digits, such as
  --num_modules=4", for the line that refuses a value."""
  kind = _KINDS.get(base)
  if kind is None:  # Tuple[int, ...] or Tuple[float, ...]
    item = typing.get_args(base)[0]
    kind = "a comma-separated list of " + (
        "whole numbers in digits" if item is int else "numbers")
  default = field.default
  example = ""
  if default is not None and default is not dataclasses.MISSING and not (
      isinstance(default, tuple)):
    shown = str(default).lower() if base is bool else default
    example = f", such as --{field.name}={shown}"
  return kind + example + (" (or none)" if optional else "")


def given_flags():
  """Names of the Config fields given on the command line."""
  return {field.name for field in config_lib.flat_fields()
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
  for field in config_lib.flat_fields():
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
  config = dataclasses.replace(config, **overrides)
  # Where a stop forced by the watchdog finds the run's latest checkpoint.
  stop_watchdog.note(model_dir=config.run.model_dir)
  return config
