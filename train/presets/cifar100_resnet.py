"""The paper's CIFAR-100 setup: the CIFAR-10 preset on CIFAR-100."""

import dataclasses

from train.presets import cifar10_resnet


def get_config():
  return dataclasses.replace(cifar10_resnet.get_config(), dataset="cifar100")
