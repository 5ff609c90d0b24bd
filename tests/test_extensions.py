"""Each extension of docs/architecture.md's table, made in a file of its own.

A new aux head kind and a new placement are each written here into a
temporary module (a file under tmp_path, imported and registered as a user
would) and must then work everywhere the doc says, with no list of ours
edited: the registry tests check each entry's behaviour and so take the
new entry too (their per-entry checks are run on it here).
"""

import importlib.util
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_interlock as ti
from layers import aux_heads
from tests import helpers
from tests import registry_checks
from tf_interlock import placement as placement_lib
from tf_interlock import routing
from train import config as config_lib
from train import datasets
from train import networks
from train import placement_runtime

_AUX_KIND = '''
import keras
from layers import aux_heads


class ProbeHead(keras.layers.Layer):
  """Mean over every axis but batch and the last, then one dense layer;
  at each position when the network predicts per position."""

  def __init__(self, num_classes, per_position=False, **kwargs):
    super().__init__(**kwargs)
    self.per_position = per_position
    self.dense = keras.layers.Dense(num_classes)

  def build(self, shape):
    self.dense.build(tuple(shape) if self.per_position
                     else (shape[0], shape[-1]))

  def call(self, h):
    if not self.per_position and len(h.shape) > 2:
      h = keras.ops.mean(h, axis=tuple(range(1, len(h.shape) - 1)))
    return self.dense(h)


def build(num_classes, shape, *, activation, output_shape, synchronized_bn,
          name):
  del activation, synchronized_bn
  return ProbeHead(num_classes, aux_heads.per_position(shape, output_shape),
                   name=name)


aux_heads.register(aux_heads.AuxHeadKind("probe", "mean -> dense", build))
'''

_PLACEMENT = '''
from tf_interlock import placement


class MirroredOrder(placement.SimulatedPlacement):
  """Module k on logical CPU device K - 1 - k."""

  kind = "mirrored_order"

  @classmethod
  def module_device_indices(cls, num_modules, module_devices=None):
    return super().module_device_indices(num_modules, module_devices)[::-1]


placement.register(MirroredOrder)
'''


def _import(tmp_path, name, source):
  path = tmp_path / f"{name}.py"
  path.write_text(textwrap.dedent(source))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture
def probe_kind(tmp_path):
  module = _import(tmp_path, "user_aux_kind", _AUX_KIND)
  yield module
  aux_heads.unregister("probe")


@pytest.fixture
def user_placement(tmp_path):
  module = _import(tmp_path, "user_placement", _PLACEMENT)
  yield module
  placement_lib.unregister("mirrored_order")


_TASKS = {
    "mlp": datasets.Task("classification", 5, (6,), tf.float32, None, None),
    "resnet": datasets.Task("classification", 5, (8, 8, 3), tf.float32,
                            None, None),
    "transformer": datasets.Task("lm", 7, (4,), tf.int32, None, None),
}
_INPUTS = {"mlp": tf.random.normal([2, 6]),
           "resnet": tf.random.normal([2, 8, 8, 3]),
           "transformer": tf.constant([[1, 2, 3, 4], [4, 3, 2, 1]])}


@pytest.mark.parametrize("model", sorted(_TASKS))
def test_a_new_aux_head_kind_reaches_every_network(probe_kind, model):
  text = {"transformer": {"dataset": "fortunes"},
          "mlp": {"dataset": "synthetic"}}.get(model, {})
  config = config_lib.Config(model=model, aux_head="probe", num_modules=2,
                             seq_len=4, num_layers=2, d_model=8,
                             num_heads=2, mlp_dim=8, mlp_width=8, **text)
  config_lib.validate(config)
  modules = networks.make_modules(config, _TASKS[model])
  head = modules[0].aux_head
  assert isinstance(head, probe_kind.ProbeHead) and head.name == "aux_head1"
  h = modules[0].body(_INPUTS[model])
  logits = head(h)
  per_position = model == "transformer"
  assert logits.shape == ((2, 4, 7) if per_position else (2, 5))


@pytest.mark.parametrize("model,saved,given,same", [
    ("resnet", "authors", "auto", True),   # the old default, the same head
    ("resnet", "pool", "auto", False),
    ("mlp", "authors", "auto", True),      # recorded before --aux_head
    ("transformer", "authors", "auto", True),  # reached these networks
    ("mlp", "authors", "linear", True),
    ("mlp", "auto", "probe", False),
    (None, None, "auto", False),           # nothing recorded
])
def test_a_run_recorded_before_aux_head_reached_every_network_resumes(
    probe_kind, model, saved, given, same):
  del probe_kind  # registers "probe"
  text = {"dataset": "fortunes"} if model == "transformer" else {}
  config = config_lib.Config(model=model or "mlp", aux_head=given, **text)
  assert networks.same_aux_head(saved, config) is same


def test_the_mlp_keeps_its_bare_dense_head():
  # The checkpoints of earlier MLP runs hold module k's head as one Dense.
  config = config_lib.Config(model="mlp", num_modules=2, mlp_width=8)
  head = networks.make_modules(config, _TASKS["mlp"])[0].aux_head
  assert type(head) is keras.layers.Dense and head.name == "aux_head1"


def test_a_new_aux_head_kind_trains_through_the_trainer(probe_kind):
  config = config_lib.Config(model="mlp", aux_head="probe", num_modules=2,
                             mlp_width=8)
  modules = networks.make_modules(config, _TASKS["mlp"])
  trainer = ti.InterlockTrainer(modules, "sgd", "local",
                                loss_fn=helpers.cross_entropy)
  x, y = helpers.batch(size=8)
  trainer.build(x)
  before = [v.numpy().copy() for v in modules[0].aux_head.weights]
  trainer.train_loop(iter(trainer.distribute_dataset(
      helpers.repeat_dataset(x, y))))
  after = [v.numpy() for v in modules[0].aux_head.weights]
  assert all(not np.array_equal(a, b) for a, b in zip(before, after))


def test_a_new_placement_passes_every_registry_check_and_trains(
    user_placement):
  cls = user_placement.MirroredOrder
  assert placement_lib.get("mirrored_order") is cls
  # The registry tests' per-entry rules hold for it.
  registry_checks.check_trainer_questions(cls)
  # The binaries set it up as its base (`placement_runtime.of`'s rule).
  assert (placement_runtime.of("mirrored_order")
          is placement_runtime.SimulatedRuntime)
  config_lib.validate(config_lib.Config(placement="mirrored_order",
                                        num_modules=2))
  # Both doors take its name; module k's variables sit on CPU K - 1 - k.
  x, y = helpers.batch(size=8)
  trainer = ti.InterlockTrainer(helpers.mlp_modules(2), "sgd", "local",
                                loss_fn=helpers.cross_entropy,
                                placement="mirrored_order")
  trainer.build(x)
  for k in range(2):
    for v in trainer.variables(k):
      assert v.value.device.endswith(f"CPU:{1 - k}"), v.path
  model = ti.InterlockModel(helpers.mlp_modules(2), "local",
                            placement="mirrored_order")
  model.compile(keras.optimizers.SGD(0.1), loss=helpers.cross_entropy)
  history = model.fit(x, y, batch_size=8, verbose=0)
  assert np.isfinite(history.history["loss"][0])


_WINDOWS = '''
import dataclasses

from tf_interlock import routing
from tf_interlock import strategy


@dataclasses.dataclass(frozen=True)
class PerModuleWindows(strategy.InterlockStrategy):
  """Module k trained by the loss of module target(k) = k + n_k - 1 alone."""

  windows: tuple = ()

  @property
  def name(self):
    return "windows" + "-".join(map(str, self.windows))

  def routing_plan(self, num_modules, has_aux):
    last = num_modules - 1
    target = [min(k + n - 1, last) for k, n in enumerate(self.windows)]
    trained = [[k for k in range(num_modules) if target[k] == j]
               for j in range(num_modules)]
    loss_low = tuple(min(ks) if ks else None for ks in trained)
    weight_keys = tuple(
        tuple(loss_low[j] for j in range(num_modules) if k in trained[j])
        for k in range(num_modules))
    vjp_keys = tuple(
        tuple(sorted({loss_low[j] for j in range(k, num_modules)
                      if loss_low[j] is not None and loss_low[j] < k}))
        for k in range(num_modules))
    return routing.RoutingPlan(num_modules, max(self.windows), "only",
                               loss_low, weight_keys, vjp_keys)
'''


def _one_step(strategy):
  x, y = helpers.batch(size=8)
  trainer = ti.InterlockTrainer(helpers.mlp_modules(3), "sgd", strategy,
                                loss_fn=helpers.cross_entropy)
  trainer.build(x)
  trainer.train_loop(iter(trainer.distribute_dataset(
      helpers.repeat_dataset(x, y))))
  return [[v.numpy() for v in trainer.variables(k)] for k in range(3)]


def test_a_per_module_window_trains_through_its_routing_plan(tmp_path):
  # A window n_k per module, written in a temporary module as a subclass
  # with a plan of its own: nothing in the library changes.
  windows = _import(tmp_path, "user_windows", _WINDOWS).PerModuleWindows
  assert (routing.make_plan(windows(windows=(2, 2, 1)), 3).routes
          == routing.make_plan("2wise", 3).routes)
  mixed = windows(windows=(2, 1, 1))  # module 1 as 2wise, module 2 local
  plan = routing.make_plan(mixed, 3)
  assert [plan.losses_training(k) for k in range(3)] == [[1], [1], [2]]
  assert not plan.end_to_end
  got = _one_step(mixed)
  pairwise, local = _one_step("2wise"), _one_step("local")
  for k, want in ((0, pairwise[0]), (1, local[1]), (2, local[2])):
    body = len(want) - (2 if k < 2 else 0)  # the aux head's kernel, bias
    for a, b in zip(got[k][:body], want[:body]):
      np.testing.assert_array_equal(a, b)
  # The readers outside the engine follow the plan too.
  assert routing.make_plan("local", 3).routes == routing.make_plan(
      "local-sum", 3).routes
  assert routing.make_plan("2wise-sum", 3).losses_training(0) == [0, 1]
  assert routing.make_plan("e2e", 3).end_to_end
