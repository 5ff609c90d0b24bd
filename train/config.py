"""The training configuration: one flat dataclass, presets, validation.

Every field can be set by a preset (`train/presets/*.py`) and overridden by
a flag of the same name (`train/train.py`). `validate` checks every field
before anything is written, and each failure is one line that names the
field, the value and what is allowed.
"""

import dataclasses
import importlib
import json
import os
from typing import Optional, Tuple

from layers import resnet
from tf_interlock import strategy as strategy_lib

MODELS = ("resnet", "transformer", "mlp")
IMAGE_DATASETS = ("fashion_mnist", "cifar10", "cifar100", "imagenet2012")
TEXT_DATASETS = ("fortunes", "lm1b", "text_files")
SYNTHETIC = ("synthetic",)
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "step", "cosine")
PLACEMENTS = ("single", "simulated", "gpu", "tpu")
PRECISIONS = ("float32", "bfloat16")
NAN_POLICIES = ("stop", "skip")
PRESETS = ("fashion_mnist_resnet", "fortunes_lm", "cifar10_resnet",
           "cifar100_resnet", "lm1b_transformer", "synthetic_mlp")


@dataclasses.dataclass
class Config:
  """Everything one training run needs."""
  # Model.
  model: str = "resnet"
  resnet_preset: str = "resnet20"
  resnet_width: float = 1.0
  aux_head: str = "authors"
  split: Optional[Tuple[int, ...]] = None
  vocab_kind: str = "wordpiece"
  vocab_size: int = 4000
  seq_len: int = 64
  num_layers: int = 4
  d_model: int = 128
  num_heads: int = 4
  mlp_dim: int = 512
  mlp_width: int = 256
  # Data.
  dataset: str = "fashion_mnist"
  data_dir: Optional[str] = None
  source_dir: Optional[str] = None
  augment: bool = True
  # Strategy and placement.
  strategy: str = "2wise"
  variant: str = "only"
  num_modules: int = 4
  placement: str = "single"
  num_microbatches: int = 1
  tpu: Optional[str] = None
  mixed_precision: str = "float32"
  # Optimization (each module gets its own optimizer of this kind).
  optimizer: str = "sgd"
  learning_rate: float = 0.1
  momentum: float = 0.9
  weight_decay: float = 0.0
  lr_schedule: str = "constant"
  lr_decay_fractions: Tuple[float, ...] = (0.5, 0.75)
  lr_decay_factor: float = 0.1
  warmup_steps: int = 0
  # Loop.
  batch_size: int = 128
  train_steps: Optional[int] = 300
  epochs: Optional[float] = None
  time_budget_s: Optional[float] = None
  steps_per_loop: int = 10
  eval_every_steps: int = 100
  eval_batches: Optional[int] = None
  checkpoint_every_steps: int = 100
  keep_checkpoints: int = 3
  on_nan: str = "stop"
  seed: int = 0
  deterministic: bool = False
  # Output.
  model_dir: Optional[str] = None
  export_dir: Optional[str] = None

  def to_json(self):
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @property
  def is_text(self):
    return self.dataset in TEXT_DATASETS


def load_preset(name):
  """The `Config` of preset `name` (a module under train/presets)."""
  if name not in PRESETS:
    raise ValueError(f"--preset must be one of {PRESETS}. "
                     f"Received: preset={name!r}")
  return importlib.import_module(f"train.presets.{name}").get_config()


def _fail(field, value, allowed):
  raise ValueError(f"--{field}={value!r} is invalid: {allowed}. "
                   f"Received: {field}={value!r}")


def _positive(config, *names, allow_none=False, minimum=1):
  for name in names:
    value = getattr(config, name)
    if value is None and allow_none:
      continue
    if value is None or isinstance(value, bool) or value < minimum:
      _fail(name, value, f"must be a number >= {minimum}")


def num_blocks(config):
  """Blocks the network can be split between (None: any number)."""
  if config.model == "transformer":
    return config.num_layers
  if config.model == "resnet":
    key = config.resnet_preset.lower().replace("-", "").replace("_", "")
    if key not in resnet.PRESETS:
      _fail("resnet_preset", config.resnet_preset,
            f"must be one of {sorted(resnet.PRESETS)}")
    return sum(resnet.PRESETS[key][2])
  return None


def _network(config):
  return (config.resnet_preset if config.model == "resnet" else
          f"{config.model}")


def validate(config, num_replicas=1):
  """Checks every field; raises ValueError with a one-line message.

  Args:
    config: the `Config`.
    num_replicas: data-parallel replicas the batch is split over.
  """
  for field, allowed in (("model", MODELS), ("optimizer", OPTIMIZERS),
                         ("lr_schedule", SCHEDULES),
                         ("placement", PLACEMENTS),
                         ("mixed_precision", PRECISIONS),
                         ("on_nan", NAN_POLICIES),
                         ("variant", strategy_lib.VARIANTS),
                         ("dataset",
                          IMAGE_DATASETS + TEXT_DATASETS + SYNTHETIC)):
    if getattr(config, field) not in allowed:
      _fail(field, getattr(config, field), f"must be one of {allowed}")
  try:
    strategy_lib.parse_strategy(config.strategy, config.variant)
  except ValueError as e:
    _fail("strategy", config.strategy, str(e).split(". Received")[0])
  if config.model == "transformer" and not config.is_text:
    _fail("dataset", config.dataset, "model=transformer needs a text "
          f"dataset {TEXT_DATASETS}")
  if config.model != "transformer" and config.is_text:
    _fail("model", config.model, f"dataset={config.dataset} needs "
          "model=transformer")
  _positive(config, "num_modules", "batch_size", "steps_per_loop",
            "num_microbatches", "eval_every_steps", "checkpoint_every_steps",
            "keep_checkpoints", "seq_len", "num_layers", "d_model",
            "num_heads", "mlp_dim", "mlp_width", "vocab_size")
  _positive(config, "train_steps", "eval_batches", allow_none=True)
  _positive(config, "warmup_steps", minimum=0)
  for name in ("epochs", "time_budget_s", "learning_rate"):
    value = getattr(config, name)
    if value is not None and not value > 0:
      _fail(name, value, "must be > 0")
  if config.train_steps is None and config.epochs is None and (
      config.time_budget_s is None):
    _fail("train_steps", None, "set train_steps, epochs or time_budget_s")
  blocks = num_blocks(config)
  if blocks is not None and config.num_modules > blocks:
    _fail("num_modules", config.num_modules,
          f"at most {blocks} modules: the {_network(config)} has {blocks} "
          "blocks")
  if config.split is not None:
    if (len(config.split) != config.num_modules or min(config.split) < 1 or
        (blocks is not None and sum(config.split) != blocks)):
      _fail("split", ",".join(map(str, config.split)),
            f"needs {config.num_modules} positive block counts adding up to "
            f"the {blocks} blocks of the {_network(config)}")
  per_replica = config.batch_size / num_replicas
  if per_replica != int(per_replica) or (
      int(per_replica) % config.num_microbatches):
    _fail("batch_size", config.batch_size,
          f"must divide into {num_replicas} replicas x "
          f"{config.num_microbatches} microbatches")
  if config.placement == "tpu" and not config.tpu:
    _fail("tpu", config.tpu, "placement=tpu needs --tpu (name or grpc://)")
  if config.source_dir and not os.access(config.source_dir, os.R_OK):
    _fail("source_dir", config.source_dir, "must be a readable directory")
  data_dir = config.data_dir
  if data_dir and not data_dir.startswith("gs://"):
    # TFDS prepares data into data_dir, so a new folder is fine when its
    # parent exists and is writable.
    parent = os.path.dirname(os.path.abspath(data_dir))
    if not (os.access(data_dir, os.R_OK) if os.path.exists(data_dir) else
            os.access(parent, os.W_OK)):
      _fail("data_dir", data_dir, "must be a readable directory, or a new "
            "one in a writable folder")
