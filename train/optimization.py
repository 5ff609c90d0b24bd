"""Each module's optimizer and learning-rate schedule, and the run's length.

Every module gets an optimizer of its own, all of the same kind and
schedule (`make_optimizer`, called once per module inside the strategy's
scope). The decaying schedules need the run's length in steps
(`total_steps`).
"""

import keras
import tensorflow as tf

from train import config as config_lib
from train import datasets


def total_steps(config, train_size=None):
  """Training steps of the run (None when only a time budget bounds it).

  Args:
    config: the `Config`.
    train_size: examples (text: packed sequences) of the training split;
      None computes it (`datasets.split_sizes`).

  Raises:
    ValueError: naming --epochs when it gives less than one step.
  """
  if config.run.train_steps is not None:
    return config.run.train_steps
  if config.run.epochs is None:
    return None
  if train_size is None:
    train_size, _ = datasets.split_sizes(config)
  steps = int(config.run.epochs * train_size // config.run.batch_size)
  if steps < 1:
    config_lib.fail("epochs", config.run.epochs,
                    f"gives {steps} steps: {config.run.epochs} x {train_size} "
                    f"training examples / batch_size {config.run.batch_size}; "
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
  base, warmup = config.optim.learning_rate, config.optim.warmup_steps
  decay_steps = None if steps is None else max(1, steps - warmup)
  if config.optim.lr_schedule == "constant" or decay_steps is None:
    schedule = base
  elif config.optim.lr_schedule == "step":
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay(
        [int(f * decay_steps) for f in config.optim.lr_decay_fractions],
        [base * config.optim.lr_decay_factor ** i
         for i in range(len(config.optim.lr_decay_fractions) + 1)])
  else:
    schedule = keras.optimizers.schedules.CosineDecay(base, decay_steps)
  return Warmup(base, warmup, schedule) if warmup else schedule


def make_optimizer(config, steps):
  """One module's optimizer (call once per module, inside the scope)."""
  lr = learning_rate(config, steps)
  if config.optim.optimizer == "sgd":
    return keras.optimizers.SGD(lr, momentum=config.optim.momentum,
                                weight_decay=config.optim.weight_decay or None)
  if config.optim.optimizer == "adam":
    return keras.optimizers.Adam(lr, weight_decay=config.optim.weight_decay or None)
  return keras.optimizers.AdamW(lr, weight_decay=config.optim.weight_decay)
