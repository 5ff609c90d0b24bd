"""A random-data MLP, K = 4: smoke tests and the step-time comparison."""

from train import config as config_lib


def get_config():
  return config_lib.Config(
      model="mlp", dataset="synthetic", mlp_width=256, strategy="2wise",
      num_modules=4, placement="single", optimizer="sgd", learning_rate=0.05,
      batch_size=32, train_steps=20, steps_per_loop=5, eval_every_steps=10,
      eval_batches=2, checkpoint_every_steps=10)
