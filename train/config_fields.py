"""The fields of the training configuration, grouped by concern.

`Config` holds one small frozen dataclass per concern: the network
(`config.network`), the data (`config.data`), the interlocking strategy
(`config.interlock`), the placement on devices (`config.devices`), the
optimizers (`config.optim`) and the run's loop and folders (`config.run`).
Every field is declared once, with the help of its flag; flags, presets
and config.json name fields flat (`num_modules`), and a flat name is unique
across the groups, so `GROUP_OF` says where each one lives.
"""

import dataclasses
import json
from typing import Optional, Tuple

from layers import aux_heads
from tf_interlock import placement as placement_lib

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
MAX_TRAIN_STEPS = 10**12



def _field(default, help_text):
  """A `Config` field: its default and the one-line help of its flag.

  The help is stored once, here, and `train/flags_lib.py` gives it to the
  flag of the same name, so the two cannot drift apart.
  """
  return dataclasses.field(default=default, metadata={"help": help_text})


def _one_of(choices):
  return "one of " + ", ".join(choices)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The network: its kind, depth and widths."""
  model: str = _field("resnet", f"Network to train: {_one_of(MODELS)} "
                      "(transformer needs a text dataset).")
  resnet_preset: str = _field(
      "resnet20", "model=resnet: depth and stem, one of resnet20/32/56/110 "
      "(CIFAR) or resnet18/34/50/101 (ImageNet).")
  resnet_width: float = _field(
      1.0, "model=resnet: multiplier (> 0) of every stage's channel count; "
      "1 is the published width.")
  aux_head: str = _field(
      "auto", f"Aux head A_k of modules 1..K-1 (every model, and "
      f"research.compare --model_fn): 'auto' (the network's own: authors "
      f"for the ResNet, linear for the MLP and the Transformer) or one of: "
      f"{aux_heads.describe()}.")
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


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The data set, where it is read from, and its tokenizer."""
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
  vocab_kind: str = _field(
      "wordpiece", f"Text datasets: tokenizer, {_one_of(VOCAB_KINDS)} "
      "(the vocabulary is learnt from the training split).")
  vocab_size: int = _field(
      4000, "Text datasets: tokens in the vocabulary (>= 1), including the "
      "reserved ones.")


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
  """Interlocking: the window, K modules, their split, microbatches."""
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
  split: Optional[Tuple[int, ...]] = _field(
      None, "Comma-separated block counts per module, K positive counts "
      "adding up to the network's blocks (model=mlp: hidden layers per "
      "module); none: balanced (mlp: 1 each).")
  num_microbatches: int = _field(
      1, "Microbatches each replica's batch is cut into per step (>= 1, "
      "GPipe style); must divide the per-replica batch.")


@dataclasses.dataclass(frozen=True)
class PlacementConfig:
  """Where and how the modules run: devices, workers, dtype, XLA."""
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


@dataclasses.dataclass(frozen=True)
class OptimizationConfig:
  """Each module's own optimizer (all of one kind) and its schedule."""
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


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The loop: batch, length, evaluation, checkpoints, seed, folders."""
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
  profile_steps: Optional[Tuple[int, ...]] = _field(
      None, "FIRST,LAST (1 <= FIRST <= LAST <= the run's steps): record a "
      "TensorBoard profiler trace of these steps in model_dir/train/plugins/"
      "profile, widened to whole loops of --steps_per_loop; none: no trace.")
  steps_per_loop: int = _field(
      10, f"Steps run in one traced tf.function call, 1 to "
      f"{MAX_GET_NEXT_CALLS} (TF's get_next limit; any >= 1 on a TPU).")
  loop_block: int = _field(
      0, "0: the library's loop (local learning as a pipeline on CPUs, "
      "module k on step t - k; n-wise with n < K: steps unrolled, in "
      "blocks where they would write out more than 256 weight-steps; one "
      "step looped otherwise); U in 1..steps_per_loop: a graph loop over "
      "blocks of U steps, which traces U steps (a faster first call) and "
      "overlaps modules within a block only.")
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
  model_dir: Optional[str] = _field(
      None, "Run directory, local or gs://..., required by train.train: "
      "config, checkpoints, logs, export; rerunning resumes it.")
  export_dir: Optional[str] = _field(
      None, "Where the SavedModel goes at the end; none: "
      "model_dir/export.")
  resume_from: Optional[str] = _field(
      None, "Resume from this complete checkpoint ckpt-N of "
      "model_dir/checkpoints, e.g. when checkpoints/checkpoint is damaged.")


# Each group's attribute in `Config`, in declaration order. None is also a
# field's name (there are fields `model`, `strategy` and `placement`), so
# `Config(**kwargs)` can tell a group from a flat field.
GROUPS = (("network", ModelConfig), ("data", DataConfig),
          ("interlock", StrategyConfig), ("devices", PlacementConfig),
          ("optim", OptimizationConfig), ("run", RunConfig))
# Flat field name (= flag name) -> the attribute of its group.
GROUP_OF = {field.name: group for group, kind in GROUPS
            for field in dataclasses.fields(kind)}
_FIELDS = {field.name: field for _, kind in GROUPS
           for field in dataclasses.fields(kind)}


@dataclasses.dataclass(frozen=True, init=False)
class Config:
  """Everything one training run needs, one frozen group per concern.

  `Config(...)` takes whole groups (`network=ModelConfig(...)`), flat
  fields (`num_modules=8`, as presets and config.json give them), or both:
  a flat field replaces that field of its group. So
  `dataclasses.replace(config, num_modules=8)` works too.
  """
  network: ModelConfig
  data: DataConfig
  interlock: StrategyConfig
  devices: PlacementConfig
  optim: OptimizationConfig
  run: RunConfig

  def __init__(self, **fields):
    unknown = sorted(set(fields) - set(GROUP_OF) - {g for g, _ in GROUPS})
    if unknown:
      raise TypeError(f"Config has no fields {unknown}. Received: "
                      f"fields={unknown}")
    for group, kind in GROUPS:
      value = fields.get(group)
      if value is None:
        value = kind()
      elif not isinstance(value, kind):
        raise TypeError(f"Config.{group} must be a {kind.__name__}. "
                        f"Received: {group}={value!r}")
      changes = {name: v for name, v in fields.items()
                 if GROUP_OF.get(name) == group}
      if changes:
        value = dataclasses.replace(value, **changes)
      object.__setattr__(self, group, value)

  def get(self, name):
    """The value of flat field `name` (a flag's name), from its group."""
    if name not in GROUP_OF:
      raise AttributeError(f"Config has no field {name!r}. Received: "
                           f"name={name!r}")
    return getattr(getattr(self, GROUP_OF[name]), name)

  @classmethod
  def flat_fields(cls):
    """The `dataclasses.Field` of every flat field, in declaration order."""
    return tuple(_FIELDS.values())

  def flat(self):
    """{flat field name: value} of every field, as flags name them."""
    return {name: self.get(name) for name in _FIELDS}

  def to_json(self):
    """config.json's text: the flat fields (the layout runs always had)."""
    return json.dumps(self.flat(), indent=2, sort_keys=True)

  @property
  def is_text(self):
    return self.data.dataset in TEXT_DATASETS


def flat_fields():
  """The `dataclasses.Field` of every flat field, in declaration order."""
  return Config.flat_fields()


def field_help(name):
  """The one-line help of field `name` (its flag's help)."""
  text = _FIELDS[name].metadata.get("help")
  if not text:
    raise TypeError(f"Config.{name} has no help: declare it with "
                    f"_field(default, help). Received: name={name!r}")
  return text


def flat(config):
  """`config` as {flat field name: value} (config.json's layout)."""
  return config.flat()


def from_flat(fields):
  """The `Config` of {flat field name: value}; others keep defaults."""
  return Config(**fields)
