"""research.predict_frontier: every cell predicted for one device per
module, from hand-made costs and footprints (nothing profiled)."""

import json

import pytest

from research import benchmark_lib
from research import frontier_lib
from step_model import memory
from step_model import schedule
from tests import binaries

# make test-slow (research.predict_frontier's binary end to end).
pytestmark = pytest.mark.slow

MB = 1e6


def _costs():
  # Module 1 is slow with a costly aux head; module 2 is the last.
  return [schedule.ModuleCost(forward=0.010, input_vjp=0.0, weight_vjp=0.020,
                              aux=0.015, update=0.002, fused_vjp=0.020,
                              accumulate=0.001),
          schedule.ModuleCost(forward=0.004, input_vjp=0.004,
                              weight_vjp=0.006, aux=0.0, update=0.001,
                              fused_vjp=0.008, accumulate=0.001)]


def _footprints(m):
  """One microbatch of batch / m: activations, aux and inputs shrink."""
  fixed = memory.DeviceMemory(weights=1 * MB, slots=1 * MB, gradients=1 * MB)
  return [memory.ModuleFootprint(fixed, 10 * MB / m, 2 * MB / m, 1 * MB / m,
                                 1 * MB / m),
          memory.ModuleFootprint(fixed, 4 * MB / m, 0, 1 * MB / m)]


def _inputs():
  return {"module_costs_ms": benchmark_lib.costs_ms(_costs()),
          "microbatch_costs_ms": {"2": benchmark_lib.costs_ms(
              [c.scaled(0.6) for c in _costs()])},
          "footprints_bytes": {str(m): frontier_lib.footprints_to_json(
              _footprints(m)) for m in (1, 2)},
          "staged_bytes": 0, "plan": "hand-made"}


def test_a_cell_is_the_schedule_models_step_and_the_counts_largest_device():
  micro = {2: [c.scaled(0.6) for c in _costs()]}
  fps = {m: _footprints(m) for m in (1, 2)}
  cell = frontier_lib.predict_cell("2wise-m2-rc", _costs(), micro, fps, 0)
  simulated = schedule.simulate(
      memory.recompute_costs(_costs()), "2wise", num_microbatches=2,
      num_cores=2, thread_efficiency=0.0,
      microbatch_costs=memory.recompute_costs(micro[2])).step_time
  assert cell["step_ms"] == pytest.approx(1e3 * simulated, abs=0.01)
  counted = memory.count(fps[2], 2, recompute=True)
  assert cell["memory_per_device_mb"] == [
      pytest.approx(d.total / MB) for d in counted]
  # By hand, module 1 at M = 2 with recomputation: weights, slots, two
  # gradient sets (3 + 1), one microbatch's activations and aux (5 + 1),
  # both microbatches' inputs (1): 11 MB, the largest device.
  assert cell["memory_mb"] == pytest.approx(11.0)
  # Without recomputation both microbatches are in flight: 4 + 10 + 2 + 1.
  plain = frontier_lib.predict_cell("2wise-m2", _costs(), micro, fps, 0)
  assert plain["memory_mb"] == pytest.approx(17.0)


def test_recomputation_charges_the_forward_again():
  # One module, end to end: forward, weight VJP, update one after another
  # (10 + 20 + 2 ms); recomputing adds the forward (10 ms) to the backward.
  one = [schedule.ModuleCost(forward=0.010, input_vjp=0.0, weight_vjp=0.020,
                             update=0.002)]
  fps = {1: _footprints(1)[:1]}
  assert frontier_lib.predict_cell("e2e", one, {}, fps, 0)[
      "step_ms"] == pytest.approx(32.0)
  assert frontier_lib.predict_cell("e2e-rc", one, {}, fps, 0)[
      "step_ms"] == pytest.approx(42.0)


def test_a_cell_without_its_footprints_is_refused():
  with pytest.raises(ValueError, match=r"batch / 4.*name='e2e-m4'"):
    frontier_lib.predict_cell("e2e-m4", _costs(), {},
                              {1: _footprints(1)}, 0)


def test_the_frontier_keeps_the_cells_no_other_beats_on_both():
  cells = {"a": {"memory_mb": 10.0, "step_ms": 100.0},
           "b": {"memory_mb": 20.0, "step_ms": 50.0},
           "c": {"memory_mb": 15.0, "step_ms": 120.0},  # a beats it
           "d": {"memory_mb": 10.0, "step_ms": 101.0},  # a: as small, faster
           "e": {"memory_mb": 20.0, "step_ms": 50.0},   # ties b: both stay
           "f": {"memory_mb": 10.0, "step_ms": 100.05}}  # a's within 0.1%
  assert frontier_lib.frontier(cells) == ["a", "b", "e", "f"]
  assert frontier_lib.frontier(cells, tolerance=0.0) == ["a", "b", "e"]


def test_each_interlocking_cell_meets_the_fastest_pipeline_that_fits():
  cells = {"e2e-m4": {"memory_mb": 20.0, "step_ms": 80.0},
           "e2e-m2-rc": {"memory_mb": 10.0, "step_ms": 120.0},
           "e2e": {"memory_mb": 5.0, "step_ms": 60.0},  # not a pipeline
           "local": {"memory_mb": 9.9, "step_ms": 100.0},
           "2wise": {"memory_mb": 8.0, "step_ms": 90.0},
           "3wise-m4": {"memory_mb": 25.0, "step_ms": 100.0}}
  out = frontier_lib.versus_pipeline(cells)
  assert set(out) == {"local", "2wise", "3wise-m4"}
  # 10 MB is within 2% of 9.9 MB: equal memory.
  assert out["local"] == {"pipeline": "e2e-m2-rc", "speedup": 1.2}
  assert out["2wise"] == {"pipeline": None, "speedup": None}
  assert out["3wise-m4"] == {"pipeline": "e2e-m4", "speedup": 0.8}


def test_the_measured_error_predicts_the_reports_plan():
  report = {"num_cores": 1, "strategies": {
      "e2e": {"measured_step_s": 0.050, "memory_count_over_measured": 0.9},
      "local-m2": {"measured_step_s": 0.040,
                   "memory_count_over_measured": 1.4},
      "local-lean": {"measured_step_s": 9.0,
                     "memory_count_over_measured": 1.1}}}
  micro = {2: [c.scaled(0.6) for c in _costs()]}
  error = frontier_lib.measured_error(report, _costs(), micro)
  assert set(error["time_cells"]) == {"e2e", "local-m2"}  # lean: no model
  e2e = schedule.simulate(_costs(), "e2e", num_cores=1, module_devices=[0, 1],
                          thread_efficiency=0.0, ops_per_device=2).step_time
  assert error["time_cells"]["e2e"] == pytest.approx(e2e / 0.050, abs=1e-3)
  assert error["memory_count_over_measured"] == [0.9, 1.4]


# In a process of its own: the binary's flags (--num_modules, a list;
# --repeats) share names with other binaries' that this test process
# imports directly.
def test_one_command_predicts_and_draws_from_stored_inputs(tmp_path):
  prefix = tmp_path / "frontier"
  (tmp_path / "frontier_k2.json").write_text(json.dumps({
      "inputs": _inputs()}))
  measured = tmp_path / "measured.json"
  measured.write_text(json.dumps({"num_modules": 2, "num_cores": 2,
                                  "strategies": {"e2e": {
                                      "measured_step_s": 0.05,
                                      "memory_count_over_measured": 0.9}}}))
  proc = binaries.run_binary(
      "research.predict_frontier",
      "--num_modules=2", "--microbatches=1,2", "--batch_size=8",
      f"--measured={measured}", f"--out_prefix={prefix}", "--reuse_inputs")
  out = proc.stdout
  result = json.loads((tmp_path / "frontier_k2.json").read_text())
  assert list(result["cells"]) == frontier_lib.cell_names(
      frontier_lib.STRATEGIES, (1, 2))
  assert result["frontier"] == frontier_lib.frontier(result["cells"])
  assert result["measured_error"]["memory_count_over_measured"] == [0.9, 0.9]
  assert "K = 2: frontier" in out
  png = (tmp_path / "frontier_k2.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_m_that_does_not_divide_the_batch_is_refused(tmp_path):
  proc = binaries.run_binary(
      "research.predict_frontier",
      "--microbatches=1,3", "--batch_size=8",
      f"--out_prefix={tmp_path / 'x'}", "--reuse_inputs", check=False)
  assert proc.returncode == 1
  binaries.one_error(proc.stderr, "--microbatches", "Received: microbatches=")
