"""research.benchmark_lib's workloads are production Configs built by the
production builders (train/networks.py, train/optimization.py)."""

import contextlib

import keras
import numpy as np
import pytest

from research import benchmark_lib
from step_model import profiling
from step_model import schedule
from tf_interlock import placement as placement_lib
from train import config as config_lib
from train import optimization


def _layers(layer, kind):
  """Every layer of class `kind` under `layer` (itself included), in order."""
  every = layer._flatten_layers()  # pylint: disable=protected-access
  return [l for l in every if isinstance(l, kind)]


def _dense_units(layer):
  return [l.units for l in _layers(layer, keras.layers.Dense)]


def test_mlp_spec_is_a_config_built_by_the_production_mlp_builder():
  spec = benchmark_lib.make_spec("mlp", num_modules=3, width=16,
                                 layers_per_module=2, batch_size=8,
                                 steps_per_loop=4)
  config = spec.config
  assert (config.network.model, config.network.mlp_width, config.interlock.num_modules, config.interlock.split,
          config.run.batch_size, config.run.steps_per_loop) == (
              "mlp", 16, 3, (2, 2, 2), 8, 4)
  modules = benchmark_lib.build_modules(spec)
  # The production MLP's names, its layers: 2 hidden Dense(16) per module,
  # the output Dense(10) in module 3, a Dense(10) aux head before it.
  assert [m.name for m in modules] == ["mlp1", "mlp2", "mlp3"]
  assert [_dense_units(m.body) for m in modules] == [
      [16, 16], [16, 16], [16, 16, benchmark_lib.NUM_CLASSES]]
  assert [m.aux_head is not None for m in modules] == [True, True, False]
  bare = benchmark_lib.build_modules(spec, aux_heads=False)
  assert [m.aux_head for m in bare] == [None] * 3
  assert [_dense_units(m.body) for m in bare] == [
      _dense_units(m.body) for m in modules]
  x, y = benchmark_lib.make_batch(spec)
  assert x.shape == (8, 16) and x.dtype == np.float32
  assert y.shape == (8,) and 0 <= y.min() and y.max() < 10


def test_lm_spec_takes_the_fortunes_lm_presets_shape():
  preset = config_lib.load_preset("fortunes_lm")
  spec = benchmark_lib.make_spec("lm", num_modules=2, layers_per_module=3,
                                 batch_size=4)
  config = spec.config
  for field in ("vocab_size", "seq_len", "d_model", "num_heads", "mlp_dim",
                "dataset"):
    assert config.get(field) == preset.get(field), field
  assert (config.network.num_layers, config.interlock.split) == (6, (3, 3))
  assert spec.task.num_classes == preset.data.vocab_size
  x, y = benchmark_lib.make_batch(spec)
  assert x.shape == y.shape == (4, preset.network.seq_len)
  # Labels are the next token of the same random stream.
  np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
  assert x.max() < preset.data.vocab_size


def test_resnet_spec_without_heads_is_split_as_aux_head_none():
  spec = benchmark_lib.make_spec("resnet", num_modules=3, image_size=16,
                                 resnet_aux_head="pool")
  assert spec.config.network.aux_head == "pool"
  assert spec.task.input_shape == (16, 16, 3)
  with_heads = benchmark_lib.build_modules(spec)
  assert [m.aux_head is not None for m in with_heads] == [True, True, False]
  bare = benchmark_lib.build_modules(spec, aux_heads=False)
  assert [m.aux_head for m in bare] == [None] * 3
  # One replica, as plain Keras: no BatchNormalization all-reduces.
  norms = [l for m in with_heads
           for l in _layers(m, keras.layers.BatchNormalization)]
  assert norms and not any(l.synchronized for l in norms)


def test_every_module_gets_the_production_sgd():
  spec = benchmark_lib.make_spec("mlp")
  optimizer = optimization.make_optimizer(spec.config, None)
  assert isinstance(optimizer, keras.optimizers.SGD)
  assert np.isclose(float(optimizer.learning_rate), 0.01)
  assert optimizer.momentum == 0.9 and optimizer.weight_decay is None


def test_a_pipeline_cell_is_predicted_from_its_own_microbatch_profile():
  """measure_strategies profiles an e2e-mM cell's ops at batch / M (M at a
  time in one graph) and predicts from them, not from the whole batch's
  costs scaled by 1/M; a cell without microbatches uses the whole batch's."""
  spec = benchmark_lib.make_spec("mlp", num_modules=2, width=16,
                                 batch_size=8, steps=1, steps_per_loop=2)
  devices = [0, 1]
  placement = placement_lib.make_placement("simulated", 2,
                                           module_devices=devices)
  rows, costs = benchmark_lib.measure_strategies(
      spec, ["e2e", "e2e-m2"], placement, num_cores=2,
      module_devices=devices)

  def whole_batch_prediction(name):
    # Two devices on two cores, one op on one: each cell's costs are
    # scaled to its step's work (`work_scale`) before they are simulated.
    scale = rows[name]["cost_scale"]
    return benchmark_lib.predict([c.scaled(scale) for c in costs], name, 2,
                                 module_devices=devices, ops_per_device=2)

  assert rows["e2e"]["predicted_step_s"] == whole_batch_prediction("e2e")
  piped = rows["e2e-m2"]["predicted_step_s"]
  assert 0 < piped < float("inf")
  assert piped != whole_batch_prediction("e2e-m2")
  for row in rows.values():
    assert row["measured_step_s"] > 0 and row["serial_step_s"] > 0
    assert row["cost_scale"] == row["serial_step_s"] / row["charged_work_s"]
  # Each row names the loop its trainer ran (research.replay_predictions).
  assert (rows["e2e"]["loop"], rows["e2e"]["loop_block"]) == ("while", 1)


def test_a_plan_on_one_ops_cores_keeps_the_timed_costs():
  # One device: timed on one op's cores the step is the step itself, so
  # its costs are not scaled to it (the prediction would be the measurement).
  spec = benchmark_lib.make_spec("mlp", num_modules=2, width=16,
                                 batch_size=8, steps=1, steps_per_loop=2)
  placement = placement_lib.make_placement("simulated", 2,
                                           module_devices=[0, 0])
  rows, costs = benchmark_lib.measure_strategies(
      spec, ["local"], placement, num_cores=2, module_devices=[0, 0])
  assert "cost_scale" not in rows["local"]
  assert rows["local"]["predicted_step_s"] == benchmark_lib.predict(
      costs, "local", 2, module_devices=[0, 0], ops_per_device=1)


def test_work_scale_times_the_step_on_one_ops_cores(monkeypatch):
  spec = benchmark_lib.make_spec("mlp", num_modules=2, width=16,
                                 batch_size=8, steps=1, steps_per_loop=2)
  placement = placement_lib.make_placement("simulated", 2,
                                           module_devices=[0, 1])
  trainer = benchmark_lib.build_trainer(spec, "local", placement)
  pinned, holding = [], profiling.holding_cores

  @contextlib.contextmanager
  def recording(cores):
    pinned.append(cores)
    with holding(cores) as chosen:
      yield chosen

  monkeypatch.setattr(profiling, "holding_cores", recording)
  cost = schedule.ModuleCost(forward=0.5, input_vjp=0.25, weight_vjp=0.25,
                             aux=0.5, update=0.5)
  out = benchmark_lib.work_scale(trainer, spec, "local", [cost, cost], None,
                                 cores=1, calls=2)
  # Local at K = 2 charges module 1 F + A + BW + U = 1.75 and module 2
  # (no aux head, no input VJP) F + BW + U = 1.25.
  assert out["charged_work_s"] == pytest.approx(3.0)
  assert pinned == [1]
  assert 0 < out["serial_step_s"] < 3.0
  assert out["cost_scale"] == out["serial_step_s"] / 3.0


def test_without_op_costs_the_table_shows_dashes_for_the_model():
  # --costs=false: no prediction anywhere, a pipeline cell among the rows.
  rows = {"e2e": {"measured_step_s": 0.10, "predicted_step_s": None},
          "e2e-m2": {"measured_step_s": 0.08, "predicted_step_s": None},
          "2wise": {"measured_step_s": 0.05, "predicted_step_s": None}}
  benchmark_lib.add_speedups(rows, rows["e2e"], plain_step_s=0.12)
  assert rows["2wise"]["measured_speedup"] == 2.0
  assert rows["2wise"]["measured_speedup_vs_pipeline"] == 0.08 / 0.05
  assert rows["2wise"]["predicted_speedup"] is None
  assert rows["2wise"]["predicted_speedup_vs_pipeline"] is None
  assert rows["2wise"]["model_over_measured"] is None
  table = benchmark_lib.format_table(
      {"placement": "simulated", "strategies": rows})
  line = next(l for l in table.splitlines() if l.startswith("2wise"))
  assert line.split()[1:] == ["simulated", "50.0", "-", "-", "-", "-",
                              "2.40x", "2.00x", "-", "1.60x", "-"]
  # No cell was scaled to its step's work: no line says so.
  assert "op costs scaled" not in table


def test_the_table_names_each_cells_cost_scale():
  rows = {"e2e": {"measured_step_s": 0.10, "predicted_step_s": 0.09,
                  "cost_scale": 0.8},
          "local-m8": {"measured_step_s": 0.05, "predicted_step_s": 0.05,
                       "cost_scale": 0.812}}
  table = benchmark_lib.format_table(
      {"placement": "simulated", "strategies": rows})
  assert ("op costs scaled to the step's work timed on one op's cores: "
          "e2e 0.80, local-m8 0.81") in table.splitlines()


def test_baselines_before_and_after_are_averaged_and_their_drift_named():
  before = {"plain_keras_step_s": 0.040, "e2e_single_step_s": 0.044,
            "e2e_overhead_vs_keras": 1.1, "baseline_threads": 2}
  after = dict(before, plain_keras_step_s=0.050, e2e_single_step_s=0.056)
  merged = benchmark_lib.merge_baselines([before, after])
  assert merged["plain_keras_step_s"] == pytest.approx(0.045)
  assert merged["e2e_single_step_s"] == pytest.approx(0.050)
  assert merged["e2e_overhead_vs_keras"] == pytest.approx(0.050 / 0.045)
  assert merged["plain_keras_runs_s"] == [0.040, 0.050]
  assert merged["baseline_drift"] == pytest.approx(0.25)
  table = benchmark_lib.format_table(dict(merged, placement="simulated",
                                          strategies={}))
  assert "40.0, 50.0 ms/step" in table
  assert "warning: plain Keras ran 25% apart" in table
  # Two runs within BASELINE_DRIFT of each other: no warning.
  steady = benchmark_lib.merge_baselines([before, dict(
      before, plain_keras_step_s=0.042)])
  assert "warning" not in benchmark_lib.format_table(
      dict(steady, placement="simulated", strategies={}))


def test_a_cells_loop_suffix_reaches_its_trainer():
  spec = benchmark_lib.make_spec("mlp", num_modules=2, width=16,
                                 batch_size=8, steps=1, steps_per_loop=3)
  placement = placement_lib.make_placement("simulated", 2)
  loops = {}
  for name in ("local", "local-unrolled"):
    trainer = benchmark_lib.build_trainer(spec, name, placement)
    assert trainer.strategy.name == "local"
    loops[name] = trainer.options.execution.loop
    # The call of 3 steps runs the loop asked for ("auto": the pipeline).
    made = trainer.loop_function(3).python_function.__qualname__
    assert ("make_pipelined_loop" in made) == (name == "local"), made
  assert loops == {"local": "auto", "local-unrolled": "unrolled"}


def test_a_cell_is_predicted_in_the_loop_its_trainer_runs():
  # The schedule model is given the loop the cell's trainer settles on
  # (`InterlockTrainer.resolved_loop`); `cell_run_loop` names it before
  # any trainer exists (the plan chooser's predictions).
  spec = benchmark_lib.make_spec("mlp", num_modules=2, width=16,
                                 batch_size=8, steps=1, steps_per_loop=2)
  placement = placement_lib.make_placement("simulated", 2)
  want = {"local": "pipelined", "local-unrolled": "unrolled",
          "local-lean": "unrolled", "local-while": "while", "e2e": "while",
          "e2e-m2": "while", "2wise": "while", "2wise-m2-rc": "while"}
  got = {name: benchmark_lib.build_trainer(spec, name,
                                           placement).resolved_loop
         for name in want}
  assert got == want
  assert {name: benchmark_lib.cell_run_loop(name, 2) for name in want} == want
  # K = 3: 2-wise no longer covers every module, and keeps the unrolled
  # steps; the model then predicts other step times for other loops.
  assert benchmark_lib.cell_run_loop("2wise", 3) == "unrolled"
  costs = [schedule.ModuleCost(forward=1.0, input_vjp=2.0, weight_vjp=3.0,
                               aux=0.5, update=0.25)] * 3
  times = {loop: benchmark_lib.predict(costs, "local", 2, loop=loop)
           for loop in ("pipelined", "unrolled")}
  assert times == pytest.approx({"pipelined": 9.0, "unrolled": 6.875})
  assert benchmark_lib.predict(costs, "local", 2) == times["pipelined"]
  # The trainer's block of steps (`loop_plan`) reaches the model too: for
  # 2-wise, K = 3 on 3 cores each block's end waits for every module
  # (1 step: 8.25 a step, blocks of 2: 8.0, all written out: 7.75).
  blocks = [benchmark_lib.predict(costs, "2wise", 3, loop="while",
                                  loop_block=u) for u in (1, 2)]
  assert blocks + [benchmark_lib.predict(costs, "2wise", 3)] == (
      pytest.approx([8.25, 8.0, 7.75]))
  # research.benchmark's MLP at its defaults keeps its 16 unrolled steps
  # (16 weights x 16 <= `max_block_weights`); 8 microbatches write out 8x
  # the weights a step, in blocks of 2 steps.
  spec = benchmark_lib.make_spec("mlp")
  assert [benchmark_lib.build_trainer(spec, name, None).loop_plan()
          for name in ("2wise", "2wise-m8")] == [("unrolled", 1), ("while", 2)]


def test_a_cell_whose_loop_cannot_run_is_refused_before_anything_runs():
  # The loop a cell's name ends with (or one loop for every cell, as
  # research.real_models's --loop) must be one its trainer runs at each K.
  benchmark_lib.check_cells(["local-pipelined", "2wise", "e2e-while"], 8,
                            num_modules=[2, 4])
  with pytest.raises(ValueError) as error:
    benchmark_lib.check_cells(["local", "2wise-pipelined"], 8,
                              num_modules=[4])
  assert str(error.value) == (
      "--strategies='local,2wise-pipelined' is invalid: '2wise-pipelined' "
      "cannot run at K = 4: loop='pipelined' runs local learning only, in "
      "one process and one replica: a gradient crosses a module (a window "
      "of 2 over 4 modules). Received: strategies='local,2wise-pipelined'")
  # e2e at K = 2 is a window over both modules; local-lean one at a time.
  for names in (["local", "e2e"], ["local-lean"]):
    with pytest.raises(ValueError, match=rf"'{names[-1]}' cannot run at "
                       rf"K = 2: loop='pipelined'"):
      benchmark_lib.check_cells(names, 8, num_modules=[2], loop="pipelined")
