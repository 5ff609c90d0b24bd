"""Depthwise placement: real devices, clear errors, TPU device assignment."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tests import registry_checks
from tf_interlock import placement as placement_lib
from tf_interlock.trainer import InterlockTrainer

K = 4


def _fake_topology(mesh=(2, 2, 1, 2)):
  """A TPU topology built offline: every core's [x, y, z, core] coords."""
  coords = [[x, y, z, c] for x in range(mesh[0]) for y in range(mesh[1])
            for z in range(mesh[2]) for c in range(mesh[3])]
  return tf.tpu.experimental.Topology(
      mesh_shape=list(mesh), device_coordinates=np.array([coords], np.int32))


def test_simulated_uses_distinct_devices():
  placement = placement_lib.make_placement("simulated", K)
  assert len(set(placement.devices)) == K
  assert all("CPU" in d for d in placement.devices)


@pytest.mark.parametrize("kind,num,match", [
    ("simulated", 5, "needs 5 CPU devices for 5 modules but has 4"),
    ("gpu", 2, "needs 2 GPU devices for 2 modules"),
    ("tpu", 2, "Received: cores_per_replica=None"),
    ("cpu", 2, "Received: placement='cpu'"),
])
def test_bad_placements(kind, num, match):
  with pytest.raises(ValueError, match=match):
    placement_lib.make_placement(kind, num)


def test_modules_share_devices_as_asked():
  placement = placement_lib.make_placement("simulated", K,
                                           module_devices=(0, 0, 1, 1))
  assert [d[-5:] for d in placement.devices] == ["CPU:0", "CPU:0", "CPU:1",
                                                 "CPU:1"]
  with pytest.raises(ValueError, match=r"module_devices=\(0, 1\)"):
    placement_lib.make_placement("simulated", K, module_devices=(0, 1))
  with pytest.raises(ValueError, match="needs 5 CPU devices"):
    placement_lib.make_placement("simulated", K, module_devices=(0, 1, 2, 4))


def test_placements_answer_only_what_the_trainer_asks():
  for name in placement_lib.names():
    registry_checks.check_trainer_questions(placement_lib.get(name))
  for name, answers in registry_checks.BUILT_IN_ANSWERS.items():
    cls = placement_lib.get(name)
    assert (cls.one_process, cls.xla_unit,
            cls.replica_device_type) == answers, name


def test_only_a_tpu_strategy_compiles_the_step():
  default = tf.distribute.get_strategy()
  for name in ("single", "simulated"):
    placement = placement_lib.make_placement(name, K, default)
    assert not placement.compiles_step(default), name
  tpu = placement_lib.Placement("tpu", distribute=default)
  assert tpu.compiles_step(default)
  # TPUs compute in bfloat16: mixed_float16 is refused on one.
  with pytest.raises(ValueError, match="policy=mixed_float16"):
    tpu.check_trainer(default, float16=True)
  placement_lib.make_placement("single", K).check_trainer(default, True)


def test_threads_that_cannot_be_applied_raise():
  # The test runtime has started with TF's default intra-op pool.
  with pytest.raises(RuntimeError, match="intra_op_threads=2"):
    placement_lib.configure_simulated_devices(K, intra_op_threads=2)


def matmul_devices(graph):
  """Device indices of the MatMuls `graph` runs, also those inside the
  functions it calls (the modules' traced bodies and their VJPs): an op
  without a device in a function runs on its call op's device."""
  library = {f.signature.name: f
             for f in graph.as_graph_def().library.function}

  def calls_matmul(name):
    nodes = library[name].node_def
    return any(n.op == "MatMul" or (n.op.endswith("PartitionedCall") and
                                    calls_matmul(n.attr["f"].func.name))
               for n in nodes)

  return {op.device.split(":")[-1] for op in graph.get_operations()
          if op.type == "MatMul" or (op.type.endswith("PartitionedCall") and
                                     calls_matmul(op.get_attr("f").name))}


def test_trainer_places_variables_and_ops():
  x, y = helpers.batch(size=8)
  placement = placement_lib.make_placement("simulated", K)
  modules = helpers.mlp_modules(K, seed=4)
  trainer = InterlockTrainer(modules, lambda k: keras.optimizers.Adam(0.01),
                             "2wise", loss_fn=helpers.cross_entropy,
                             placement=placement)
  with pytest.raises(ValueError, match="Received: num_modules=3"):
    InterlockTrainer(modules[:3], lambda k: keras.optimizers.SGD(),
                     placement=placement)
  trainer.build(x)
  for k, module in enumerate(modules):
    for v in module.weights + trainer.optimizers[k].variables:
      assert v.value.device.endswith(f"CPU:{k}"), (k, v.path, v.value.device)
  iterator = iter(trainer.distribute_dataset(helpers.repeat_dataset(x, y)))
  trainer.train_loop(iterator)
  graph = trainer.loop_function(1).get_concrete_function(iterator).graph
  assert matmul_devices(graph) == {str(k) for k in range(K)}
  # Same numbers as on one device.
  single = helpers.mlp_modules(K, seed=4)
  reference = InterlockTrainer(single, lambda k: keras.optimizers.Adam(0.01),
                               "2wise", loss_fn=helpers.cross_entropy)
  reference.build(x)
  reference.train_loop(iter(reference.distribute_dataset(
      helpers.repeat_dataset(x, y))))
  for a, b in zip(helpers.weights(single), helpers.weights(modules)):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("mesh,cores,shape", [
    ((2, 2, 1, 2), 2, [1, 1, 1, 2]),
    ((2, 2, 1, 2), 4, [1, 2, 1, 2]),
    ((2, 2, 1, 2), 1, [1, 1, 1, 1]),
    ((4, 4, 1, 1), 4, [1, 4, 1, 1]),
    ((2, 2, 2, 2), 8, [1, 2, 2, 2]),
])
def test_computation_shape(mesh, cores, shape):
  got = placement_lib.computation_shape(mesh, cores)
  assert got == shape and int(np.prod(got)) == cores


def test_tpu_device_assignment_from_fake_topology():
  topology = _fake_topology()
  assignment = placement_lib.tpu_device_assignment(topology, 4)
  assert assignment.num_replicas == 2
  assert assignment.num_cores_per_replica == 4
  # Every core used exactly once across replicas x modules.
  cores = {tuple(assignment.coordinates(r, k)) for r in range(2)
           for k in range(4)}
  assert len(cores) == 8
  # Module k's two replicas sit on the same core index of different chips.
  assert assignment.coordinates(0, 1)[3] == assignment.coordinates(1, 1)[3]
  local = placement_lib.tpu_device_assignment(topology, 2)
  assert (local.num_replicas, local.num_cores_per_replica) == (4, 2)


def test_tpu_assignment_errors():
  with pytest.raises(ValueError, match="Received: num_modules=3"):
    placement_lib.tpu_device_assignment(_fake_topology(), 3)
  with pytest.raises(ValueError, match="Received: num_modules=4"):
    placement_lib.computation_shape((3, 1, 1, 1), 4)
