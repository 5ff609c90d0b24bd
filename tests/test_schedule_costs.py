"""The schedule model's measured op shapes: the engine's fused backward pass,
gradient accumulation across microbatches, and microbatch-sized op costs
(step_model/schedule.py), and the profiler that measures them.

Costs are dyadic fractions so that every hand-derived time is exact.
"""

import dataclasses

import numpy as np
import pytest

from step_model import profiling
from step_model import schedule
from step_model.schedule import ModuleCost
from research import benchmark_lib
from research import validation_report

# Module 1 (k = 0) never sends a cotangent; module 2's weight VJP alone
# costs 3, but its fused backward pass (input and weight VJP in one) costs
# 3.5, of which the input VJP is 1: its weight part is 2.5.
FIRST = ModuleCost(forward=1.0, input_vjp=0.0, weight_vjp=1.0)
SECOND = ModuleCost(forward=1.0, input_vjp=1.0, weight_vjp=3.0,
                    fused_vjp=3.5)


def test_e2e_pays_the_fused_weight_part():
  # e2e, K = 2 on 2 devices, no aux heads, no update costs. Step 0: F1
  # 0-1, F2 1-2, BX2 2-3, then BW1 3-4 on device 1 and BW2 on device 2
  # from 3. The next F1 runs 4-5 (U1 after BW1), hidden behind BW2; the
  # next F2 waits for BW2 (and U2). So device 2 bounds the step: F2 + BX2
  # + BW2, with the fused weight part BW2 = 3.5 - 1 = 2.5: 4.5; with the
  # weight VJP alone, 3: 5.
  fused = schedule.simulate([FIRST, SECOND], "e2e", has_aux=[False, False])
  plain = schedule.simulate(
      [FIRST, dataclasses.replace(SECOND, fused_vjp=None)], "e2e",
      has_aux=[False, False])
  assert fused.step_time == pytest.approx(4.5, abs=1e-9)
  assert plain.step_time == pytest.approx(5.0, abs=1e-9)


def test_local_never_fuses():
  # Local: module 2 sends nothing down, so its weight VJP runs alone (3):
  # F2 + BW2 = 4 per step on device 2, whatever fused_vjp says (module 1's
  # aux head costs nothing here).
  for second in (SECOND, dataclasses.replace(SECOND, fused_vjp=None)):
    result = schedule.simulate([FIRST, second], "local",
                               has_aux=[True, False])
    assert result.step_time == pytest.approx(4.0, abs=1e-9)


def test_microbatches_after_the_first_accumulate():
  plan = schedule.routing.make_plan("e2e", 2, [False, False])
  costs = [dataclasses.replace(c, accumulate=0.25) for c in (FIRST, SECOND)]
  micro = [c.scaled(0.5) for c in costs]
  ops = schedule._step_template(plan, costs, micro, [False, False], 2)  # pylint: disable=protected-access
  bw = {(op.module, op.microbatch): op.cost for op in ops if op.kind == "BW"}
  # Module 1: weight VJP 1 / 2 = 0.5, plus 0.125 (half of the scaled
  # accumulate) on microbatch 2. Module 2: fused part (3.5 - 1) / 2.
  assert bw == {(0, 0): 0.5, (0, 1): 0.625, (1, 0): 1.25, (1, 1): 1.375}


def test_default_microbatch_costs_keep_the_full_accumulation():
  # Without measured microbatch costs an op costs 1/M of the full batch's,
  # but summing two gradients has the weights' size whatever M: e2e with
  # M = 2 on one module (F, BW, U): 2 x (0.5 + 0.5) + 0.25 for the sum.
  one = dataclasses.replace(FIRST, accumulate=0.25)
  result = schedule.simulate([one], "e2e", num_microbatches=2)
  assert result.step_time == pytest.approx(2.25, abs=1e-9)


def test_measured_microbatch_costs_replace_the_scaled_ones():
  costs = [FIRST, SECOND]
  scaled = [c.scaled(0.25) for c in costs]
  kwargs = dict(num_microbatches=4, has_aux=[False, False])
  default = schedule.simulate(costs, "e2e", **kwargs).step_time
  same = schedule.simulate(costs, "e2e", microbatch_costs=scaled,
                           **kwargs).step_time
  dearer = schedule.simulate(costs, "e2e",
                             microbatch_costs=[c.scaled(0.5) for c in costs],
                             **kwargs).step_time
  assert same == pytest.approx(default, abs=1e-9)
  # Every microbatch op twice as dear: the step grows, but the updates
  # (none here) would not.
  assert dearer == pytest.approx(2 * default, abs=1e-9)
  with pytest.raises(ValueError, match="microbatch_costs needs one"):
    schedule.simulate(costs, "e2e", microbatch_costs=scaled[:1], **kwargs)
  with pytest.raises(ValueError, match="Received: costs"):
    schedule.simulate(costs, "e2e", microbatch_costs=[
        dataclasses.replace(FIRST, accumulate=-1.0), SECOND], **kwargs)


def test_costs_ms_round_trip_and_old_rows():
  costs = [dataclasses.replace(FIRST, accumulate=0.25), SECOND]
  rows = benchmark_lib.costs_ms(costs)
  assert rows[0][5:] == [None, 250.0] and rows[1][5:] == [3500.0, 0.0]
  assert benchmark_lib.costs_from_ms(rows) == costs
  # A five-column row (written before fused VJP and accumulation were
  # measured) leaves them unmeasured.
  old = benchmark_lib.costs_from_ms([[1000.0, 0.0, 3000.0, 0.0, 0.0]])
  assert old == [ModuleCost(1.0, 0.0, 3.0)]
  assert old[0].fused_vjp is None and old[0].accumulate == 0.0


def test_predict_takes_the_cells_microbatch_costs():
  costs = [FIRST, SECOND]
  dearer = {4: [c.scaled(0.5) for c in costs]}
  plain = benchmark_lib.predict(costs, "e2e-m4", num_cores=2)
  measured = benchmark_lib.predict(costs, "e2e-m4", num_cores=2,
                                   microbatch_costs=dearer)
  assert measured > plain
  # e2e (M = 1) ignores every microbatch profile.
  assert benchmark_lib.predict(costs, "e2e", num_cores=2,
                               microbatch_costs=dearer) == \
      benchmark_lib.predict(costs, "e2e", num_cores=2)


def test_report_shows_microbatch_overheads():
  group = {"module_costs_ms": [[2.0, 0.0, 4.0, 0.0, 0.0, 4.0, 1.0]],
           "microbatch_costs_ms": {"2": {"module_costs_ms": [
               [1.5, 0.0, 2.0, 0.0, 0.0, 3.0, 1.0]]}}}
  lines = validation_report._microbatch_lines(group)  # pylint: disable=protected-access
  # forward 1.5 x 2 / 2, fused 3 x 2 / 4, weight 2 x 2 / 4.
  assert lines[-1] == "| 2 | 1.50 / 1.50 / 1.00 |"


def test_profiler_measures_the_fused_pass_and_the_accumulation():
  spec = benchmark_lib.make_spec("mlp", num_modules=2, width=64,
                                 layers_per_module=2, batch_size=32)
  trainer = benchmark_lib.build_trainer(spec, "e2e", placement=None)
  x, y = benchmark_lib.make_batch(spec)
  costs = profiling.measure_module_costs(trainer, x, y, repeats=3)
  assert len(costs) == 2
  # Module 1 is never fused: its fused cost is its weight VJP.
  assert costs[0].fused_vjp == costs[0].weight_vjp
  for cost in costs:
    assert cost.fused_vjp is not None and np.isfinite(cost.fused_vjp)
    assert cost.accumulate > 0.0


def test_a_shared_inter_op_pool_runs_one_devices_ops_at_once():
  # K = 1, e2e, M = 2 (each microbatch op costs half of f = bw = 1). One op
  # at a time: F, F, BW, BW back to back = 2. With two inter-op threads
  # that may both run the device's ops (a simulated device) and two cores,
  # both microbatches' forwards run together, then both weight VJPs: 1.
  one = ModuleCost(forward=1.0, input_vjp=0.0, weight_vjp=1.0)
  kwargs = dict(num_microbatches=2, num_cores=2)
  assert schedule.simulate([one], "e2e", **kwargs).step_time == \
      pytest.approx(2.0, abs=1e-9)
  assert schedule.simulate([one], "e2e", ops_per_device=2,
                           **kwargs).step_time == pytest.approx(1.0, abs=1e-9)
  # The cores still bound it: one core, one op at a time.
  assert schedule.simulate([one], "e2e", ops_per_device=2,
                           num_microbatches=2, num_cores=1).step_time == \
      pytest.approx(2.0, abs=1e-9)
  with pytest.raises(ValueError, match="Received: ops_per_device=0"):
    schedule.simulate([one], "e2e", ops_per_device=0)


def test_microbatch_ops_run_in_order_inside_one_graph():
  # Each call's inputs wait, through control dependencies, for every output
  # of the call before: one device's microbatches, one after another.
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  xs = [tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0]),
        tf.constant([5.0, 6.0])]
  fn = tf.function(lambda: profiling._in_order(  # pylint: disable=protected-access
      lambda x: (x * 2.0, x + 1.0), xs), autograph=False)
  out = fn()
  # Each output's first element only: the calls' buffers are not kept.
  np.testing.assert_allclose([t.numpy() for t in out],
                             [[2], [2], [6], [4], [10], [6]])
  graph = fn.get_concrete_function().graph
  waits = [op for op in graph.get_operations()
           if op.type == "Identity" and op.control_inputs]
  # Calls 2 and 3 wait for both outputs of the call before theirs (their
  # first elements, sliced from the Mul and the AddV2).
  assert len(waits) == 2
  for op in waits:
    assert [c.type for c in op.control_inputs] == ["StridedSlice"] * 2
    assert sorted(c.inputs[0].op.inputs[0].op.type
                  for c in op.control_inputs) == ["AddV2", "Mul"]


def test_one_calls_time_is_shared_by_its_ops(monkeypatch):
  # A fake clock: every call of fn takes 8 s and holds 4 ops, so each op's
  # time is 2 s; the warm-up calls are not timed.
  clock = [0.0]
  monkeypatch.setattr(profiling.time, "perf_counter", lambda: clock[0])

  def fn():
    clock[0] += 8.0
    return []

  assert profiling._median_time(fn, repeats=3, calls=4) == 2.0  # pylint: disable=protected-access
  assert profiling._median_time(fn, repeats=3) == 8.0  # pylint: disable=protected-access


@pytest.mark.parametrize("microbatches", [0, 3, 2.0, True])
def test_the_profiler_rejects_microbatches_that_do_not_divide(microbatches):
  spec = benchmark_lib.make_spec("mlp", num_modules=2, width=16,
                                 layers_per_module=1, batch_size=32)
  trainer = benchmark_lib.build_trainer(spec, "e2e", placement=None)
  x, y = benchmark_lib.make_batch(spec)
  with pytest.raises(ValueError, match=r"divides the batch of 32\. "
                     rf"Received: microbatches={microbatches!r}$"):
    profiling.measure_module_costs(trainer, x, y, repeats=1,
                                   microbatches=microbatches)


def test_the_profiler_times_microbatches_of_the_whole_batch():
  spec = benchmark_lib.make_spec("mlp", num_modules=2, width=64,
                                 layers_per_module=2, batch_size=32)
  trainer = benchmark_lib.build_trainer(spec, "e2e", placement=None)
  x, y = benchmark_lib.make_batch(spec)
  before = [v.numpy() for v in trainer.variables(0)]
  costs = profiling.measure_module_costs(trainer, x, y, repeats=2,
                                         microbatches=4)
  assert len(costs) == 2
  for cost in costs:
    for field in dataclasses.fields(cost):
      value = getattr(cost, field.name)
      assert value is not None and np.isfinite(value) and value >= 0.0
    assert cost.forward > 0.0 and cost.accumulate > 0.0
  # Profiling never trains: the trainer's weights are untouched.
  for old, new in zip(before, trainer.variables(0)):
    np.testing.assert_array_equal(old, new.numpy())
