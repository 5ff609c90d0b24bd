"""The training configuration: presets, validation, flat access.

The fields are declared, grouped by concern, in `train/config_fields.py`
(`Config` holds one frozen group each). Every field can be set by a preset
(`train/presets/*.py`) and overridden by a flag of the same name
(`train/train.py`). `validate` checks every field
before anything is written, and each failure is one line that names the
field, the value and what is allowed.
"""

import dataclasses
import importlib
import math
import os

import tensorflow as tf

from layers import aux_heads
from layers import resnet
from tf_interlock import cluster as cluster_lib
from tf_interlock import placement as placement_lib
from tf_interlock import strategy as strategy_lib
from train import config_fields
from train import placement_runtime

# The declarations and the choices they allow (train/config_fields.py).
Config = config_fields.Config
ModelConfig = config_fields.ModelConfig
DataConfig = config_fields.DataConfig
StrategyConfig = config_fields.StrategyConfig
PlacementConfig = config_fields.PlacementConfig
OptimizationConfig = config_fields.OptimizationConfig
RunConfig = config_fields.RunConfig
field_help = config_fields.field_help
flat_fields = config_fields.flat_fields
flat = config_fields.flat
from_flat = config_fields.from_flat
MODELS = config_fields.MODELS
IMAGE_DATASETS = config_fields.IMAGE_DATASETS
TEXT_DATASETS = config_fields.TEXT_DATASETS
SYNTHETIC = config_fields.SYNTHETIC
OPTIMIZERS = config_fields.OPTIMIZERS
SCHEDULES = config_fields.SCHEDULES
PLACEMENTS = config_fields.PLACEMENTS
PRECISIONS = config_fields.PRECISIONS
JIT_COMPILE = config_fields.JIT_COMPILE
NAN_POLICIES = config_fields.NAN_POLICIES
VOCAB_KINDS = config_fields.VOCAB_KINDS
MAX_GET_NEXT_CALLS = config_fields.MAX_GET_NEXT_CALLS
MAX_MLP_MODULES = config_fields.MAX_MLP_MODULES
MAX_TRAIN_STEPS = config_fields.MAX_TRAIN_STEPS
PRESETS = ("fashion_mnist_resnet", "fortunes_lm", "fortunes_lm_paper_shape",
           "cifar10_resnet", "cifar100_resnet", "lm1b_transformer",
           "synthetic_mlp")


def load_preset(name):
  """The `Config` of preset `name` (a module under train/presets)."""
  if name not in PRESETS:
    raise ValueError(f"--preset must be one of {PRESETS}. "
                     f"Received: preset={name!r}")
  return importlib.import_module(f"train.presets.{name}").get_config()


def fail(flag, value, allowed):
  """Raises the one-line error of a bad flag value.

  Args:
    flag: the flag's name, without dashes.
    value: the value received.
    allowed: what the flag accepts, e.g. "must be > 0".

  Raises:
    ValueError: always, "--flag=value is invalid: allowed. Received: ...".
  """
  raise ValueError(f"--{flag}={value!r} is invalid: {allowed}. "
                   f"Received: {flag}={value!r}")


def placement_of(config):
  """The placement class --placement names (its name checked first)."""
  check_choice("placement", config.devices.placement, placement_lib.names())
  return placement_lib.get(config.devices.placement)


def runtime_of(config):
  """What the binaries set up for --placement (`placement_runtime`)."""
  return placement_runtime.of(placement_of(config))


def check_choice(flag, value, allowed):
  """Refuses a value outside `allowed` (a tuple of the accepted values)."""
  if value not in allowed:
    fail(flag, value, f"must be one of {tuple(allowed)}")


def check_number(flag, value, *, minimum=None, maximum=None,
                 above=None, below=None, integer=False, allow_none=False):
  """Refuses anything but a finite number in the given bounds.

  Args:
    flag: the flag's name, without dashes.
    value: the value received.
    minimum, maximum: inclusive bounds (None: unbounded).
    above, below: exclusive bounds (None: unbounded).
    integer: the value must be an int.
    allow_none: None (unset) is accepted.

  Raises:
    ValueError: naming the flag, the value and the allowed range.
  """
  if value is None and allow_none:
    return
  parts = [f">= {minimum}" if minimum is not None else None,
           f"> {above}" if above is not None else None,
           f"<= {maximum}" if maximum is not None else None,
           f"< {below}" if below is not None else None]
  wanted = ("an integer" if integer else "a finite number") + "".join(
      f" {p}" for p in parts if p)
  if (isinstance(value, bool) or
      not isinstance(value, (int, float)) or
      (integer and not isinstance(value, int)) or not math.isfinite(value) or
      (minimum is not None and value < minimum) or
      (maximum is not None and value > maximum) or
      (above is not None and not value > above) or
      (below is not None and not value < below)):
    fail(flag, value, f"must be {wanted}")


def check_positive(flag, value, *, integer=False, allow_none=False):
  """Refuses anything but a finite number > 0 (an int >= 1 if `integer`)."""
  if integer:
    check_number(flag, value, minimum=1, integer=True, allow_none=allow_none)
  else:
    check_number(flag, value, above=0, allow_none=allow_none)


def num_blocks(config):
  """Blocks the network can be split between (None: any number).

  The MLP has no fixed depth: its split is the number of hidden Dense layers
  of each module (default one each).
  """
  if config.network.model == "transformer":
    return config.network.num_layers
  if config.network.model == "resnet":
    key = config.network.resnet_preset.lower().replace("-", "").replace("_", "")
    if key not in resnet.PRESETS:
      fail("resnet_preset", config.network.resnet_preset,
           f"must be one of {sorted(resnet.PRESETS)}")
    return sum(resnet.PRESETS[key][2])
  return None


def _network(config):
  return (config.network.resnet_preset if config.network.model == "resnet" else
          f"{config.network.model}")


def check_batch(config, num_replicas):
  """Refuses a batch that does not divide into replicas x microbatches."""
  per_replica = config.run.batch_size / num_replicas
  if per_replica != int(per_replica) or (
      int(per_replica) % config.interlock.num_microbatches):
    fail("batch_size", config.run.batch_size,
         f"must divide into {num_replicas} replicas x "
         f"{config.interlock.num_microbatches} microbatches")


def _check_choices(config):
  for field, allowed in (("model", MODELS), ("optimizer", OPTIMIZERS),
                         ("lr_schedule", SCHEDULES),
                         ("placement", placement_lib.names()),
                         ("mixed_precision", PRECISIONS),
                         ("jit_compile", JIT_COMPILE),
                         ("on_nan", NAN_POLICIES),
                         ("vocab_kind", VOCAB_KINDS),
                         ("aux_head", ("auto",) + tuple(aux_heads.names())),
                         ("dataset",
                          IMAGE_DATASETS + TEXT_DATASETS + SYNTHETIC)):
    check_choice(field, config.get(field), allowed)
  if config.interlock.variant is not None:
    check_choice("variant", config.interlock.variant, strategy_lib.VARIANTS)
  try:
    strategy_lib.parse_strategy(config.interlock.strategy,
                                config.interlock.variant)
  except ValueError as e:
    fail("strategy", config.interlock.strategy, str(e).split(". Received")[0])
  if config.network.model == "transformer" and not config.is_text:
    fail("dataset", config.data.dataset, "model=transformer needs a text "
         f"dataset {TEXT_DATASETS}")
  if config.network.model != "transformer" and config.is_text:
    fail("model", config.network.model, f"dataset={config.data.dataset} needs "
         "model=transformer")
  # The ResNet's convolutions take images (height, width, channels); the
  # MLP's Dense layers a vector per example (synthetic's 32 features): on
  # the other kind each fails only when the network is built.
  if (config.network.model == "resnet" and
      config.data.dataset not in IMAGE_DATASETS):
    fail("model", config.network.model, f"dataset={config.data.dataset} "
         f"gives vectors, not images: model=resnet needs an image dataset "
         f"{IMAGE_DATASETS}; use model=mlp for synthetic")
  if config.network.model == "mlp" and config.data.dataset in IMAGE_DATASETS:
    fail("model", config.network.model, f"dataset={config.data.dataset} "
         f"gives images: model=mlp takes vectors (dataset=synthetic); use "
         f"model=resnet for images")
  # After the network/data checks: a conv head is wrong only for a network
  # whose data is right for it.
  if (config.network.model != "resnet"
      and config.network.aux_head in aux_heads.names(conv_only=True)):
    fail("aux_head", config.network.aux_head,
         f"reads image features [B, H, W, C]; model={config.network.model} "
         f"has flat or per-position features (take 'auto' or one of "
         f"{sorted(set(aux_heads.names()) - set(aux_heads.names(True)))})")


def _check_numbers(config):
  for name in ("num_modules", "batch_size", "steps_per_loop",
               "num_microbatches", "eval_every_steps",
               "checkpoint_every_steps", "keep_checkpoints", "seq_len",
               "num_layers", "d_model", "num_heads", "mlp_dim", "mlp_width",
               "vocab_size"):
    check_positive(name, config.get(name), integer=True)
  check_positive("eval_batches", config.run.eval_batches, integer=True,
                 allow_none=True)
  # A step count must fit the int64 step variable, and one beyond any run's
  # reach is a typo (about 30 years at 1000 steps/s).
  check_number("train_steps", config.run.train_steps, minimum=1,
               maximum=MAX_TRAIN_STEPS, integer=True, allow_none=True)
  for name in ("epochs", "time_budget_s"):
    check_positive(name, config.get(name), allow_none=True)
  check_positive("learning_rate", config.optim.learning_rate)
  runtime = runtime_of(config)
  if not runtime.needs_tpu:  # TPUStrategy's iterator is not counted
    check_number("steps_per_loop", config.run.steps_per_loop, minimum=1,
                 maximum=MAX_GET_NEXT_CALLS, integer=True)
  check_number("loop_block", config.run.loop_block, minimum=0,
               maximum=config.run.steps_per_loop, integer=True)
  if config.run.loop_block and not placement_of(config).one_process:
    fail("loop_block", config.run.loop_block, "applies only to placements "
         "that run every module in this process (single, simulated, gpu); "
         f"placement={config.devices.placement} keeps the library's loop: "
         "leave it 0")
  for name in ("threads_per_device", "modules_per_device"):
    value = config.get(name)
    check_number(name, value, minimum=0, integer=True)
    if value != 1 and not runtime.splits_host_cpu:
      fail(name, value, f"applies only to placement=simulated (placement="
           f"{config.devices.placement} uses the devices as they are); "
           "leave it 1")
  if config.devices.modules_per_device and (
      config.interlock.num_modules % config.devices.modules_per_device):
    fail("modules_per_device", config.devices.modules_per_device,
         f"must divide num_modules={config.interlock.num_modules} "
         "(or be 0: chosen)")
  check_positive("resnet_width", config.network.resnet_width)
  check_positive("lr_decay_factor", config.optim.lr_decay_factor)
  check_number("warmup_steps", config.optim.warmup_steps, minimum=0,
               integer=True)
  check_number("weight_decay", config.optim.weight_decay, minimum=0)
  # momentum 1 would never forget a gradient: the velocity grows unbounded.
  check_number("momentum", config.optim.momentum, minimum=0, below=1)
  # numpy's seed (keras.utils.set_random_seed) takes 0 <= seed < 2**32.
  check_number("seed", config.run.seed, minimum=0, maximum=2**32 - 1,
               integer=True)
  fractions = config.optim.lr_decay_fractions
  if any(not 0 < f < 1 for f in fractions) or list(fractions) != sorted(
      fractions):
    fail("lr_decay_fractions", ",".join(map(str, fractions)),
         "must be increasing fractions of the run, each in (0, 1)")


def _check_length(config):
  """train_steps, epochs and time_budget_s: what bounds the run."""
  if config.run.train_steps is not None and config.run.epochs is not None:
    fail("epochs", config.run.epochs, f"give --epochs or --train_steps, not "
         f"both (train_steps={config.run.train_steps})")
  if config.run.train_steps is None and config.run.epochs is None and (
      config.run.time_budget_s is None):
    fail("train_steps", None, "set train_steps, epochs or time_budget_s")
  if config.optim.lr_schedule != "constant" and (
      config.run.train_steps is None and config.run.epochs is None):
    fail("lr_schedule", config.optim.lr_schedule, "a decaying schedule needs "
         "--train_steps or --epochs (a time budget alone gives no length)")
  if config.run.train_steps is not None and (
      config.optim.warmup_steps >= config.run.train_steps):
    fail("warmup_steps", config.optim.warmup_steps,
         f"must be < train_steps={config.run.train_steps}")


def _check_split(config):
  blocks = num_blocks(config)
  if blocks is None and config.interlock.num_modules > MAX_MLP_MODULES:
    fail("num_modules", config.interlock.num_modules,
         f"the mlp takes at most {MAX_MLP_MODULES} modules: TF's graph "
         "optimizer needs minutes for the traced steps and the export of "
         "more (they grow faster than K)")
  if blocks is not None and config.interlock.num_modules > blocks:
    fail("num_modules", config.interlock.num_modules,
         f"at most {blocks} modules: the {_network(config)} has {blocks} "
         "blocks")
  split, num_modules = config.interlock.split, config.interlock.num_modules
  if split is None:
    return
  if blocks is None:  # the MLP: any positive number of layers per module
    if len(split) != num_modules or min(split) < 1:
      fail("split", ",".join(map(str, split)),
           f"needs {num_modules} positive counts of hidden layers, "
           "one per module of the mlp")
  elif (len(split) != num_modules or min(split) < 1 or
        sum(split) != blocks):
    fail("split", ",".join(map(str, split)),
         f"needs {num_modules} positive block counts adding up to "
         f"the {blocks} blocks of the {_network(config)}")


def _check_cluster(config):
  """--cluster (or TF_CONFIG) and --modules_per_worker of placement=cluster."""
  check_positive("modules_per_worker", config.devices.modules_per_worker,
                 integer=True)
  check_positive("cluster_timeout_s", config.devices.cluster_timeout_s)
  if not runtime_of(config).needs_cluster:
    for name, unset in (("cluster", None), ("modules_per_worker", 1)):
      if config.get(name) != unset:
        fail(name, config.get(name), "applies only to "
             f"placement=cluster (placement={config.devices.placement})")
    return
  try:
    workers = cluster_lib.cluster_spec(config.devices.cluster).num_tasks(
        cluster_lib.JOB)
  except ValueError as e:
    fail("cluster", config.devices.cluster, str(e).rsplit(". Received:", 1)[0])
  try:
    cluster_lib.module_workers(config.interlock.num_modules, workers,
                               config.devices.modules_per_worker)
  except ValueError as e:
    fail("modules_per_worker", config.devices.modules_per_worker,
         str(e).rsplit(". Received:", 1)[0])


def _check_directory(flag, path, may_create):
  """A readable directory (or, if `may_create`, a new one it can make)."""
  if not path:
    return
  if tf.io.gfile.exists(path):
    if not tf.io.gfile.isdir(path):
      fail(flag, path, "must be a directory, not a file")
    if "://" not in path and not os.access(path, os.R_OK | os.X_OK):
      fail(flag, path, "must be a readable directory")
    return
  if not may_create:
    fail(flag, path, "must be an existing directory")
  # TFDS prepares data into data_dir, so a new folder is fine when its
  # parent is a writable directory.
  parent = os.path.dirname(path.rstrip("/")) or "."
  ancestor = parent
  while ancestor not in ("", "/") and not tf.io.gfile.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  if ancestor and tf.io.gfile.exists(ancestor) and not tf.io.gfile.isdir(
      ancestor):
    fail(flag, path, f"lies under {ancestor}, which is a file")
  if "://" not in path and not (os.path.isdir(parent) and
                                os.access(parent, os.W_OK)):
    fail(flag, path, "must be a readable directory, or a new one in a "
         "writable folder")


def on_one_device(config):
  """`config` for a process that restores a run on one device.

  Export, evaluation and the feature statistics rebuild the trained modules
  in one process, whatever placement trained them: the placement and every
  field that applies only to it (simulated threads, cluster workers) go back
  to their defaults, so the stored run validates as a single-device one.

  Args:
    config: the run's recorded `Config`.

  Returns:
    A copy with placement="single".
  """
  return dataclasses.replace(config, placement="single", threads_per_device=1,
                             modules_per_device=1, cluster=None,
                             modules_per_worker=1)


def validate(config, num_replicas=1):
  """Checks every field; raises ValueError with a one-line message.

  Only the config is read: checks that need the data (sizes of the splits)
  or the devices are `preflight.validate_for_run`'s.

  Args:
    config: the `Config`.
    num_replicas: data-parallel replicas the batch is split over.
  """
  _check_choices(config)
  _check_numbers(config)
  _check_length(config)
  _check_split(config)
  check_batch(config, num_replicas)
  needs_tpu = runtime_of(config).needs_tpu
  if needs_tpu and not config.devices.tpu:
    fail("tpu", config.devices.tpu, f"placement={config.devices.placement} "
         "needs --tpu (name or grpc://)")
  if needs_tpu and config.devices.jit_compile == "false":
    fail("jit_compile", config.devices.jit_compile,
         f"placement={config.devices.placement} always compiles with XLA "
         "(a TPU runs only XLA programs); use auto or true")
  _check_cluster(config)
  _check_directory("source_dir", config.data.source_dir, may_create=False)
  _check_directory("data_dir", config.data.data_dir, may_create=True)


def jit_compile_value(config):
  """--jit_compile as `InterlockTrainer` takes it: True, False or "auto"."""
  return {"auto": "auto", "true": True,
          "false": False}[config.devices.jit_compile]
