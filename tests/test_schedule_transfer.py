"""The schedule model's transfer ops between modules on different processes.

Hand-worked: two modules, module 0 on process 0 and module 1 on process 1,
one core each, each crossing of h_0 (forward) or its cotangent (backward)
costs latency 0.25 + transfer 0.25 = 0.5.
"""

import pytest

from step_model import schedule

# Module 0: forward 1, aux head 1, weight VJP 2. Module 1 (loss inside its
# forward): forward 1, input VJP 1, weight VJP 1. No update cost.
COSTS = [schedule.ModuleCost(forward=1.0, input_vjp=0.0, weight_vjp=2.0,
                             aux=1.0),
         schedule.ModuleCost(forward=1.0, input_vjp=1.0, weight_vjp=1.0)]
E2E_COSTS = [schedule.ModuleCost(forward=1.0, input_vjp=0.0, weight_vjp=2.0),
             COSTS[1]]
LINK = [schedule.TransferCost(latency=0.25, transfer=0.25)]


def test_crossing_pays_latency_per_microbatch():
  assert LINK[0].crossing(1) == 0.5
  assert LINK[0].crossing(2) == 0.375  # 0.25 + 0.25 / 2


def test_e2e_pays_both_crossings():
  # F0 [0,1], T0 [1,1.5], F1 [1.5,2.5], BX1 [2.5,3.5], TB0 [3.5,4],
  # BW0 [4,6], U0 at 6 releases the next F0: 6 per step (5 without the two
  # 0.5 crossings).
  plain = schedule.simulate(E2E_COSTS, "e2e", num_cores=2)
  crossed = schedule.simulate(E2E_COSTS, "e2e", num_cores=2, transfers=LINK)
  assert plain.step_time == pytest.approx(5.0)
  assert crossed.step_time == pytest.approx(6.0)
  assert crossed.critical_ops == ("F0", "T0", "F1", "BX1^0", "TB0^0", "BW0")
  # A transfer holds no device: each device's busy time is unchanged.
  assert crossed.device_load == plain.device_load


def test_local_hides_the_forward_crossing():
  # Process 0: F0 1 + A0 1 + BW0 2 = 4 per step; process 1 gets h_0 0.5
  # after F0 and needs only 2 (F1, BW1): no cotangent crosses, and the
  # forward crossing overlaps process 0's next work. 4 per step either way.
  plain = schedule.simulate(COSTS, "local", num_cores=2)
  crossed = schedule.simulate(COSTS, "local", num_cores=2, transfers=LINK)
  assert plain.step_time == pytest.approx(4.0)
  assert crossed.step_time == pytest.approx(4.0)


def test_same_process_costs_no_transfer():
  # Both modules on one device: the boundary is inside one process.
  one = schedule.simulate(E2E_COSTS, "e2e", num_cores=1,
                          module_devices=(0, 0))
  crossed = schedule.simulate(E2E_COSTS, "e2e", num_cores=1,
                              module_devices=(0, 0), transfers=LINK)
  assert crossed.step_time == pytest.approx(one.step_time)
  assert one.step_time == pytest.approx(6.0)  # 1 + 1 + 1 + 1 + 2


def test_transfers_needs_one_per_boundary():
  with pytest.raises(ValueError, match="transfers needs one TransferCost"):
    schedule.simulate(E2E_COSTS, "e2e", transfers=LINK * 2)
