"""Builds what a run needs from a `Config`: runtime, strategy, data, model.

Small top-level functions, each one concept, used by the train, export,
evaluate and compare binaries.
"""

import dataclasses
import functools
import os
import threading
from typing import Any, Optional

import keras
import numpy as np
import tensorflow as tf

from layers import resnet
from layers import transformer
from layers.interlock_module import InterlockModule
from tf_interlock import cluster as cluster_lib
from tf_interlock import placement as placement_lib
from tf_interlock import strategy as strategy_lib
from tf_interlock import threading_plan
from tf_interlock.data import images
from tf_interlock.data import text
from train import config as config_lib
from train import multi_worker

SYNTHETIC_DIM = 32
SYNTHETIC_CLASSES = 10
# Examples per split of the synthetic dataset.
SYNTHETIC_SIZES = {"train": 4096, "eval": 1024}
# Seconds the Cloud TPU name may take to resolve before the run gives up.
TPU_RESOLVE_TIMEOUT_S = 300


@dataclasses.dataclass
class Task:
  """What the data looks like: enough to build the model and its loss."""
  kind: str  # "classification" or "lm"
  num_classes: int
  input_shape: tuple
  input_dtype: Any
  train: Optional[tf.data.Dataset]
  eval: tf.data.Dataset
  unigram_perplexity: Optional[float] = None
  train_size: Optional[int] = None  # examples (text: packed sequences)


def simulated_plan(config):
  """The `ThreadingPlan` of a simulated placement: logical devices, threads
  per op, and which device each module is on.

  A field set to 0 is chosen by the schedule model from nominal module costs
  for this host's cores (`threading_plan.plan_for`); the default, 1 and 1,
  is one device of one thread per module.
  """
  return threading_plan.plan_for(
      config.num_modules,
      strategy_lib.parse_strategy(config.strategy, config.variant),
      threading_plan.host_cores(),
      threads_per_device=config.threads_per_device or None,
      modules_per_device=config.modules_per_device or None)


def setup_runtime(config):
  """Process-wide settings; must run before the first TF op.

  A task of a multi-worker job (TF_CONFIG, see train/multi_worker.py) joins
  it first: collective ops must be configured before the runtime starts.
  """
  plan = simulated_plan(config) if config.placement == "simulated" else None
  joined = multi_worker.join(config, plan.threads_per_device if plan else 1)
  if plan and not joined:
    placement_lib.configure_simulated_devices(
        plan.num_devices, intra_op_threads=plan.threads_per_device)
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  keras.utils.set_random_seed(config.seed)
  keras.mixed_precision.set_global_policy(
      "mixed_bfloat16" if config.mixed_precision == "bfloat16" else "float32")


def num_replicas(config):
  """Data-parallel replicas the global batch is split over.

  Known before the runtime starts except on a TPU, whose replica count
  (cores / K) is known once connected: None there, and `make_distribute`
  checks the batch then, still before anything is written.
  """
  if config.placement == "tpu":
    return None
  gpus = tf.config.list_physical_devices("GPU")
  if multi_worker.mode(config) == "replicas":
    return multi_worker.num_tasks()
  if multi_worker.mode(config) == "mirrored":
    return multi_worker.num_tasks() * max(1, len(gpus))
  # make_distribute mirrors a "single" placement over every GPU.
  return len(gpus) if config.placement == "single" and len(gpus) > 1 else 1


def _unreachable(config, error):
  first = (str(error).strip().splitlines() or [""])[0][:200]
  config_lib.fail("tpu", config.tpu, f"cannot reach the TPU "
                  f"({type(error).__name__}: {first})")


@functools.lru_cache(maxsize=2)
def _resolver(tpu):
  """TPUClusterResolver(tpu) or the exception it raised; None on timeout.

  The lookup asks the Cloud TPU API, which can hang without a network: it
  runs in a daemon thread that the process may leave behind. Cached, so the
  early check of `validate_for_run` and `make_distribute` resolve once.
  """
  result = {}

  def resolve():
    try:
      result["resolver"] = tf.distribute.cluster_resolver.TPUClusterResolver(
          tpu=tpu)
    except Exception as e:  # pylint: disable=broad-except
      result["error"] = e

  thread = threading.Thread(target=resolve, daemon=True)
  thread.start()
  thread.join(TPU_RESOLVE_TIMEOUT_S)
  return result.get("resolver", result.get("error"))


def resolve_tpu(config):
  """The TPUClusterResolver of --tpu.

  Raises:
    ValueError: one line naming --tpu when the name does not resolve
      within TPU_RESOLVE_TIMEOUT_S.
  """
  resolver = _resolver(config.tpu)
  if resolver is None:
    config_lib.fail("tpu", config.tpu, f"the TPU did not resolve within "
                    f"{TPU_RESOLVE_TIMEOUT_S} s; check the name or use "
                    "grpc://host:port")
  if isinstance(resolver, Exception):
    _unreachable(config, resolver)
  return resolver


def module_devices(config):
  """Per module, the index of its device: the threading plan's logical CPU
  (placement=simulated), its worker task t(k) (placement=cluster), else
  None (module k on device k)."""
  if config.placement == "simulated":
    return simulated_plan(config).module_devices
  if config.placement == "cluster":
    spec = cluster_lib.cluster_spec(config.cluster)
    return cluster_lib.module_workers(
        config.num_modules, spec.num_tasks(cluster_lib.JOB),
        config.modules_per_worker)
  return None


def connect_cluster(config):
  """placement=cluster: connects this process to the workers.

  Raises:
    ValueError: one line naming the workers that did not come up within
      --cluster_timeout_s.
  """
  spec = cluster_lib.cluster_spec(config.cluster)
  try:
    cluster_lib.connect(spec, config.cluster_timeout_s)
  except ConnectionError as e:
    raise ValueError(str(e)) from None


def cluster_failure(config, error):
  """The one line naming the worker a runtime error came from, or None."""
  if config.placement != "cluster":
    return None
  return cluster_lib.describe_failure(
      error, cluster_lib.cluster_spec(config.cluster))


def make_distribute(config):
  """TPUStrategy (with K cores per replica), Mirrored on GPUs, or default.

  placement=cluster connects to the workers first (bounded wait) and runs
  under the default strategy: the modules, not replicas, are distributed.

  Raises:
    ValueError: one line naming --tpu when the TPU cannot be reached, or
      --batch_size when it does not divide over the TPU's replicas, or the
      workers of --cluster that did not come up.
  """
  if config.placement == "cluster":
    connect_cluster(config)
    return tf.distribute.get_strategy()
  if config.placement == "tpu":
    resolver = resolve_tpu(config)
    try:
      tf.config.experimental_connect_to_cluster(resolver)
      topology = tf.tpu.experimental.initialize_tpu_system(resolver)
    except (OSError, RuntimeError, ValueError, tf.errors.OpError) as e:
      _unreachable(config, e)
    assignment = placement_lib.tpu_device_assignment(topology,
                                                     config.num_modules)
    distribute = tf.distribute.TPUStrategy(
        resolver, experimental_device_assignment=assignment)
    config_lib.check_batch(config, distribute.num_replicas_in_sync)
    return distribute
  if multi_worker.mode(config) == "mirrored":
    return multi_worker.join(config)[2]
  gpus = tf.config.list_logical_devices("GPU")
  if config.placement == "single" and len(gpus) > 1:
    return tf.distribute.MirroredStrategy()
  return tf.distribute.get_strategy()


def _synthetic(config, training):
  """Gaussian clusters: learnable, generated, no files."""
  rng = np.random.default_rng(1234)
  centers = rng.normal(size=(SYNTHETIC_CLASSES, SYNTHETIC_DIM))
  count = SYNTHETIC_SIZES["train" if training else "eval"]
  labels = rng.integers(0, SYNTHETIC_CLASSES, size=count)
  x = centers[labels] + rng.normal(size=(count, SYNTHETIC_DIM)) * 1.5
  ds = tf.data.Dataset.from_tensor_slices(
      (x.astype("float32"), labels.astype("int32")))
  if training:
    ds = ds.shuffle(count, seed=config.seed).repeat()
  return ds.batch(config.batch_size, drop_remainder=True)


@functools.lru_cache(maxsize=4)
def _text_data(dataset, data_dir, source_dir, vocab_kind, vocab_size):
  """(corpus, vocabulary), built once per process: validation and
  make_task share them, and with them the token counts `text` caches."""
  if dataset == "lm1b":
    corpus = text.TextCorpus(source="lm1b", data_dir=data_dir)
  else:
    corpus = text.TextCorpus(paths=source_dir or text.DEFAULT_TEXT_DIR)
  vocab = text.get_vocabulary(
      corpus, kind=vocab_kind, vocab_size=vocab_size,
      cache_dir=os.path.join(data_dir, "vocab") if data_dir else None)
  return corpus, vocab


def _text(config):
  return _text_data(config.dataset, config.data_dir, config.source_dir,
                    config.vocab_kind, config.vocab_size)


def split_sizes(config):
  """(train, eval) examples of the dataset; packed sequences for text.

  Synthetic and image sizes are static; text sizes count the tokens of
  each split, so the corpus is read and its vocabulary learnt (or loaded).
  """
  if config.dataset == "synthetic":
    return SYNTHETIC_SIZES["train"], SYNTHETIC_SIZES["eval"]
  if config.is_text:
    corpus, vocab = _text(config)
    # lm_dataset packs the token stream (EOS after each document) into
    # windows of seq_len + 1 tokens.
    return tuple(
        text.num_tokens(corpus, vocab, split) // (config.seq_len + 1)
        for split in text.SPLITS)
  info = images.dataset_info(config.dataset)
  return info.splits["train"], info.splits[info.eval_split]


def make_task(config, with_train=True):
  """Train and eval datasets (global batches) and the task's shape.

  Args:
    config: the `Config`.
    with_train: False leaves `Task.train` None (evaluation and export need
      no shuffled, repeated training pipeline).
  """
  train_size, _ = split_sizes(config)
  if config.dataset == "synthetic":
    return Task("classification", SYNTHETIC_CLASSES, (SYNTHETIC_DIM,),
                tf.float32, _synthetic(config, True) if with_train else None,
                _synthetic(config, False), train_size=train_size)
  if config.is_text:
    corpus, vocab = _text(config)
    common = dict(batch_size=config.batch_size, seq_len=config.seq_len,
                  seed=config.seed, deterministic=config.deterministic)
    return Task(
        "lm", vocab.size, (config.seq_len,), tf.int32,
        text.lm_dataset(corpus, vocab, "train", training=True, **common)
        if with_train else None,
        text.lm_dataset(corpus, vocab, "validation", training=False,
                        **common),
        unigram_perplexity=text.unigram_perplexity(corpus, vocab),
        train_size=train_size)
  info = images.dataset_info(config.dataset)
  common = dict(batch_size=config.batch_size, data_dir=config.data_dir,
                source_dir=config.source_dir, seed=config.seed,
                deterministic=config.deterministic)
  return Task(
      "classification", info.num_classes, info.image_shape, tf.float32,
      images.image_dataset(config.dataset, "train", training=True,
                           augment=config.augment, **common)
      if with_train else None,
      images.image_dataset(config.dataset, info.eval_split,
                           training=False, **common),
      train_size=train_size)


def make_modules(config, task):
  """The network as K InterlockModules (unbuilt)."""
  if config.model == "resnet":
    return resnet.resnet_modules(
        config.resnet_preset, task.num_classes, config.num_modules,
        split=list(config.split) if config.split else None,
        input_shape=task.input_shape, width=config.resnet_width,
        aux_head=None if config.aux_head == "none" else config.aux_head)
  if config.model == "transformer":
    return transformer.transformer_lm_modules(
        task.num_classes, config.seq_len, config.num_layers, config.d_model,
        config.num_heads, config.mlp_dim, config.num_modules,
        split=list(config.split) if config.split else None)
  # The MLP's split counts the hidden Dense layers of each module.
  split = config.split or (1,) * config.num_modules
  modules = []
  for k, layers in enumerate(split):
    last = k == config.num_modules - 1
    body = [keras.layers.Dense(config.mlp_width, activation="relu")
            for _ in range(layers)]
    if last:
      body.append(keras.layers.Dense(task.num_classes))
    head = None if last else keras.layers.Dense(task.num_classes)
    modules.append(InterlockModule(body, aux_head=head, name=f"mlp{k + 1}"))
  return modules


def total_steps(config, train_size=None):
  """Training steps of the run (None when only a time budget bounds it).

  Args:
    config: the `Config`.
    train_size: examples (text: packed sequences) of the training split;
      None computes it (`split_sizes`).

  Raises:
    ValueError: naming --epochs when it gives less than one step.
  """
  if config.train_steps is not None:
    return config.train_steps
  if config.epochs is None:
    return None
  if train_size is None:
    train_size, _ = split_sizes(config)
  steps = int(config.epochs * train_size // config.batch_size)
  if steps < 1:
    config_lib.fail("epochs", config.epochs,
                    f"gives {steps} steps: {config.epochs} x {train_size} "
                    f"training examples / batch_size {config.batch_size}; "
                    "at least one step is needed")
  return steps


@keras.saving.register_keras_serializable(package="tf_interlock")
class Warmup(keras.optimizers.schedules.LearningRateSchedule):
  """Linear warmup from 0 to `target`, then `after` (a schedule or a float)
  evaluated from 0 again: lr(t) = target * t / w for t < w, else
  after(t - w).

  Registered, so that an optimizer using it round-trips through
  `get_config`/`from_config` (the op-cost profiler clones optimizers so).
  """

  def __init__(self, target, warmup_steps, after):
    self.target = target
    self.warmup_steps = warmup_steps
    self.after = after

  def __call__(self, step):
    step = tf.cast(step, tf.float32)
    warmup = tf.cast(self.warmup_steps, tf.float32)
    rest = (self.after(step - warmup) if callable(self.after) else
            tf.constant(self.after, tf.float32))
    return tf.where(step < warmup, self.target * step / warmup, rest)

  def get_config(self):
    after = (keras.optimizers.schedules.serialize(self.after)
             if callable(self.after) else self.after)
    return {"target": self.target, "warmup_steps": self.warmup_steps,
            "after": after}

  @classmethod
  def from_config(cls, config):
    after = config["after"]
    if isinstance(after, dict):
      after = keras.optimizers.schedules.deserialize(after)
    return cls(config["target"], config["warmup_steps"], after)


def learning_rate(config, steps):
  """The LR schedule of every module: warmup, then constant/step/cosine.

  With warmup_steps = w > 0 every schedule starts with w steps rising
  linearly from 0 to learning_rate; the step and cosine decays then run
  over the remaining steps - w steps (a constant stays constant).

  Args:
    config: the `Config`.
    steps: total training steps; None (a time budget alone) only allows the
      constant schedule (`config.validate`).
  """
  base, warmup = config.learning_rate, config.warmup_steps
  decay_steps = None if steps is None else max(1, steps - warmup)
  if config.lr_schedule == "constant" or decay_steps is None:
    schedule = base
  elif config.lr_schedule == "step":
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay(
        [int(f * decay_steps) for f in config.lr_decay_fractions],
        [base * config.lr_decay_factor ** i
         for i in range(len(config.lr_decay_fractions) + 1)])
  else:
    schedule = keras.optimizers.schedules.CosineDecay(base, decay_steps)
  return Warmup(base, warmup, schedule) if warmup else schedule


def validate_for_run(config):
  """Every check a run can make before it writes anything.

  `config.validate` with the replica count of this machine, then (after
  `setup_runtime`, which it calls) the checks that need the data or the
  TPU's name: --tpu resolves, prepared image
  files are whole, the evaluation split holds at least one full
  batch, the training split too (text: a packed batch of batch_size x
  (seq_len + 1) tokens), and --epochs gives at least one step.

  Args:
    config: the `Config` of the run.

  Raises:
    ValueError: one line naming the flag, its value and what is allowed.
  """
  config_lib.validate(config, num_replicas(config) or 1)
  # Counting a corpus's tokens runs TF ops, which start the runtime: the
  # process-wide settings come first (setup_runtime may run again later).
  setup_runtime(config)
  if config.placement == "tpu":
    resolve_tpu(config)
  gpus = len(tf.config.list_physical_devices("GPU"))
  if config.placement == "gpu" and gpus < config.num_modules:
    config_lib.fail("placement", config.placement,
                    f"one GPU per module (placement=gpu): "
                    f"{config.num_modules} modules but {gpus} GPUs")
  if config.dataset in config_lib.IMAGE_DATASETS:
    images.check_prepared_dataset(config.dataset, data_dir=config.data_dir,
                                  source_dir=config.source_dir)
  train_size, eval_size = split_sizes(config)
  unit = "sequences of seq_len + 1 tokens" if config.is_text else "examples"
  for split, size in (("training", train_size), ("evaluation", eval_size)):
    if size < config.batch_size:
      flag = "seq_len" if config.is_text and size else "batch_size"
      config_lib.fail(flag, getattr(config, flag),
                      f"the {split} split of {config.dataset} holds {size} "
                      f"{unit}, fewer than one batch of {config.batch_size}")
  steps = total_steps(config, train_size)
  if steps is not None and config.warmup_steps >= steps:
    config_lib.fail("warmup_steps", config.warmup_steps,
                    f"must be < the run's {steps} steps")


def make_optimizer(config, steps):
  """One module's optimizer (call once per module, inside the scope)."""
  lr = learning_rate(config, steps)
  if config.optimizer == "sgd":
    return keras.optimizers.SGD(lr, momentum=config.momentum,
                                weight_decay=config.weight_decay or None)
  if config.optimizer == "adam":
    return keras.optimizers.Adam(lr, weight_decay=config.weight_decay or None)
  return keras.optimizers.AdamW(lr, weight_decay=config.weight_decay)
