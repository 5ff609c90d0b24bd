"""The train binary's threading plan: flags, the plan chosen, placement.

On placement=simulated, --threads_per_device and --modules_per_device set
how K modules map onto logical CPU devices and how many intra-op threads
each op gets (0: the schedule model chooses for this host's cores).
"""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tests import binaries
from tf_interlock import strategy as strategy_lib
from step_model import threading_plan
from train import config as config_lib
from train import runtime_setup

# make test-slow (train.train processes under several threading plans).
pytestmark = pytest.mark.slow

FLAGS = ["--preset=synthetic_mlp", "--placement=simulated", "--mlp_width=64",
         "--train_steps=10", "--steps_per_loop=5", "--seed=3",
         "--checkpoint_every_steps=10", "--eval_every_steps=10"]


def _config(**fields):
  return dataclasses.replace(config_lib.load_preset("synthetic_mlp"),
                             **{"placement": "simulated", **fields})


def test_default_is_one_device_of_one_thread_per_module():
  plan = runtime_setup.simulated_plan(_config())
  assert (plan.num_devices, plan.threads_per_device,
          plan.module_devices) == (4, 1, (0, 1, 2, 3))


def test_fixed_and_chosen_plans():
  plan = runtime_setup.simulated_plan(_config(threads_per_device=2,
                                          modules_per_device=2))
  # On fewer cores than its 4 threads, the plan says they share them.
  cores = threading_plan.host_cores()
  assert plan.describe() == "2 devices x 2 threads, 2 modules each" + (
      f" (4 threads on {cores} cores)" if cores < 4 else "")
  assert plan.module_devices == (0, 0, 1, 1)
  for strategy in ("e2e", "local", "2wise"):
    chosen = runtime_setup.simulated_plan(_config(
        strategy=strategy, threads_per_device=0, modules_per_device=0))
    assert chosen == threading_plan.plan_for(
        4, strategy_lib.parse_strategy(strategy),
        threading_plan.host_cores())


@pytest.mark.parametrize("fields,match", [
    (dict(placement="single", threads_per_device=2),
     "--threads_per_device=2 is invalid: applies only to placement=simulated"),
    (dict(placement="gpu", modules_per_device=2),
     "--modules_per_device=2 is invalid: applies only to placement=simul"),
    (dict(modules_per_device=3), "must divide num_modules=4"),
    (dict(threads_per_device=-1), "must be an integer >= 0"),
])
def test_bad_threading_fields(fields, match):
  with pytest.raises(ValueError, match=match):
    config_lib.validate(_config(**fields))


def _weights(model_dir):
  reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints"))
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if "VARIABLE_VALUE" in n and not n.startswith("save_counter")}


def _main_in_process(flags_given, capfd):
  """train.train's stdout, through its main in this process."""
  code, out, err = binaries.run_main("train.train", flags_given, capfd)
  assert not code, err
  return out


def test_two_modules_per_device_train_the_same_weights(tmp_path, capfd):
  # The default plan, one device of one thread per module, fits the four
  # logical devices of this process (conftest.py): it runs here, through
  # the binary's main. Two threads per op need a process of their own (the
  # thread pools are fixed when TF starts): the real binary.
  out = {"one_each": _main_in_process(
      [*FLAGS, f"--model_dir={tmp_path / 'one_each'}"], capfd)}
  out["shared"] = binaries.run_binary(
      "train.train", *FLAGS, "--threads_per_device=2",
      "--modules_per_device=2", f"--model_dir={tmp_path / 'shared'}").stdout
  summaries = {name: json.loads(text.strip().splitlines()[-1])
               for name, text in out.items()}
  cores = threading_plan.host_cores()
  on_cores = f" (4 threads on {cores} cores)" if cores < 4 else ""
  assert summaries["one_each"]["threading"] == "4 devices x 1 thread" + (
      on_cores)
  assert summaries["shared"]["threading"] == (
      "2 devices x 2 threads, 2 modules each" + on_cores)
  a = _weights(str(tmp_path / "one_each"))
  b = _weights(str(tmp_path / "shared"))
  assert a.keys() == b.keys() and len(a) >= 8
  # Where the ops run changes only the order of float sums.
  for key in a:
    np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strategy,variant,expected", [
    ("2wise-sum", None, "sum"), ("2wise", None, "only"),
    ("2wise", "sum", "sum"), ("3wise-sum", "sum", "sum")])
def test_the_binary_trains_the_variant_the_strategy_names(strategy, variant,
                                                          expected):
  # --strategy=2wise-sum once trained "only": the config's default variant
  # silently overrode the suffix.
  from train import train_lib  # pylint: disable=g-import-not-at-top
  fields = {} if variant is None else {"variant": variant}
  config = _config(strategy=strategy, placement="single", mlp_width=8,
                   **fields)
  config_lib.validate(config)
  trainer, _, _ = train_lib.build(config)
  assert trainer.strategy.variant == expected


@pytest.mark.parametrize("loop_block,loop,block", [(0, "auto", 1),
                                                   (1, "while", 1),
                                                   (2, "while", 2)])
def test_loop_block_reaches_the_trainer(loop_block, loop, block):
  # --loop_block: how a call's steps_per_loop steps are written into the
  # graph (tf_interlock.step_loop), another question than the threads but
  # asked of the same binary.
  from train import train_lib  # pylint: disable=g-import-not-at-top
  config = _config(strategy="local", placement="single", mlp_width=8,
                   steps_per_loop=4, loop_block=loop_block)
  config_lib.validate(config)
  trainer, task, _ = train_lib.build(config)
  assert (trainer.options.execution.loop, trainer.options.execution.loop_block) == (loop, block)
  iterator = iter(trainer.distribute_dataset(task.train))
  graph = trainer.loop_function(4).get_concrete_function(iterator).graph
  # Local at K = 4 on the CPU: the library's loop is the pipeline
  # (tf_interlock.pipelined_loop; 4 steps fill, run one full iteration and
  # drain it, no While); --loop_block=U loops blocks of U steps.
  made = trainer.loop_function(4).python_function.__qualname__
  assert ("make_pipelined_loop" in made) == (loop == "auto"), made
  assert ("While" in [op.type for op in graph.get_operations()]) == (
      loop == "while")
  before = [v.numpy() for v in trainer.variables(0)]
  trainer.train_loop(iterator)
  assert any(not np.array_equal(a, v.numpy())
             for a, v in zip(before, trainer.variables(0)))
