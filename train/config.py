"""The training configuration: one flat dataclass, presets, validation.

Every field can be set by a preset (`train/presets/*.py`) and overridden by
a flag of the same name (`train/train.py`). `validate` checks every field
before anything is written, and each failure is one line that names the
field, the value and what is allowed.
"""

import dataclasses
import importlib
import json
import math
import os
from typing import Optional, Tuple

import tensorflow as tf

from layers import resnet
from tf_interlock import cluster as cluster_lib
from tf_interlock import placement as placement_lib
from tf_interlock import strategy as strategy_lib

MODELS = ("resnet", "transformer", "mlp")
IMAGE_DATASETS = ("fashion_mnist", "cifar10", "cifar100", "imagenet2012")
TEXT_DATASETS = ("fortunes", "lm1b", "text_files")
SYNTHETIC = ("synthetic",)
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "step", "cosine")
# The built-in placements; --placement also takes any name a user registered
# (`placement.register`) before the run.
PLACEMENTS = placement_lib.KINDS
PRECISIONS = ("float32", "bfloat16")
JIT_COMPILE = ("auto", "true", "false")
NAN_POLICIES = ("stop", "skip")
VOCAB_KINDS = ("wordpiece", "char")
AUX_HEADS = ("authors", "pool", "none")
# One training loop is one tf.function (autograph off) that unrolls
# steps_per_loop steps, each calling next() on the dataset iterator. TF
# counts those calls in each trace and above 32 raises "An unusually high
# number of `tf.data.Iterator.get_next()` calls" (GET_NEXT_CALL_ERROR_
# THRESHOLD in tensorflow/python/data/ops/iterator_ops.py; measured: 32
# traces, 33 fails; a shorter last loop is a new trace, counted afresh).
MAX_GET_NEXT_CALLS = 32
# The MLP has no fixed depth, so K is bounded here. Each module adds its
# forward, VJPs and update to every traced step, and the export traces one
# signature per exit, K(K+1)/2 module calls in all; TF's graph optimizer
# grows faster than linearly with that. Measured (synthetic_mlp, one step,
# 2 cores shared by ~30 runnable processes): K=8 135 s, 32 294 s, 64 844 s
# from start to exit; K=1000 ran over 15 minutes at 11 GB inside the
# optimizer, where no signal is handled until it returns.
MAX_MLP_MODULES = 64
PRESETS = ("fashion_mnist_resnet", "fortunes_lm", "fortunes_lm_paper_shape",
           "cifar10_resnet", "cifar100_resnet", "lm1b_transformer",
           "synthetic_mlp")


MAX_TRAIN_STEPS = 10**12


def _field(default, help_text):
  """A `Config` field: its default and the one-line help of its flag.

  The help is stored once, here, and `train/flags_lib.py` gives it to the
  flag of the same name, so the two cannot drift apart.
  """
  return dataclasses.field(default=default, metadata={"help": help_text})


def field_help(name):
  """The one-line help of `Config` field `name` (its flag's help)."""
  text = _FIELDS[name].metadata.get("help")
  if not text:
    raise TypeError(f"Config.{name} has no help: declare it with "
                    f"_field(default, help). Received: name={name!r}")
  return text


def _one_of(choices):
  return "one of " + ", ".join(choices)


@dataclasses.dataclass
class Config:
  """Everything one training run needs; each field's help is its flag's."""
  # Model.
  model: str = _field("resnet", f"Network to train: {_one_of(MODELS)} "
                      "(transformer needs a text dataset).")
  resnet_preset: str = _field(
      "resnet20", "model=resnet: depth and stem, one of resnet20/32/56/110 "
      "(CIFAR) or resnet18/34/50/101 (ImageNet).")
  resnet_width: float = _field(
      1.0, "model=resnet: multiplier (> 0) of every stage's channel count; "
      "1 is the published width.")
  aux_head: str = _field(
      "authors", f"Aux head A_k of modules 1..K-1: {_one_of(AUX_HEADS)} "
      "(authors: conv 128 -> conv 64 -> pool -> dense; pool: pool -> "
      "dense).")
  split: Optional[Tuple[int, ...]] = _field(
      None, "Comma-separated block counts per module, K positive counts "
      "adding up to the network's blocks (model=mlp: hidden layers per "
      "module); none: balanced (mlp: 1 each).")
  vocab_kind: str = _field(
      "wordpiece", f"Text datasets: tokenizer, {_one_of(VOCAB_KINDS)} "
      "(the vocabulary is learnt from the training split).")
  vocab_size: int = _field(
      4000, "Text datasets: tokens in the vocabulary (>= 1), including the "
      "reserved ones.")
  seq_len: int = _field(64, "model=transformer: tokens per training "
                        "sequence (>= 1); the corpus is cut into windows "
                        "of seq_len + 1 tokens.")
  num_layers: int = _field(4, "model=transformer: Transformer blocks (>= K), "
                           "split between the modules.")
  d_model: int = _field(128, "model=transformer: width of the residual "
                        "stream and token embedding (>= 1).")
  num_heads: int = _field(4, "model=transformer: attention heads per block "
                          "(>= 1).")
  mlp_dim: int = _field(512, "model=transformer: hidden units of each "
                        "block's feed-forward layer (>= 1).")
  mlp_width: int = _field(256, "model=mlp: units of every hidden Dense "
                          "layer (>= 1).")
  # Data.
  dataset: str = _field(
      "fashion_mnist", "Data: " + _one_of(IMAGE_DATASETS + TEXT_DATASETS +
                                          SYNTHETIC) + ".")
  data_dir: Optional[str] = _field(
      None, "TFDS data folder (prepared datasets, text vocabularies); may be "
      "new if its parent is writable; none: TFDS's default.")
  source_dir: Optional[str] = _field(
      None, "Existing folder of raw files: fashion_mnist's four IDX files, "
      "or the text of fortunes/text_files; none: the Debian packages'.")
  augment: bool = _field(True, "Image datasets: random crop and flip of "
                         "training images (true/false).")
  # Strategy and placement.
  strategy: str = _field(
      "2wise", "Interlocking window n: e2e, local (n=1), pairwise (n=2) or "
      "Nwise (2wise, 3wise, ...), optionally suffixed -only or -sum.")
  variant: Optional[str] = _field(
      None, "Nwise gradient of theta_k: only (L_target(k), the released "
      "rule) or sum (L_k + ... + L_target(k)); none: the --strategy suffix, "
      "else only.")
  num_modules: int = _field(4, "K, modules the network is split into "
                            "depthwise (>= 1; at most the network's blocks, "
                            "64 for the mlp).")
  placement: str = _field(
      "single", "Where modules run: single, simulated (K logical CPUs), gpu, "
      "tpu or cluster (module k on a worker of --cluster; "
      "docs/multi_host.md).")
  threads_per_device: int = _field(
      1, "placement=simulated: intra-op threads of each logical CPU device "
      "(>= 0; 0: chosen by the schedule model for this host's cores).")
  modules_per_device: int = _field(
      1, "placement=simulated: modules on each logical CPU device; divides "
      "num_modules (0: chosen by the schedule model).")
  num_microbatches: int = _field(
      1, "Microbatches each replica's batch is cut into per step (>= 1, "
      "GPipe style); must divide the per-replica batch.")
  tpu: Optional[str] = _field(
      None, "placement=tpu: Cloud TPU name or grpc:// address; required "
      "there, none elsewhere.")
  cluster: Optional[str] = _field(
      None, "placement=cluster: comma-separated host:port of every worker "
      "(python -m train.worker), in task order; none: TF_CONFIG's worker "
      "job.")
  modules_per_worker: int = _field(
      1, "placement=cluster: modules on each worker (>= 1); module k runs "
      "on worker k // modules_per_worker.")
  cluster_timeout_s: float = _field(
      60.0, "placement=cluster: seconds (> 0) to wait for every worker to "
      "accept connections before naming the missing ones.")
  mixed_precision: str = _field(
      "float32", f"Compute dtype: {_one_of(PRECISIONS)} (bfloat16: Keras's "
      "mixed_bfloat16 policy, float32 weights).")
  jit_compile: str = _field(
      "auto", f"XLA: {_one_of(JIT_COMPILE)}. auto: on where the modules run "
      "on a GPU or TPU, off on CPU (measured slower there, "
      "docs/results/xla); placement=tpu always compiles (docs/xla.md).")
  # Optimization (each module gets its own optimizer of this kind).
  optimizer: str = _field("sgd", f"Each module's own optimizer: "
                          f"{_one_of(OPTIMIZERS)}.")
  learning_rate: float = _field(
      0.1, "Peak learning rate of every module (> 0), reached after "
      "--warmup_steps.")
  momentum: float = _field(0.9, "optimizer=sgd: momentum, in [0, 1) "
                           "(0: plain SGD).")
  weight_decay: float = _field(
      0.0, "Decoupled weight decay per step (>= 0; 0: none), applied by the "
      "optimizer to every weight.")
  lr_schedule: str = _field(
      "constant", f"Learning rate after warmup: {_one_of(SCHEDULES)} (step "
      "and cosine need --train_steps or --epochs).")
  lr_decay_fractions: Tuple[float, ...] = _field(
      (0.5, 0.75), "lr_schedule=step: comma-separated increasing fractions "
      "of the run, each in (0, 1), where the rate drops.")
  lr_decay_factor: float = _field(
      0.1, "lr_schedule=step: factor (> 0) the rate is multiplied by at "
      "each --lr_decay_fractions point.")
  warmup_steps: int = _field(
      0, "Steps (>= 0, < train_steps) of linear rise from 0 to "
      "--learning_rate before the schedule; 0: none.")
  # Loop.
  batch_size: int = _field(
      128, "Global batch, in examples (text: sequences) per step over all "
      "replicas; divides into replicas x microbatches.")
  train_steps: Optional[int] = _field(
      300, "Train this many steps (>= 1); replaces the preset's --epochs "
      "(giving both flags is an error).")
  epochs: Optional[float] = _field(
      None, "Train this many passes (> 0, may be fractional) over the "
      "training split; replaces the preset's --train_steps.")
  time_budget_s: Optional[float] = _field(
      None, "Stop after this many seconds (> 0) of training, checkpointing "
      "first; none: no time limit.")
  steps_per_loop: int = _field(
      10, f"Steps run in one traced tf.function call, 1 to "
      f"{MAX_GET_NEXT_CALLS} (TF's get_next limit; any >= 1 on a TPU).")
  eval_every_steps: int = _field(
      100, "Evaluate every exit on the eval split every this many steps "
      "(>= 1), and at the end.")
  eval_batches: Optional[int] = _field(
      None, "Batches (>= 1) of the eval split per evaluation; none: the "
      "whole split.")
  checkpoint_every_steps: int = _field(
      100, "Save a checkpoint every this many steps (>= 1), and at the end.")
  keep_checkpoints: int = _field(
      3, "Newest checkpoints kept in model_dir/checkpoints (>= 1); older "
      "ones are deleted.")
  on_nan: str = _field(
      "stop", "On a non-finite loss: stop (exit non-zero) or skip (roll "
      "back to the last good state, move on).")
  seed: int = _field(0, "Seed of initialisation, shuffling and augmentation,"
                     " 0 to 2**32 - 1.")
  deterministic: bool = _field(
      False, "true: TF's op determinism (bitwise repeatable runs, slower); "
      "false: TF's fastest kernels.")
  # Output.
  model_dir: Optional[str] = _field(
      None, "Run directory, local or gs://..., required by train.train: "
      "config, checkpoints, logs, export; rerunning resumes it.")
  export_dir: Optional[str] = _field(
      None, "Where the SavedModel goes at the end; none: "
      "model_dir/export.")
  resume_from: Optional[str] = _field(
      None, "Resume from this complete checkpoint ckpt-N of "
      "model_dir/checkpoints, e.g. when checkpoints/checkpoint is damaged.")

  def to_json(self):
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @property
  def is_text(self):
    return self.dataset in TEXT_DATASETS


_FIELDS = {field.name: field for field in dataclasses.fields(Config)}


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
  check_choice("placement", config.placement, placement_lib.names())
  return placement_lib.get(config.placement)


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
  if config.model == "transformer":
    return config.num_layers
  if config.model == "resnet":
    key = config.resnet_preset.lower().replace("-", "").replace("_", "")
    if key not in resnet.PRESETS:
      fail("resnet_preset", config.resnet_preset,
           f"must be one of {sorted(resnet.PRESETS)}")
    return sum(resnet.PRESETS[key][2])
  return None


def _network(config):
  return (config.resnet_preset if config.model == "resnet" else
          f"{config.model}")


def check_batch(config, num_replicas):
  """Refuses a batch that does not divide into replicas x microbatches."""
  per_replica = config.batch_size / num_replicas
  if per_replica != int(per_replica) or (
      int(per_replica) % config.num_microbatches):
    fail("batch_size", config.batch_size,
         f"must divide into {num_replicas} replicas x "
         f"{config.num_microbatches} microbatches")


def _check_choices(config):
  for field, allowed in (("model", MODELS), ("optimizer", OPTIMIZERS),
                         ("lr_schedule", SCHEDULES),
                         ("placement", placement_lib.names()),
                         ("mixed_precision", PRECISIONS),
                         ("jit_compile", JIT_COMPILE),
                         ("on_nan", NAN_POLICIES),
                         ("vocab_kind", VOCAB_KINDS),
                         ("aux_head", AUX_HEADS),
                         ("dataset",
                          IMAGE_DATASETS + TEXT_DATASETS + SYNTHETIC)):
    check_choice(field, getattr(config, field), allowed)
  if config.variant is not None:
    check_choice("variant", config.variant, strategy_lib.VARIANTS)
  try:
    strategy_lib.parse_strategy(config.strategy, config.variant)
  except ValueError as e:
    fail("strategy", config.strategy, str(e).split(". Received")[0])
  if config.model == "transformer" and not config.is_text:
    fail("dataset", config.dataset, "model=transformer needs a text "
         f"dataset {TEXT_DATASETS}")
  if config.model != "transformer" and config.is_text:
    fail("model", config.model, f"dataset={config.dataset} needs "
         "model=transformer")


def _check_numbers(config):
  for name in ("num_modules", "batch_size", "steps_per_loop",
               "num_microbatches", "eval_every_steps",
               "checkpoint_every_steps", "keep_checkpoints", "seq_len",
               "num_layers", "d_model", "num_heads", "mlp_dim", "mlp_width",
               "vocab_size"):
    check_positive(name, getattr(config, name), integer=True)
  check_positive("eval_batches", config.eval_batches, integer=True,
                 allow_none=True)
  # A step count must fit the int64 step variable, and one beyond any run's
  # reach is a typo (about 30 years at 1000 steps/s).
  check_number("train_steps", config.train_steps, minimum=1,
               maximum=MAX_TRAIN_STEPS, integer=True, allow_none=True)
  for name in ("epochs", "time_budget_s"):
    check_positive(name, getattr(config, name), allow_none=True)
  check_positive("learning_rate", config.learning_rate)
  placement = placement_of(config)
  if placement.loop_on_host:  # TPUStrategy's iterator is not counted
    check_number("steps_per_loop", config.steps_per_loop, minimum=1,
                 maximum=MAX_GET_NEXT_CALLS, integer=True)
  for name in ("threads_per_device", "modules_per_device"):
    value = getattr(config, name)
    check_number(name, value, minimum=0, integer=True)
    if value != 1 and not placement.splits_host_cpu:
      fail(name, value, f"applies only to placement=simulated (placement="
           f"{config.placement} uses the devices as they are); leave it 1")
  if config.modules_per_device and (
      config.num_modules % config.modules_per_device):
    fail("modules_per_device", config.modules_per_device,
         f"must divide num_modules={config.num_modules} (or be 0: chosen)")
  check_positive("resnet_width", config.resnet_width)
  check_positive("lr_decay_factor", config.lr_decay_factor)
  check_number("warmup_steps", config.warmup_steps, minimum=0, integer=True)
  check_number("weight_decay", config.weight_decay, minimum=0)
  # momentum 1 would never forget a gradient: the velocity grows unbounded.
  check_number("momentum", config.momentum, minimum=0, below=1)
  # numpy's seed (keras.utils.set_random_seed) takes 0 <= seed < 2**32.
  check_number("seed", config.seed, minimum=0, maximum=2**32 - 1,
               integer=True)
  fractions = config.lr_decay_fractions
  if any(not 0 < f < 1 for f in fractions) or list(fractions) != sorted(
      fractions):
    fail("lr_decay_fractions", ",".join(map(str, fractions)),
         "must be increasing fractions of the run, each in (0, 1)")


def _check_length(config):
  """train_steps, epochs and time_budget_s: what bounds the run."""
  if config.train_steps is not None and config.epochs is not None:
    fail("epochs", config.epochs, f"give --epochs or --train_steps, not "
         f"both (train_steps={config.train_steps})")
  if config.train_steps is None and config.epochs is None and (
      config.time_budget_s is None):
    fail("train_steps", None, "set train_steps, epochs or time_budget_s")
  if config.lr_schedule != "constant" and config.train_steps is None and (
      config.epochs is None):
    fail("lr_schedule", config.lr_schedule, "a decaying schedule needs "
         "--train_steps or --epochs (a time budget alone gives no length)")
  if config.train_steps is not None and (
      config.warmup_steps >= config.train_steps):
    fail("warmup_steps", config.warmup_steps,
         f"must be < train_steps={config.train_steps}")


def _check_split(config):
  blocks = num_blocks(config)
  if blocks is None and config.num_modules > MAX_MLP_MODULES:
    fail("num_modules", config.num_modules,
         f"the mlp takes at most {MAX_MLP_MODULES} modules: TF's graph "
         "optimizer needs minutes for the traced steps and the export of "
         "more (they grow faster than K)")
  if blocks is not None and config.num_modules > blocks:
    fail("num_modules", config.num_modules,
         f"at most {blocks} modules: the {_network(config)} has {blocks} "
         "blocks")
  if config.split is None:
    return
  if blocks is None:  # the MLP: any positive number of layers per module
    if len(config.split) != config.num_modules or min(config.split) < 1:
      fail("split", ",".join(map(str, config.split)),
           f"needs {config.num_modules} positive counts of hidden layers, "
           "one per module of the mlp")
  elif (len(config.split) != config.num_modules or min(config.split) < 1 or
        sum(config.split) != blocks):
    fail("split", ",".join(map(str, config.split)),
         f"needs {config.num_modules} positive block counts adding up to "
         f"the {blocks} blocks of the {_network(config)}")


def _check_cluster(config):
  """--cluster (or TF_CONFIG) and --modules_per_worker of placement=cluster."""
  check_positive("modules_per_worker", config.modules_per_worker,
                 integer=True)
  check_positive("cluster_timeout_s", config.cluster_timeout_s)
  if not placement_of(config).needs_cluster:
    for name, unset in (("cluster", None), ("modules_per_worker", 1)):
      if getattr(config, name) != unset:
        fail(name, getattr(config, name), "applies only to "
             f"placement=cluster (placement={config.placement})")
    return
  try:
    workers = cluster_lib.cluster_spec(config.cluster).num_tasks(
        cluster_lib.JOB)
  except ValueError as e:
    fail("cluster", config.cluster, str(e).rsplit(". Received:", 1)[0])
  try:
    cluster_lib.module_workers(config.num_modules, workers,
                               config.modules_per_worker)
  except ValueError as e:
    fail("modules_per_worker", config.modules_per_worker,
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
  placement = placement_of(config)
  if placement.needs_tpu and not config.tpu:
    fail("tpu", config.tpu, f"placement={config.placement} needs --tpu "
         "(name or grpc://)")
  if placement.always_xla and config.jit_compile == "false":
    fail("jit_compile", config.jit_compile, f"placement={config.placement} "
         "always compiles with XLA (a TPU runs only XLA programs); use auto "
         "or true")
  _check_cluster(config)
  _check_directory("source_dir", config.source_dir, may_create=False)
  _check_directory("data_dir", config.data_dir, may_create=True)


def jit_compile_value(config):
  """--jit_compile as `InterlockTrainer` takes it: True, False or "auto"."""
  return {"auto": "auto", "true": True, "false": False}[config.jit_compile]
