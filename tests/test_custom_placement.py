"""A placement defined here, in one class, trains through the trainer and
the train binary.

"reversed" puts module k on logical CPU device K-1-k: the opposite of
"simulated". It is one subclass plus one `register` call, nothing in the
library or the binary names it. Placement changes where the modules run,
not the math: its losses and weights equal "simulated"'s for the same seed,
and every variable sits on the device the class chose.
"""

import json

from absl import flags as absl_flags
import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tf_interlock import placement as placement_lib
from tf_interlock.trainer import InterlockTrainer

K = 4


class ReversedPlacement(placement_lib.SimulatedPlacement):
  """Module k on logical CPU device K-1-k (of the devices it is given)."""

  kind = "reversed"
  # (k, device) of every variable the trainer had this class check.
  checked = []

  @classmethod
  def module_device_indices(cls, num_modules, module_devices=None):
    return super().module_device_indices(num_modules, module_devices)[::-1]

  def check_variables(self, k, variables, hint=""):
    variables = list(variables)
    ReversedPlacement.checked += [
        (k, getattr(v, "value", v).device) for _, v in variables]
    super().check_variables(k, variables, hint)


@pytest.fixture
def reversed_registered():
  placement_lib.register(ReversedPlacement)
  ReversedPlacement.checked = []
  yield
  placement_lib.unregister("reversed")


def _device_index(name):
  spec = tf.DeviceSpec.from_string(name)
  assert spec.device_type.upper() == "CPU", name
  return spec.device_index


def _train(kind, steps=3):
  x, y = helpers.batch(size=8)
  placement = placement_lib.make_placement(kind, K)
  modules = helpers.mlp_modules(K, seed=5)
  trainer = InterlockTrainer(modules, lambda k: keras.optimizers.Adam(0.01),
                             "2wise", loss_fn=helpers.cross_entropy,
                             placement=placement)
  trainer.build(x)
  iterator = iter(trainer.distribute_dataset(helpers.repeat_dataset(x, y)))
  metrics = [trainer.train_loop(iterator) for _ in range(steps)]
  return trainer, metrics


def test_registered_by_name_and_refused_once_gone(reversed_registered):
  assert "reversed" in placement_lib.names()
  assert isinstance(placement_lib.Placement("reversed", ["/cpu:0"]),
                    ReversedPlacement)
  placement_lib.unregister("reversed")
  with pytest.raises(ValueError, match="Received: placement='reversed'"):
    placement_lib.make_placement("reversed", K)
  placement_lib.register(ReversedPlacement)


def test_trainer_puts_module_k_on_device_k_reversed(reversed_registered):
  trainer, metrics = _train("reversed")
  assert [_device_index(d) for d in trainer.placement.devices] == [3, 2, 1, 0]
  for k, module in enumerate(trainer.modules):
    for v in module.weights + trainer.optimizers[k].variables:
      assert _device_index(v.value.device) == K - 1 - k, (k, v.path)
  reference, expected = _train("simulated")
  assert [_device_index(d) for d in reference.placement.devices] == [
      0, 1, 2, 3]
  for got, want in zip(metrics, expected):
    assert got.keys() == want.keys()
    for key in want:
      np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
  for a, b in zip(helpers.weights(trainer.modules),
                  helpers.weights(reference.modules)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def _run_binary(placement, model_dir, capsys):
  """train.train's main in this process (the test's registry is its own):
  the run's summary line."""
  from train import train  # pylint: disable=g-import-not-at-top
  absl_flags.FLAGS.unparse_flags()
  absl_flags.FLAGS([
      "train.train", "--preset=synthetic_mlp", f"--placement={placement}",
      "--train_steps=4", "--steps_per_loop=2", "--eval_every_steps=4",
      "--checkpoint_every_steps=4", "--seed=11", f"--model_dir={model_dir}"])
  capsys.readouterr()
  try:
    train.main(["train.train"])
  finally:
    absl_flags.FLAGS.unparse_flags()
  out, err = capsys.readouterr()
  lines = [line for line in out.splitlines() if line.startswith("{")]
  assert lines, err
  return json.loads(lines[-1])


def test_the_binary_trains_a_registered_placement(reversed_registered,
                                                  tmp_path, capsys):
  got = _run_binary("reversed", tmp_path / "reversed", capsys)
  # The binary built the class: each module's variables were checked, and
  # sit, on device K-1-k.
  modules_checked = {k for k, _ in ReversedPlacement.checked}
  assert modules_checked == set(range(K))
  assert all(_device_index(device) == K - 1 - k
             for k, device in ReversedPlacement.checked)
  want = _run_binary("simulated", tmp_path / "simulated", capsys)
  assert got["step"] == want["step"] == 4
  got, want = _numbers(got["eval"]), _numbers(want["eval"])
  assert got.keys() == want.keys() and any("loss" in key for key in want)
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)


def _numbers(tree, prefix=""):
  """{path: number} of a nested dict of results."""
  if isinstance(tree, dict):
    return {path: value for key, sub in tree.items()
            for path, value in _numbers(sub, f"{prefix}/{key}").items()}
  return {prefix: tree}
