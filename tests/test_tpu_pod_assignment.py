"""TPU pods: where R replicas x K module cores land across hosts.

A fake multi-host topology, built offline (nothing here has run on a real
TPU): 2 hosts x 4 cores, mesh [x=2, y=2, z=1, cores_per_chip=2], host h
owning the two chips at x = h. `placement.tpu_device_assignment` gives every
replica a compact block of K cores (`computation_shape`); these tests pin
down which host each replica's module k runs on.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_interlock import placement as placement_lib

MESH = (2, 2, 1, 2)


def _pod_topology():
  """2 hosts (TPU tasks), each with the 4 cores of the chips at x = host."""
  per_host = [[[x, y, 0, core] for y in range(MESH[1])
               for core in range(MESH[3])] for x in range(MESH[0])]
  return tf.tpu.experimental.Topology(
      mesh_shape=list(MESH), device_coordinates=np.array(per_host, np.int32))


def _layout(num_modules):
  """Per replica, per module: (host, TPU ordinal on that host)."""
  topology = _pod_topology()
  assignment = placement_lib.tpu_device_assignment(topology, num_modules)
  assert assignment.num_cores_per_replica == num_modules
  return [[(int(topology.task_ordinal_at_coordinates(
      assignment.coordinates(r, k))), int(assignment.tpu_ordinal(r, k)))
           for k in range(num_modules)]
          for r in range(assignment.num_replicas)]


def test_the_fake_pod_has_two_hosts_of_four_cores():
  topology = _pod_topology()
  assert (topology.num_tasks, topology.num_tpus_per_task) == (2, 4)


def test_k4_one_replica_per_host():
  # R = 8 / 4 = 2: replica r's four modules are the four cores of host r,
  # so activations and cotangents never leave a host; only the per-module
  # gradient all-reduce (module k of replica 0 with module k of replica 1)
  # crosses between hosts.
  assert _layout(4) == [[(0, 0), (0, 1), (0, 2), (0, 3)],
                        [(1, 0), (1, 1), (1, 2), (1, 3)]]


def test_k2_two_replicas_per_host():
  # R = 4 replicas of one chip (2 cores) each, in ring order around the
  # mesh: replicas 0 and 3 on host 0, replicas 1 and 2 on host 1.
  layout = _layout(2)
  assert [{host for host, _ in replica} for replica in layout] == [
      {0}, {1}, {1}, {0}]
  assert all(replica[0][1] + 1 == replica[1][1] for replica in layout)
  # Every core of the pod holds exactly one (replica, module).
  assert len({core for replica in layout for core in replica}) == 8


def test_k8_one_replica_spans_both_hosts():
  # R = 1: the pipeline itself crosses hosts. The block's cores are
  # ordered in a ring, so module 2 -> 3 and module 6 -> 7 cross between
  # hosts: two host-to-host activation transfers per step, not one.
  hosts = [host for host, _ in _layout(8)[0]]
  assert hosts == [0, 0, 1, 1, 1, 1, 0, 0]
  crossings = sum(a != b for a, b in zip(hosts, hosts[1:]))
  assert crossings == 2


@pytest.mark.parametrize("num_modules", [3, 5, 16])
def test_module_counts_that_do_not_tile_the_pod(num_modules):
  with pytest.raises(ValueError, match=f"Received: num_modules={num_modules}"):
    placement_lib.tpu_device_assignment(_pod_topology(), num_modules)
