"""Fashion-MNIST ResNet-20, K = 4, 2-wise: the small default (this machine).

No augmentation: a 300-step run (0.64 epochs) learns faster without.
"""

from train import config as config_lib


def get_config():
  return config_lib.Config(
      model="resnet", resnet_preset="resnet20", aux_head="pool",
      dataset="fashion_mnist", strategy="2wise", num_modules=4,
      placement="simulated", optimizer="sgd", learning_rate=0.1,
      momentum=0.9, weight_decay=2e-4, lr_schedule="cosine", warmup_steps=20,
      batch_size=128, train_steps=300, steps_per_loop=10, eval_every_steps=100,
      eval_batches=None, checkpoint_every_steps=100, augment=False)
