"""Fashion-MNIST ResNet-20, K = 4, 2-wise: the small default (this machine).

No augmentation: a 300-step run (0.64 epochs) learns faster without.

The split (blocks per module) is balanced by measured op time, through
`profiling.balance_blocks` (`partition.balanced_split`, as
`from_keras(balance="time")`): docs/results/balance/fashion_mnist_resnet.json
holds the per-block work and the command that measured it. The FLOP-based
default split, 2, 3, 2, 2 blocks, gave module 2 the most work (about twice
the others' in the study): with those measured block times its slowest
module is 1.48x the mean, against 1.22x for 2, 2, 2, 3, which moves a
cheap 7x7 block into module 4 (the 28x28 blocks cost more per FLOP). The
studies in docs/results/ ran with the FLOP-based split.
"""

from train import config as config_lib


def get_config():
  return config_lib.Config(
      model="resnet", resnet_preset="resnet20", aux_head="pool",
      dataset="fashion_mnist", strategy="2wise", num_modules=4,
      placement="simulated", optimizer="sgd", learning_rate=0.1,
      momentum=0.9, weight_decay=2e-4, lr_schedule="cosine", warmup_steps=20,
      batch_size=128, train_steps=300, steps_per_loop=10, eval_every_steps=100,
      eval_batches=None, checkpoint_every_steps=100, augment=False,
      split=(2, 2, 2, 3))
