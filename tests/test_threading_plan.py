"""Threads per device: the schedule model with threads, and the plan choice.

Costs are dyadic where possible so that every hand-derived time is exact.
"""

import pytest

from step_model import schedule
from step_model import threading_plan
from step_model.schedule import ModuleCost

COST = ModuleCost(forward=1.0, input_vjp=2.0, weight_vjp=3.0, aux=0.5,
                  update=0.25)


def test_thread_speedup():
  assert schedule.thread_speedup(1, 0.3) == 1.0
  assert schedule.thread_speedup(2, 0.64) == pytest.approx(1.64)
  assert schedule.thread_speedup(4, 0.5) == pytest.approx(2.5)
  with pytest.raises(ValueError, match=r"Received: efficiency=1.5$"):
    schedule.thread_speedup(2, 1.5)


@pytest.mark.parametrize("efficiency,speedup", [(1.0, 2.0), (0.5, 1.5)])
def test_two_threads_on_two_cores_run_one_op_at_a_time(efficiency, speedup):
  # e2e, K = 2. One thread per device, 2 cores: device 1 runs F1 [1, 2],
  # BX1 [2, 4], BW1 [4, 7], U1 [7, 7.25]; device 0 F0 [0, 1], A0 [1, 1.5],
  # BW0 [4, 7], U0 [7, 7.25]: 7.25 per step.
  assert schedule.simulate([COST] * 2, "e2e").step_time == pytest.approx(
      7.25, abs=1e-9)
  # Two threads per device: each op holds both cores, so the ops run one at
  # a time, back to back (a next op is always ready): the step is all the
  # work, 2 (f + bw + u) + a + bx = 11, sped up by 1 + (2 - 1) e.
  result = schedule.simulate([COST] * 2, "e2e", num_cores=2,
                             threads_per_device=2,
                             thread_efficiency=efficiency)
  assert result.step_time == pytest.approx(11 / speedup, abs=1e-9)
  assert result.threads_per_device == 2
  assert sum(result.utilization) == pytest.approx(1.0, abs=1e-9)


def test_modules_sharing_a_device_run_in_turn():
  # Local, K = 4, modules (0, 1) on device 0 and (2, 3) on device 1, one
  # thread each on 2 cores. Device 0 runs F, A, BW, U of modules 0 and 1:
  # 2 (1 + 0.5 + 3 + 0.25) = 9.5 per step; device 1 runs module 2's 4.75
  # and module 3's (no aux head) 4.25 = 9. Device 0 is never idle, so the
  # step is 9.5 and device 1 idles 0.5 of it.
  result = schedule.simulate([COST] * 4, "local", num_cores=2,
                             module_devices=(0, 0, 1, 1))
  assert result.step_time == pytest.approx(9.5, abs=1e-9)
  assert result.device_load == pytest.approx((9.5, 9.0), abs=1e-9)
  assert result.utilization == pytest.approx((1.0, 9 / 9.5), abs=1e-9)


@pytest.mark.parametrize("kwargs,received", [
    ({"threads_per_device": 0}, "threads_per_device=0"),
    ({"threads_per_device": 3, "num_cores": 2}, "num_cores=2"),
    ({"module_devices": (0, 2, 2, 2)}, "module_devices=(0, 2, 2, 2)"),
    ({"module_devices": (0, 1)}, "module_devices=(0, 1)"),
])
def test_invalid_threads(kwargs, received):
  with pytest.raises(ValueError) as error:
    schedule.simulate([COST] * 4, "local", **kwargs)
  assert str(error.value).endswith(f"Received: {received}")


def test_make_plan_blocks():
  assert threading_plan.make_plan(4, 2, 1).module_devices == (0, 0, 1, 1)
  assert threading_plan.make_plan(3, 2, 1).module_devices == (0, 0, 1)
  plan = threading_plan.make_plan(4, 4, 2)
  assert plan.module_devices == (0, 1, 2, 3)
  assert plan.describe() == "4 devices x 2 threads"
  assert threading_plan.make_plan(4, 2, 1).describe() == (
      "2 devices x 1 thread, 2 modules each")
  with pytest.raises(ValueError, match=r"Received: num_devices=5$"):
    threading_plan.make_plan(4, 5, 1)
  # D in (4, 2, 1) (D divides K) x t, D x t <= 2 cores, or t = 1.
  assert [(p.num_devices, p.threads_per_device)
          for p in threading_plan.candidate_plans(4, 2)] == [
              (4, 1), (2, 1), (1, 1), (1, 2)]
  assert [(p.num_devices, p.threads_per_device)
          for p in threading_plan.candidate_plans(8, 16)][:4] == [
              (8, 1), (8, 2), (4, 1), (4, 2)]


# f = bx = bw = 1, no aux or update cost, K = 2, 2 cores, e = 0.64.
UNIT = ModuleCost(forward=1.0, input_vjp=1.0, weight_vjp=1.0)


def test_e2e_chooses_threads_inside_ops():
  # e2e: 2 devices x 1 thread runs F0, F1, BX1, then BW0 and BW1 together:
  # 4 per step (one core idles 3 of 4). Two threads per op run the 5 units
  # of work one op at a time at 1.64x: 5 / 1.64 = 3.05, on the one device
  # of 2 threads that 2 cores hold (2 devices x 2 threads would need 4).
  plan, step = threading_plan.choose_plan([UNIT] * 2, "e2e", 2)
  assert (plan.num_devices, plan.threads_per_device) == (1, 2)
  assert step == pytest.approx(5 / 1.64, abs=1e-9)


def test_local_chooses_one_thread_per_device():
  # Local: device 0 runs F0, BW0 (2), device 1 F1, BW1 (2), at once: 2 per
  # step; with two threads per op, 4 / 1.64 = 2.44.
  plan, step = threading_plan.choose_plan([UNIT] * 2, "local", 2)
  assert (plan.num_devices, plan.threads_per_device) == (2, 1)
  assert step == pytest.approx(2.0, abs=1e-9)


def test_overrides():
  plan, step = threading_plan.choose_plan([UNIT] * 2, "e2e", 2,
                                          threads_per_device=1)
  assert plan.threads_per_device == 1 and step == pytest.approx(4.0)
  # One device holding both modules, one thread: all 5 units in turn.
  plan, step = threading_plan.choose_plan(
      [UNIT] * 2, "local", 2, threads_per_device=1, modules_per_device=2)
  assert plan.module_devices == (0, 0) and step == pytest.approx(4.0)
  # More threads than cores cannot be simulated: kept as asked.
  plan, step = threading_plan.choose_plan([UNIT] * 2, "e2e", 2,
                                          threads_per_device=4)
  assert plan.threads_per_device == 4 and step is None
  with pytest.raises(ValueError, match=r"Received: modules_per_device=3$"):
    threading_plan.plan_for(4, "local", 2, modules_per_device=3)


def test_plans_say_what_they_share():
  # Own pools (the default): D x t threads; more than the host's cores and
  # the plan says so, and has only the host's cores.
  plan = threading_plan.make_plan(4, 4, 2, num_cores=2)
  assert plan.describe() == "4 devices x 2 threads (8 threads on 2 cores)"
  assert (plan.threads, plan.cores_in_use()) == (8, 2)
  assert threading_plan.make_plan(8, 8, 2, num_cores=16).cores_in_use() == 16
  # One pool shared by every device: t cores, whatever D.
  shared = threading_plan.make_plan(4, 4, 4, num_cores=16, shared_pool=True)
  assert shared.describe() == "4 devices x 4 threads, one shared pool (4 cores)"
  assert shared.cores_in_use() == 4 and shared != threading_plan.make_plan(
      4, 4, 4, num_cores=16)
  # Every plan the planner offers has pools of its own and knows its cores.
  for plan in threading_plan.candidate_plans(4, 2):
    assert not plan.shared_pool and plan.num_cores == 2
  assert threading_plan.plan_for(4, "local", 16).num_cores == 16


def test_a_shared_pool_runs_one_op_at_a_time():
  # Local, K = 4 on "4 devices x 4 threads", 16 cores, e = 1: own pools run
  # the four modules at once, each op 4x faster: (f + bw) / 4 = 0.5 a step.
  # One shared pool of 4 threads holds one op at a time: all 4 modules'
  # F and BW (8 units; A and U cost 0) in turn at 4x, 2 a step, as measured on 16 cores
  # (local = e2e there, issue 39).
  own = threading_plan.make_plan(4, 4, 4, num_cores=16)
  shared = threading_plan.make_plan(4, 4, 4, num_cores=16, shared_pool=True)
  assert threading_plan.predict([UNIT] * 4, "local", own, 16,
                                thread_efficiency=1.0).step_time == (
                                    pytest.approx(0.5))
  assert threading_plan.predict([UNIT] * 4, "local", shared, 16,
                                thread_efficiency=1.0).step_time == (
                                    pytest.approx(2.0))


def test_plan_for_four_modules_on_two_cores():
  # With nominal costs on 2 cores: e2e (no overlap between modules) takes
  # the threads; 2-wise keeps one thread per device and gives each a core
  # (4 devices x 1 thread would time-share them for no predicted gain).
  assert threading_plan.plan_for(4, "e2e", 2).threads_per_device == 2
  plan = threading_plan.plan_for(4, "2wise", 2)
  assert (plan.num_devices, plan.threads_per_device) == (2, 1)
  # As many cores as modules: local needs no threads inside ops.
  plan = threading_plan.plan_for(4, "local", 4)
  assert (plan.num_devices, plan.threads_per_device) == (4, 1)


def test_a_time_shared_plan_must_win_by_the_margin(monkeypatch):
  # Local, K = 3 on 2 cores: 3 devices x 1 thread time-share the cores and
  # run the 6 units of work in 3 (two ops at a time); 1 device x 2 threads
  # runs them one op at a time at 1.64x: 6 / 1.64 = 3.66. Time-shared is
  # predicted 18% faster: below the 25% margin, the honoured plan is kept.
  plan, step = threading_plan.choose_plan([UNIT] * 3, "local", 2)
  assert (plan.num_devices, plan.threads_per_device) == (1, 2)
  assert step == pytest.approx(6 / 1.64, abs=1e-9)
  monkeypatch.setattr(threading_plan, "TIME_SHARING_MARGIN", 0.1)
  plan, step = threading_plan.choose_plan([UNIT] * 3, "local", 2)
  assert plan.time_shared() and step == pytest.approx(3.0, abs=1e-9)
  # A plan the user fixes is taken as asked, time-shared or not.
  monkeypatch.setattr(threading_plan, "TIME_SHARING_MARGIN", 0.25)
  plan, _ = threading_plan.choose_plan([UNIT] * 3, "local", 2,
                                       threads_per_device=1)
  assert (plan.num_devices, plan.threads_per_device) == (3, 1)
