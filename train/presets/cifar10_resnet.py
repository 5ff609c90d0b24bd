"""The paper's CIFAR-10 setup: ResNet, K = 4, SGD momentum 0.9, weight
decay 2e-4, LR 0.1 with step decay (Gomez et al., 2022, Sec. 5.1)."""

from train import config as config_lib


def get_config():
  return config_lib.Config(
      model="resnet", resnet_preset="resnet110", aux_head="authors",
      dataset="cifar10", strategy="2wise", num_modules=4, placement="tpu",
      optimizer="sgd", learning_rate=0.1, momentum=0.9, weight_decay=2e-4,
      lr_schedule="step", lr_decay_fractions=(0.5, 0.75), lr_decay_factor=0.1,
      batch_size=128, train_steps=None, epochs=200, steps_per_loop=100,
      eval_every_steps=1000, checkpoint_every_steps=1000)
