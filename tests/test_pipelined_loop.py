"""Local learning's steps as a pipeline in a graph loop (`pipelined_loop`):
module k on step t - k, the same numbers as the unrolled steps."""

import keras
import numpy as np
import pytest

from tests import helpers
from tests.keras_models import sequential_cnn
from tests.loop_runs import run as _run
from tf_interlock import pipelined_loop
from tf_interlock import routing
from tf_interlock import step_loop
from tf_interlock.execution_options import ExecutionOptions
from tf_interlock.keras import split as keras_split
from tf_interlock.keras.model import InterlockModel


@pytest.mark.parametrize("num_modules", [1, 2, 3, 5])
@pytest.mark.parametrize("num_steps", [1, 2, 4, 7])
def test_every_module_runs_every_step_once_in_order(num_modules, num_steps):
  schedule = pipelined_loop.iterations(num_modules, num_steps)
  assert len(schedule) == num_steps + num_modules - 1
  for k in range(num_modules):
    # Module k works on step i - k at iteration i: steps 0..S-1, in order,
    # and always one iteration after module k - 1 worked on the same step
    # (its h_{k-1} is carried one iteration).
    steps = [i - k for i, active in enumerate(schedule) if k in active]
    assert steps == list(range(num_steps))
  full = [active for active in schedule
          if active == tuple(range(num_modules))]
  assert len(full) == max(0, num_steps - num_modules + 1)
  # The graph holds a module's step once per written-out iteration it
  # works in (the fill, the drain and the full iterations a block of U
  # leaves over), and U times in the loop body (when there is a loop).
  for block in (1, 2, 3):
    trips, rest = divmod(len(full), block)
    written = [active for active in schedule if active not in full[:1]]
    copies = {sum(k in active for active in written) + rest
              + block * bool(trips) for k in range(num_modules)}
    assert [pipelined_loop.traced_copies(num_modules, num_steps, block)] == (
        list(copies) if full else [num_steps])


# K = 3, 5 steps (two fill, three full iterations in the loop, two drain);
# 2 steps (fewer than K: no loop, every iteration written out) with two
# microbatches; K = 4, 5 steps (two trips); K = 2, 4 steps with the
# per-module functions traced (4 calls each, unrolled). Both sides op by
# op or both traced: the loop alone differs.
# K = 2, 6 steps in blocks of 2 (5 full iterations: one written out, two
# trips through the loop).
@pytest.mark.parametrize(
    "microbatches,steps_per_loop,num_modules,traced,block", [
        (1, 5, 3, False, 1), (2, 2, 3, False, 1),
        # 16 s: a longer fill and drain than K = 3's (make test-slow).
        pytest.param(1, 5, 4, False, 1, marks=pytest.mark.slow),
        (1, 4, 2, True, 1), (1, 6, 2, False, 2)])
def test_pipelined_equals_unrolled_bit_for_bit(microbatches, steps_per_loop,
                                               num_modules, traced, block):
  want, _, want_w, _, _ = _run("unrolled", "local", microbatches, traced,
                               steps_per_loop, num_modules)
  got, built, got_w, trainer, _ = _run("pipelined", "local", microbatches,
                                       traced, steps_per_loop, num_modules,
                                       block=block)
  assert len(got_w) == len(want_w)
  for a, b in zip(got_w, want_w):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(got_w, built))
  # The means' sums are taken in another order (one float32 ulp seen).
  for a, b in zip(got, want):
    assert a.keys() == b.keys()
    np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a],
                               rtol=3e-7)
  # Two calls of steps_per_loop and one of 2 steps: every module took them
  # all (the drain ran).
  assert [int(o.iterations) for o in trainer.optimizers] == [
      2 * steps_per_loop + 2] * num_modules


def test_graph_holds_each_module_k_times_not_once_per_step():
  graphs = {}
  for loop, block, steps, num_modules in (
      ("unrolled", 1, 5, 3), ("pipelined", 1, 5, 3), ("unrolled", 1, 6, 2),
      ("pipelined", 2, 6, 2)):
    run = _run(loop, "local", 1, False, steps, num_modules, block=block)
    graphs[loop, block, steps] = run.trainer.loop_function(
        steps).get_concrete_function(run.iterator).graph
  counts = {}
  for loop, graph in graphs.items():
    ops = [op.type for op in graph.get_operations()]
    library = graph.as_graph_def().library.function
    inner = [node.op for f in library for node in f.node_def]
    counts[loop] = (ops.count("While"), ops.count("IteratorGetNext"),
                    inner.count("IteratorGetNext"),
                    ops.count("MatMul") + inner.count("MatMul"))
  # Unrolled: 5 batches read, 5 steps of 3 modules written out. Pipelined:
  # 2 fill iterations read a batch each, the body (a function the While
  # calls) reads one per trip; each module is written 3 times (fill,
  # body, drain), not 5. K = 2, 6 steps in blocks of 2: one fill
  # iteration, and of the 5 full ones one is written out and 2 are the
  # body: each module 4 times, not 6.
  assert counts["unrolled", 1, 5][:3] == (0, 5, 0)
  assert counts["pipelined", 1, 5][:3] == (1, 2, 1)
  assert counts["pipelined", 1, 5][3] * 5 == counts["unrolled", 1, 5][3] * 3
  assert counts["pipelined", 2, 6][:3] == (1, 2, 2)
  assert counts["pipelined", 2, 6][3] * 6 == counts["unrolled", 1, 6][3] * 4


def test_auto_pipelines_local_learning_only():
  plan = routing.make_plan
  local = plan("local", 3)
  resolve = step_loop.resolve_loop
  assert resolve("auto", local) == "pipelined"
  # What the pipeline cannot run keeps the unrolled steps under "auto",
  # and is one line naming why when asked for.
  refused = {
      "window": dict(plan=plan("2wise", 3)),
      "tied": dict(plan=local, ties=[(0, 1)]),
      "replicas": dict(plan=local, replicas=2),
      "processes": dict(plan=local, one_process=False),
      "memory_lean": dict(plan=local, memory_lean=True),
      "XLA": dict(plan=local, compiles_step=True),
  }
  for why, kwargs in refused.items():
    assert resolve("auto", **kwargs) == "unrolled", why
    with pytest.raises(ValueError) as raised:
      resolve("pipelined", **kwargs)
    message = str(raised.value)
    assert "\n" not in message and message.endswith(
        "Received: loop='pipelined'"), message
  assert "window of 2 over 3" in str(pytest.raises(
      ValueError, resolve, "pipelined", plan("2wise", 3)).value)
  # A device per module (GPUs, TPUs): not measured there; unrolled.
  assert resolve("auto", local, on_accelerator=True) == "unrolled"
  assert resolve("pipelined", local, on_accelerator=True) == "pipelined"


def test_fit_runs_the_pipeline_by_default_and_equals_unrolled():
  rng = np.random.default_rng(5)
  x = rng.normal(size=(40, 8, 8, 1)).astype("float32")
  y = rng.integers(0, 10, size=40).astype("int32")
  got = {}
  for loop in ("auto", "unrolled"):
    keras.utils.set_random_seed(0)
    model = InterlockModel(keras_split.from_keras(sequential_cnn(size=8), 3),
                           strategy="local", placement="simulated")
    model.compile(keras.optimizers.SGD(0.05), metrics=["accuracy"],
                  steps_per_execution=4,
                  execution_options=ExecutionOptions(loop=loop))
    # 5 steps an epoch: one call of 4 (pipelined) and one of 1.
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                        shuffle=False)
    got[loop] = ([v.numpy() for m in model.interlock_modules
                  for v in m.weights], history.history)
    # The call of 4 steps ran the pipeline under "auto".
    loop_fn = model.trainer.loop_function(4).python_function
    assert ("make_pipelined_loop" in loop_fn.__qualname__) == (
        loop == "auto")
  for a, b in zip(got["auto"][0], got["unrolled"][0], strict=True):
    np.testing.assert_array_equal(a, b)
  for key, values in got["unrolled"][1].items():
    np.testing.assert_allclose(got["auto"][1][key], values, rtol=1e-6)
  assert got["auto"][1]["module_1/loss"][1] != got["auto"][1][
      "module_1/loss"][0]
