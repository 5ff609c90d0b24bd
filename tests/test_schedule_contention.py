"""The schedule model's contention between ops that run at once
(`schedule.slowdown`, `simulate(contention=c)`): processor sharing, checked
against hand-worked schedules, and the probe's factor derived from its
measured times (`schedule.contention_factor`).
"""

import math

import pytest

from step_model import schedule
from step_model.schedule import ModuleCost

# Two equal modules with aux heads; every op costs 1 alone.
EQUAL = [ModuleCost(1.0, 1.0, 1.0, aux=1.0)] * 2


def test_slowdown_adds_c_minus_1_per_extra_op():
  assert schedule.slowdown(0, 1.4) == 1.0
  assert schedule.slowdown(1, 1.4) == 1.0
  assert schedule.slowdown(2, 1.4) == pytest.approx(1.4)
  assert schedule.slowdown(3, 1.4) == pytest.approx(1.8)
  assert schedule.slowdown(4, 1.0) == 1.0


@pytest.mark.parametrize("c", [1.0, 1.25, 1.5, 2.0])
def test_local_k2_by_hand(c):
  # Local, K = 2 on 2 devices: device 1 runs F1, A1, BW1 (3 units, never
  # idle in the steady state), device 2 runs F2 and BW2 (2 units) beside
  # it. The 2 units of device 2 overlap device 1's work: both run c times
  # slower there, so device 2 takes 2c and device 1's step 2c + 1.
  result = schedule.simulate(EQUAL, "local", contention=c)
  assert result.step_time == pytest.approx(2 * c + 1, abs=1e-9)
  assert result.utilization[0] == pytest.approx(1.0, abs=1e-9)
  assert result.utilization[1] == pytest.approx(2 * c / (2 * c + 1),
                                                abs=1e-9)


def test_two_ops_of_unequal_length_share_then_one_runs_alone():
  # Local, K = 2, device 2's ops cost 0.5 (1 unit in all): while it runs,
  # device 1's ops are slowed too; device 1's 3 units take 3 + (c - 1) * 1.
  costs = [ModuleCost(1.0, 1.0, 1.0, aux=1.0),
           ModuleCost(0.5, 0.5, 0.5, aux=0.5)]
  for c in (1.0, 1.5):
    assert schedule.simulate(costs, "local", contention=c).step_time == (
        pytest.approx(3 + (c - 1) * 1.0, abs=1e-9))


def test_one_module_never_shares():
  one = [ModuleCost(1.0, 1.0, 1.0)]
  assert schedule.simulate(one, "e2e", contention=1.7).step_time == (
      pytest.approx(schedule.simulate(one, "e2e").step_time, abs=1e-12))


def test_one_op_at_a_time_on_one_core_never_shares():
  # One core: two ops never run at once, so contention changes nothing.
  for strategy in ("e2e", "local", "2wise"):
    alone = schedule.simulate(EQUAL, strategy, num_cores=1).step_time
    assert schedule.simulate(EQUAL, strategy, num_cores=1,
                             contention=1.6).step_time == pytest.approx(
                                 alone, abs=1e-9)


@pytest.mark.parametrize("strategy", ["e2e", "local", "2wise", "3wise"])
@pytest.mark.parametrize("microbatches", [1, 2, 4])
def test_contention_slows_between_one_and_c(strategy, microbatches):
  costs = [ModuleCost(1.0, 0.5, 1.5, aux=0.25, update=0.125),
           ModuleCost(2.0, 1.0, 2.5, aux=0.5, update=0.25),
           ModuleCost(0.5, 0.25, 1.0, aux=0.25, update=0.125)]
  base = schedule.simulate(costs, strategy, num_microbatches=microbatches,
                           num_cores=2, module_devices=(0, 1, 1),
                           ops_per_device=2).step_time
  previous = base
  for c in (1.2, 1.5, 2.0):
    step = schedule.simulate(costs, strategy, num_microbatches=microbatches,
                             num_cores=2, module_devices=(0, 1, 1),
                             ops_per_device=2, contention=c).step_time
    # Two cores: at most two ops at once, each at most c times slower.
    assert base - 1e-9 <= step <= c * base + 1e-9
    assert step >= previous - 1e-9
    previous = step


def test_long_schedules_of_unround_costs_end():
  # Costs in ms, 8 modules, 16 microbatches, one core: times reach 1e5, where
  # stepping by differences of times left rounding residues that never
  # retired (the loop spun). One core runs every op one after another, so
  # the step is the whole step's work.
  costs = [ModuleCost(37.3, 21.1, 45.7, aux=9.3)] * 8
  for c in (1.0, 1.3):
    result = schedule.simulate(costs, "e2e", num_microbatches=16,
                               num_cores=1, contention=c)
    assert result.step_time == pytest.approx(sum(result.device_load),
                                             rel=1e-9)


# Cases whose ties a test of "ended <= now" for transfers got wrong.
@pytest.mark.parametrize("strategy, microbatches, devices", [
    ("e2e", 2, (0, 1, 1)), ("e2e", 4, (0, 1, 2)), ("local", 4, (0, 1, 2)),
    ("2wise", 2, (0, 1, 1)), ("2wise", 4, (0, 1, 2)), ("local", 1, (0, 1, 1))])
@pytest.mark.parametrize("c", [1.0, 1.25])
def test_ties_with_transfers_do_not_depend_on_the_unit(strategy,
                                                       microbatches, devices,
                                                       c):
  # The same schedule in seconds and in units of 1e-4 s: ops and transfers
  # that end together must retire together in both, whatever the rounding.
  costs = [ModuleCost(3.0, 2.0, 4.0, aux=1.0, update=1.0),
           ModuleCost(2.0, 3.0, 3.0, aux=1.0, update=1.0),
           ModuleCost(4.0, 1.0, 2.0, aux=1.0, update=1.0)]
  links = [schedule.TransferCost(1.0, 2.0)] * 2
  kwargs = dict(num_microbatches=microbatches, num_cores=2,
                module_devices=devices, ops_per_device=2, contention=c)
  whole = schedule.simulate(costs, strategy, transfers=links, **kwargs)
  small = schedule.simulate(
      [c.scaled(1e-4) for c in costs], strategy,
      transfers=[schedule.TransferCost(1e-4, 2e-4)] * 2, **kwargs)
  assert small.step_time == pytest.approx(1e-4 * whole.step_time, rel=1e-6)


@pytest.mark.parametrize("bad", [0.5, -1.0, math.nan, math.inf, True, "2"])
def test_bad_contention_is_one_line(bad):
  with pytest.raises(ValueError, match=r"contention must be a number >= 1\. "
                     r"Received: contention="):
    schedule.simulate(EQUAL, "local", contention=bad)


def test_the_probe_factor_inverts_processor_sharing():
  # Ops of 3 and 1 alone at once: both at c until the short one ends at c,
  # then the long one's 2 left alone: c + 2 = 3 + (c - 1).
  for c in (1.0, 1.3, 1.8):
    assert schedule.contention_factor(3.0, 1.0, 3.0 + (c - 1)) == (
        pytest.approx(c))
  # Equal ops: the ratio itself. Faster than alone: no contention (1).
  assert schedule.contention_factor(2.0, 2.0, 2.6) == (
      pytest.approx(1.3))
  assert schedule.contention_factor(2.0, 1.0, 1.9) == 1.0
