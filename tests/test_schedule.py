"""Tests of the list-scheduling step-time model (step_model/schedule.py).

Costs are dyadic fractions so that every hand-derived time is exact.
"""

import random

import pytest

from tf_interlock import routing
from step_model import schedule
from step_model.schedule import ModuleCost

# f = 1, bx = 2, bw = 3, a = 0.5, u = 0.25: every cost differs, so a formula
# that picks the wrong ops gives a different number.
COST = ModuleCost(forward=1.0, input_vjp=2.0, weight_vjp=3.0, aux=0.5,
                  update=0.25)


def test_single_module_runs_forward_weight_vjp_update():
  # K = 1: no aux head (the last module's loss is the true loss), no input
  # VJP (nothing below): F -> BW -> U, then the next F. f + bw + u.
  for strategy in ("e2e", "local"):
    result = schedule.simulate([COST], strategy)
    assert result.step_time == pytest.approx(1 + 3 + 0.25, abs=1e-9)
    assert result.utilization == pytest.approx((1.0,), abs=1e-9)


def test_e2e_critical_path():
  # K = 4 on 4 cores; the aux heads are probes (A_k needs only F_k). From 0:
  # F_k ends at k + 1; F_3 at 4 (the loss), BX_3 at 4 + 2 = 6, BX_2 at 8,
  # BX_1 at 10. BW_k (k >= 1) starts after BX_k on device k; BW_0 needs
  # BX_1: 10 + 3 = 13, U_0 13.25. Only then can F_0 of the next step start:
  # 4f + 3bx + bw + u = 13.25. Probes end by k + 1.5, long before the device
  # is needed again; U_k (k >= 1) ends by 4 + (4 - k) * 2 + 3.25 <= 13.25.
  result = schedule.simulate([COST] * 4, "e2e")
  assert result.step_time == pytest.approx(13.25, abs=1e-9)
  assert result.critical_ops == ("F0", "F1", "F2", "F3", "BX3^0", "BX2^0",
                                 "BX1^0", "BW0", "U0")
  # Device 0 works f + a + bw + u = 4.75 of every 13.25.
  assert result.utilization[0] == pytest.approx(4.75 / 13.25, abs=1e-9)


# Total work of one step on K = 4 modules with COST: 4 forwards, 3 aux heads
# (modules 0..2), 4 weight VJPs, 4 updates = 4 + 1.5 + 12 + 1 = 18.5, plus
# bx = 2 per input VJP: local has none, 2-wise 3 (one per module 1..3), 3-wise
# 4 (modules 1, 2, 2, 3: module 2 carries L_2 towards 0 and L_3 towards 1),
# e2e 3, 2-wise-sum 3 (L_j trains j - 1 and j: one stream per module 1..3).
SERIAL_TIMES = {"local": 18.5, "2wise": 24.5, "3wise": 26.5, "e2e": 24.5,
                "2wise-sum": 24.5}


@pytest.mark.parametrize("strategy", sorted(SERIAL_TIMES))
@pytest.mark.parametrize("num_microbatches", [1, 2])
def test_one_core_runs_every_op_back_to_back(strategy, num_microbatches):
  plan = routing.make_plan(strategy, 4)
  assert 18.5 + 2 * sum(map(len, plan.vjp_keys)) == SERIAL_TIMES[strategy]
  result = schedule.simulate([COST] * 4, strategy, num_cores=1,
                             num_microbatches=num_microbatches)
  assert result.step_time == pytest.approx(SERIAL_TIMES[strategy], abs=1e-9)
  assert sum(result.utilization) == pytest.approx(1.0, abs=1e-9)


def test_local_costs_one_module_of_work():
  # No stream crosses a module: device k runs F_k, A_k, BW_k, U_k and then
  # F_k of the next step, whose input F_{k-1} finished long ago (device k-1
  # runs the same cycle one forward earlier). f + a + bw + u = 4.75.
  result = schedule.simulate([COST] * 4, "local")
  assert result.step_time == pytest.approx(4.75, abs=1e-9)
  # The last module has no aux head: it idles a of every step.
  assert result.utilization == pytest.approx((1, 1, 1, 4.25 / 4.75), abs=1e-9)


@pytest.mark.parametrize("num_modules", [3, 4, 6])
def test_pairwise_cycle(num_modules):
  # 2-wise "only": theta_k is trained by L_{k+1}, which needs F_{k+1}. The
  # cycle U_k(t-1) -> F_k -> F_{k+1} -> A_{k+1} -> BX_{k+1} -> BW_k -> U_k
  # takes 2f + a + bx + bw + u = 7.75. It is also feasible: with F_k(t)
  # starting at 7.75 t + k, device k runs F_k, A_k, BX_k (to 7.75 t + k +
  # 3.5) and is free when BX_{k+1} ends at 7.75 t + k + 4.5; BW_k, U_k then
  # end at 7.75 (t + 1) + k. The last module has no aux head, so the cycle
  # through it is shorter by a, and it runs only F, BX, BW, U (6.25).
  result = schedule.simulate([COST] * num_modules, "2wise")
  assert result.step_time == pytest.approx(7.75, abs=1e-9)


@pytest.mark.parametrize("num_modules,num_microbatches", [(3, 4), (4, 8)])
def test_gpipe_bubble(num_modules, num_microbatches):
  # e2e with only forwards costing (f = 1, so f / M per microbatch): the M
  # forwards pass down the K devices in (M + K - 1) / M; all backward ops and
  # the updates are instant, so the next step starts right then. Each device
  # is busy 1 of every (M + K - 1) / M: the bubble is (K - 1) / (M + K - 1).
  cost = ModuleCost(forward=1.0, input_vjp=0.0, weight_vjp=0.0)
  result = schedule.simulate([cost] * num_modules, "e2e",
                             num_microbatches=num_microbatches)
  slots = num_microbatches + num_modules - 1
  assert result.step_time == pytest.approx(slots / num_microbatches, abs=1e-9)
  assert result.utilization == pytest.approx(
      (num_microbatches / slots,) * num_modules, abs=1e-9)


def test_fewer_cores_than_modules():
  # Local, K = 4 on 2 cores, f = bw = 1, a = u = 0: at least 8 / 2 = 4 per
  # step. Trace: F0 [0,1]; F1, BW0 [1,2]; F2, BW1 [2,3]; F3, BW2 [3,4]; at 4
  # BW3 and, as U0 is instant, F0 of step 1 start, and the pattern repeats
  # shifted by 4 with both cores always busy: 4 = 2x one module's work.
  cost = ModuleCost(forward=1.0, input_vjp=0.0, weight_vjp=1.0)
  result = schedule.simulate([cost] * 4, "local", num_cores=2)
  assert result.step_time == pytest.approx(4.0, abs=1e-9)
  assert result.utilization == pytest.approx((0.5,) * 4, abs=1e-9)


def test_predict_speedups():
  # f = bx = bw = 1, no aux or update cost, K = 4: e2e 4f + 3bx + bw = 8,
  # 2-wise 2f + bx + bw = 4, local f + bw = 2.
  cost = ModuleCost(forward=1.0, input_vjp=1.0, weight_vjp=1.0)
  speedups = schedule.predict_speedups([cost] * 4, ["local", "pairwise",
                                                    "e2e"])
  expected = {"local": (2.0, 4.0), "2wise": (4.0, 2.0), "e2e": (8.0, 1.0)}
  assert speedups.keys() == expected.keys()
  for name, (step_time, speedup) in expected.items():
    assert speedups[name] == pytest.approx((step_time, speedup), abs=1e-9)


def _random_cost(rng):
  return ModuleCost(*(rng.uniform(0.0, 2.0) for _ in range(5)))


def test_window_orders_step_time_for_equal_modules():
  rng = random.Random(0)
  for _ in range(15):
    costs = [_random_cost(rng)] * rng.randint(3, 6)
    m = rng.randint(1, 3)
    times = [schedule.simulate(costs, s, num_microbatches=m).step_time
             for s in ("local", "2wise", "e2e")]
    assert times[0] <= times[1] * (1 + 1e-9)
    assert times[1] <= times[2] * (1 + 1e-9)


def test_step_time_bounds_and_sum_variant():
  rng = random.Random(1)
  for _ in range(15):
    num_modules = rng.randint(2, 6)
    costs = [_random_cost(rng) for _ in range(num_modules)]
    m = rng.randint(1, 3)
    # With fewer cores the greedy schedule may settle into a cycle too long
    # to measure exactly (the window is then not whole cycles): 1e-3.
    cores, tol = rng.choice([(None, 1e-9), (2, 1e-3), (3, 1e-3)])
    for strategy in ("local", "2wise", "3wise", "e2e", "2wise-sum"):
      result = schedule.simulate(costs, strategy, num_microbatches=m,
                                 num_cores=cores)
      lower = max(max(result.device_load),
                  sum(result.device_load) / result.num_cores)
      assert result.step_time >= lower * (1 - tol)
    # "sum" adds streams and dependencies to "only" (on K cores; with fewer,
    # greedy list scheduling can gain from the other order).
    for n in (2, 3):
      only, summed = (schedule.simulate(costs, f"{n}wise-{v}",
                                        num_microbatches=m).step_time
                      for v in ("only", "sum"))
      assert summed >= only * (1 - 1e-9)


@pytest.mark.parametrize("costs,kwargs,received", [
    ([], {}, "costs=[]"),
    ([COST, ModuleCost(1.0, -2.0, 1.0)], {}, "costs[1].input_vjp=-2.0"),
    ([COST], {"num_microbatches": 0}, "num_microbatches=0"),
    ([COST], {"num_cores": 0}, "num_cores=0"),
])
def test_invalid_input(costs, kwargs, received):
  with pytest.raises(ValueError) as error:
    schedule.simulate(costs, "e2e", **kwargs)
  assert str(error.value).endswith(f"Received: {received}")


def test_best_pipeline_is_the_fastest_microbatch_count():
  costs = [COST] * 4
  times = {m: schedule.simulate(costs, "e2e", num_microbatches=m).step_time
           for m in (2, 4, 8)}
  m, step = schedule.best_pipeline(costs, (2, 4, 8))
  assert step == min(times.values()) and times[m] == step
  # Microbatches fill the pipeline: the peer beats plain e2e, and is bounded
  # by the busiest device's work per step (module 2: f + a + bx + bw + u
  # = 6.75).
  plain = schedule.simulate(costs, "e2e").step_time
  assert 6.75 <= step < plain
  # Ties go to the smaller M: with one module there is nothing to overlap
  # (only the update stays whole), so every M gives f + bw + u.
  assert schedule.best_pipeline([ModuleCost(1.0, 2.0, 3.0)], (4, 2)) == (
      2, pytest.approx(4.0))
  with pytest.raises(ValueError, match="Received: microbatches=()"):
    schedule.best_pipeline(costs, ())


def test_two_wise_is_at_best_half_of_e2e_for_four_equal_modules():
  # The README's reading of the paper's shape: K = 4 equal modules, backward
  # twice the forward, free aux heads: e2e is the chain F1..F4, BX4..BX2,
  # BW1 = 4 + 6 + 2 = 12 units,
  # 2-wise exactly half; any head cost makes it more than half.
  free = [ModuleCost(1.0, 2.0, 2.0, 0.0)] * 4
  assert schedule.simulate(free, "e2e", num_cores=4).step_time == 12.0
  assert schedule.simulate(free, "2wise", num_cores=4).step_time == 6.0
  heads = [ModuleCost(1.0, 2.0, 2.0, 0.5)] * 4
  assert schedule.simulate(heads, "2wise", num_cores=4).step_time == 6.5
  _, pipeline = schedule.best_pipeline(free, num_cores=4)
  assert pipeline < 6.0


@pytest.mark.parametrize("strategy", sorted(SERIAL_TIMES))
def test_step_work_is_the_one_core_step(strategy):
  # On one core nothing overlaps: the step is the sum of its ops' costs.
  for m in (1, 2):
    work = schedule.step_work([COST] * 4, strategy, num_microbatches=m)
    assert work == pytest.approx(SERIAL_TIMES[strategy], abs=1e-9)


def test_a_loop_over_blocks_waits_at_each_block():
  # Local, K = 4 (test_local_costs_one_module_of_work: 4.75 unrolled).
  # Blocks of one step: F0..F3 end at 4, then device 3 runs BW3 + U3 to
  # 7.25 (devices k < 3 end at k + 1 + a + bw + u <= 6.75): 7.25 a step.
  # Blocks of two: step 2's F0 starts at U0's end, 4.75; F1, F2, F3 follow
  # at 5.75, 6.75, 7.75 (device 3 is free from 7.25); BW3 + U3 end at 12:
  # 6 a step. End to end has no slack across steps: no block changes it.
  local = {u: schedule.simulate([COST] * 4, "local", loop="while",
                                loop_block=u).step_time for u in (1, 2)}
  assert local == pytest.approx({1: 7.25, 2: 6.0}, abs=1e-9)
  assert schedule.simulate([COST] * 4, "local").step_time == pytest.approx(
      4.75, abs=1e-9)
  for u in (1, 2, 3):
    assert schedule.simulate([COST] * 4, "e2e", loop="while",
                             loop_block=u).step_time == (
        pytest.approx(13.25, abs=1e-9))
  with pytest.raises(ValueError, match=r"Received: loop_block=0$"):
    schedule.simulate([COST] * 4, "local", loop="while", loop_block=0)


def test_the_pipelined_loop_waits_for_the_slowest_module_of_an_iteration():
  # Local, module k on step i - k in iteration i (pipelined_loop). On a
  # device per module each iteration runs every module's F, A, BW, U side
  # by side: the slowest takes f + a + bw + u = 4.75, as the unrolled
  # steps' cycle, in blocks of 1 or 2 alike.
  for u in (1, 2):
    assert schedule.simulate([COST] * 4, "local", loop="pipelined",
                             loop_block=u).step_time == pytest.approx(
                                 4.75, abs=1e-9)
  # K = 3 devices on 2 cores, blocks of one iteration. Earliest step first:
  # F2 and F1 at 0; then BW2 (1 to 4) and A1 (1 to 1.5), BW1 (1.5 to 4.5),
  # U2 (4 to 4.25); F0 only then, 4.25 to 5.25, and A0, BW0, U0 end at 9.
  # The barrier keeps the next iteration's modules off the core left idle
  # from 4.75: 9 a step, where the unrolled steps reach the 2-core bound
  # of the step's work, 13.75 / 2.
  on_two = {loop: schedule.simulate([COST] * 3, "local", num_cores=2,
                                    loop=loop).step_time
            for loop in ("pipelined", "unrolled")}
  assert on_two == pytest.approx({"pipelined": 9.0, "unrolled": 6.875},
                                 abs=1e-9)


@pytest.mark.parametrize("strategy,loop,block,shown", [
    ("local", "loop", 1, "loop='loop'"),
    ("local", "unrolled", 2, "loop_block=2, loop='unrolled'"),
    ("2wise", "pipelined", 1, "loop='pipelined'"),
    ("e2e", "pipelined", 1, "loop='pipelined'")])
def test_a_loop_the_trainer_would_not_run_is_refused(strategy, loop, block,
                                                     shown):
  with pytest.raises(ValueError, match=rf"Received: {shown}$"):
    schedule.simulate([COST] * 3, strategy, loop=loop, loop_block=block)


def test_a_shared_pool_starts_the_newest_ready_op_first():
  # Local, K = 3 modules on one logical device whose pool runs 2 ops at
  # once on 2 cores, one step per loop iteration (the barrier makes a step
  # its one-step makespan). f = 1, a = 0.5, bw = 3, u = 0.25. F0 0-1; A0
  # and F1 from 1; BW0 1.5-4.5. F1 ends at 2 and makes A1, then F2, ready:
  # the newest, F2, runs 2-3, then BW2 3-6. BW0 ends at 4.5 and makes U0
  # ready, newer than A1: U0 4.5-4.75, A1 4.75-5.25, BW1 5.25-8.25, U2
  # 6-6.25, U1 8.25-8.5: 8.5 a step. A device per module, one op at a time,
  # keeps the device order (backward before forward): A1, then BW1 before
  # F2, 8.75.
  pool = schedule.simulate([COST] * 3, "local", num_cores=2,
                           module_devices=[0, 0, 0], ops_per_device=2,
                           loop="while")
  assert pool.step_time == pytest.approx(8.5, abs=1e-9)
  one_at_a_time = schedule.simulate([COST] * 3, "local", num_cores=2,
                                    module_devices=[0, 1, 2], loop="while")
  assert one_at_a_time.step_time == pytest.approx(8.75, abs=1e-9)
