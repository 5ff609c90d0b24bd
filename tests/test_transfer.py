"""Tests of the link probe (step_model/transfer.py) on two logical CPUs.

Between two logical devices of one process a hop is a memory copy, not a
gRPC transfer: the figures are small, but the arithmetic is the same one
`research.cluster_benchmark` runs between worker processes.
"""

import math

import pytest

from tf_interlock import placement
from step_model import schedule
from step_model import transfer

placement.configure_simulated_devices(2)
CPU0, CPU1 = "/device:CPU:0", "/device:CPU:1"


def test_chain_alternates_devices_and_keeps_the_value():
  run = transfer._chain(CPU0, CPU1, (4, 8), 3)  # pylint: disable=protected-access
  assert float(run()) == 1.0  # ones times three scales of 1
  graph = run.get_concrete_function().graph
  devices = {op.device for op in graph.get_operations() if op.type == "Mul"}
  assert any(d.endswith("CPU:1") for d in devices)
  assert any(d.endswith("CPU:0") for d in devices)


def test_probe_gives_latency_and_per_byte_cost():
  link = transfer.probe_crossing(CPU0, CPU1, (64, 256), hops=4, repeats=5)
  assert link["bytes"] == 4 * 64 * 256
  for key in ("latency_s", "activation_s", "s_per_byte"):
    assert math.isfinite(link[key]) and link[key] >= 0.0
  assert link["s_per_byte"] == pytest.approx(
      max(0.0, link["activation_s"] - link["latency_s"]) / link["bytes"])


def test_transfer_costs_scale_with_boundary_bytes():
  link = {"latency_s": 1e-4, "s_per_byte": 1e-9}
  costs = transfer.transfer_costs(link, [1000, 3000])
  assert [c.latency for c in costs] == [1e-4, 1e-4]
  assert [c.transfer for c in costs] == pytest.approx([1e-6, 3e-6])
  assert isinstance(costs[0], schedule.TransferCost)
  assert costs[1].crossing(3) == pytest.approx(1e-4 + 1e-6)


def test_bad_hops_is_one_line():
  with pytest.raises(ValueError, match=r"Received: hops=1"):
    transfer.seconds_per_hop(CPU0, CPU1, (2,), hops=1)
