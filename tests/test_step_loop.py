"""A training call as one traced step in a graph loop (`step_loop`): the
same numbers as the unrolled steps, with one step in the graph."""


import numpy as np
import pytest

from tests import helpers
from tests import loop_runs
from tf_interlock import module_functions
from tf_interlock import placement as placement_lib
from tf_interlock import routing
from tf_interlock import step_loop

K = 3


# A loop of 3 steps checks what 4 do. 2-wise loops 4 steps: its looped run
# (op by op) is also the per-module test's below, whose unrolled loop needs
# 4 calls per module (`module_functions.MIN_CALLS`) to trace them. K = 3
# where the window matters (2-wise: module 1 trained by L_2, not L_K);
# end-to-end and local loop alike at K = 2 (a step's graph, so its
# tracing, grows with K).
@pytest.mark.parametrize("strategy,microbatches,steps_per_loop,num_modules",
                         [("2wise", 1, 4, 3), ("e2e", 2, 3, 2),
                          ("local", 1, 3, 2)])
def test_looped_equals_unrolled_bit_for_bit(strategy, microbatches,
                                            steps_per_loop, num_modules):
  # Both op by op: the loop alone differs, and changes no weight's bit.
  want, _, want_w, _, _ = loop_runs.run("unrolled", strategy, microbatches, False,
                               steps_per_loop, num_modules)
  got, built, got_w, _, _ = loop_runs.run("while", strategy, microbatches, False,
                                 steps_per_loop, num_modules)
  assert len(got_w) == len(want_w)
  for a, b in zip(got_w, want_w):
    np.testing.assert_array_equal(a, b)
  # The reported means: the graph optimiser may round a sum differently
  # in the two graphs (seen: one float32 ulp).
  for a, b in zip(got, want):
    assert a.keys() == b.keys()
    np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a],
                               rtol=3e-7)
  # The steps changed the weights (the comparison is not of two starts).
  assert any(not np.array_equal(a, b) for a, b in zip(got_w, built))


def test_looped_equals_unrolled_with_per_module_functions():
  # Unrolled, 4 calls per module and loop go through the per-module
  # functions. The loop calls the step once per iteration, below
  # MIN_CALLS: it traces one step op by op whatever `traced` says, the
  # bit-for-bit test's 2-wise run. The two graphs then differ as traced
  # and op by op do (tests/test_module_functions.py): in the last float
  # bits.
  assert module_functions.MIN_CALLS == 4
  want, _, want_w, _, _ = loop_runs.run("unrolled", "2wise", 1, True, 4, K)
  got, _, got_w, _, _ = loop_runs.run("while", "2wise", 1, False, 4, K)
  for a, b in zip(got, want):
    assert a.keys() == b.keys()
    np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a],
                               rtol=1e-6)
  for a, b in zip(got_w, want_w):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_looped_graph_holds_one_step():
  # The 2-wise runs above, of 4 steps per loop: unrolled with per-module
  # functions, and looped (one step, traced op by op whatever `traced`
  # says).
  graphs = {}
  for loop, traced in (("unrolled", True), ("while", False)):
    run = loop_runs.run(loop, "2wise", 1, traced, 4, K)
    graphs[loop] = run.trainer.loop_function(4).get_concrete_function(
        run.iterator).graph
  types = {loop: [op.type for op in g.get_operations()]
           for loop, g in graphs.items()}
  assert "While" in types["while"] and "While" not in types["unrolled"]
  # The unrolled graph reads four batches; the looped one calls a block of
  # one step (another graph) in its body.
  assert types["unrolled"].count("IteratorGetNext") == 4
  assert types["while"].count("IteratorGetNext") == 0
  assert _batches_per_block(graphs["while"]) == [1]
  assert len(types["while"]) < len(types["unrolled"]) / 3
  # The cost (step_loop's docstring): the body's loop variables wait, by
  # control edges, for the step's call (every stateful op of the step), so
  # step t + 1 starts after all of step t.
  while_op = next(op for op in graphs["while"].get_operations()
                  if op.type == "While")
  body = while_op._body_graph  # pylint: disable=protected-access
  waits = [c for out in body.outputs for c in out.op.control_inputs]
  waits += [c for op in waits if op.type == "NoOp"
            for c in op.control_inputs]
  assert any(c.type == "StatefulPartitionedCall" for c in waits), waits


def _batches_per_block(graph):
  """The batches each function of `graph`'s library reads, for those that
  read any, sorted: the steps of each block a loop calls."""
  library = graph.as_graph_def().library.function
  counts = [sum(node.op == "IteratorGetNext" for node in f.node_def)
            for f in library]
  return sorted(c for c in counts if c)


def test_one_step_per_call_runs_no_loop():
  trainer, iterator = loop_runs.trainer("while", "2wise", 1, steps_per_loop=1)
  graph = trainer.loop_function(1).get_concrete_function(iterator).graph
  assert "While" not in [op.type for op in graph.get_operations()]
  before = helpers.weights(trainer.modules)
  metrics = trainer.train_loop(iterator)
  assert set(metrics) >= {"module_1/loss", "module_3/grad_norm"}
  assert any(not np.array_equal(a, b) for a, b in
             zip(before, helpers.weights(trainer.modules)))


def test_auto_loops_where_steps_have_no_slack():
  plan = routing.make_plan
  resolve = lambda s, k: step_loop.resolve_loop("auto", plan(s, k))  # noqa
  assert [resolve(s, 4) for s in ("e2e", "4wise", "6wise")] == ["while"] * 3
  # Local learning runs the pipeline (tests/test_pipelined_loop.py), which
  # keeps its overlap; n-wise with n < K keeps the unrolled steps.
  assert [resolve(s, 4) for s in ("local", "2wise", "3wise")] == [
      "pipelined", "unrolled", "unrolled"]
  assert resolve("2wise", 2) == "while"
  e2e = plan("e2e", 4)
  # Each placement class says whether it runs every module in this process;
  # "auto" loops only there.
  for name in placement_lib.names():
    one_process = placement_lib.get(name).one_process
    assert isinstance(one_process, bool), name
    assert step_loop.resolve_loop("auto", e2e, one_process) == (
        "while" if one_process else "unrolled"), name
  for name, expected in (("single", True), ("simulated", True),
                         ("gpu", True), ("tpu", False), ("cluster", False)):
    assert placement_lib.get(name).one_process is expected, name
  assert step_loop.resolve_loop("auto", e2e, True, 2) == "unrolled"
  # On CPUs, a tie of module 1 to the last module (a CausalLM's embedding
  # and head) makes module 1 wait for the final loss, as end-to-end; a tie
  # elsewhere leaves module 1 its slack, but couples two modules' updates,
  # which the pipeline cannot (module k runs step t - k).
  local = plan("local", 4)
  tied = lambda ties: step_loop.resolve_loop("auto", local, ties=ties)  # noqa
  assert [tied(t) for t in ([(0, 3)], [(3, 0)], [(1, 3)], [(0, 2)], [])] == [
      "while", "while", "unrolled", "unrolled", "pipelined"]
  # 2-wise at K = 4: module 2 is trained by L_3 (0-based L_2), module 3 by
  # the final loss. A tie of module 1 to module 2 leaves module 4 working
  # on step t while module 1 runs t + 1; a tie to module 3 does not.
  two = plan("2wise", 4)
  assert [step_loop.resolve_loop("auto", two, ties=[t])
          for t in ((0, 1), (0, 2))] == ["unrolled", "while"]
  assert step_loop.resolve_loop("auto", local, False, ties=[(0, 3)]) == (
      "unrolled")
  # With a device per module (GPUs, TPUs) the backward after the tie's
  # gradient still overlaps the next step: unrolled.
  assert step_loop.resolve_loop("auto", local, ties=[(0, 3)],
                                on_accelerator=True) == "unrolled"
  assert step_loop.resolve_loop("auto", e2e, on_accelerator=True) == "while"
  assert step_loop.resolve_loop("unrolled", e2e) == "unrolled"
  with pytest.raises(ValueError, match=r"Received: loop='scan'"):
    step_loop.resolve_loop("scan", e2e)


def test_auto_writes_out_nwise_steps_up_to_max_block_weights():
  two, call = routing.make_plan("2wise", 4), step_loop.resolve_call
  # U: the largest divisor of the call's steps with U x weights <= 256.
  auto = lambda weights, steps, **kw: call(  # noqa
      "auto", 1, two, block_weights=weights, num_steps=steps,
      max_block_weights=256, **kw)
  assert auto(16, 16) == ("unrolled", 1)  # research.benchmark's MLP: 256.
  assert auto(17, 16) == ("while", 8)
  assert auto(79, 8) == ("while", 2)  # BERT: 3 steps fit, 3 divides not 8.
  assert auto(164, 8) == ("while", 1)  # MobileNetV2.
  assert auto(300, 8) == ("while", 1)  # One step over the bound: still 1.
  assert auto(40, 12) == ("while", 6)
  assert auto(300, 1) == ("unrolled", 1)  # One step: nothing to loop.
  # Where "auto" keeps the unrolled steps whatever their weights: another
  # process or replica, accelerators, an XLA step (its one program is
  # traced once, called by every step).
  assert auto(164, 8, one_process=False) == ("unrolled", 1)
  assert auto(164, 8, replicas=2) == ("unrolled", 1)
  assert auto(164, 8, on_accelerator=True) == ("unrolled", 1)
  assert auto(164, 8, compiles_step=True) == ("unrolled", 1)
  # The end-to-end loop keeps loop_block (no overlap across steps to keep);
  # a loop set by the user keeps it too; local runs its pipeline.
  e2e = routing.make_plan("e2e", 4)
  assert call("auto", 1, e2e, block_weights=164, num_steps=8,
              max_block_weights=256) == ("while", 1)
  assert call("while", 4, two, block_weights=164, num_steps=8,
              max_block_weights=256) == ("while", 4)
  assert call("unrolled", 1, two, block_weights=164, num_steps=8,
              max_block_weights=256) == ("unrolled", 1)
  assert call("auto", 1, routing.make_plan("local", 4), block_weights=164,
              num_steps=8, max_block_weights=256) == ("pipelined", 1)
  assert step_loop.resolve_loop("auto", two, block_weights=79, num_steps=8,
                                max_block_weights=256) == "while"


def test_a_trainer_over_max_block_weights_runs_blocks_equal_to_unrolled():
  # 2-wise, K = 3, 4 steps a call: the bound at two steps' weights makes
  # blocks of 2 (the call of 2 steps fits: unrolled), the same weights bit
  # for bit as the unrolled steps.
  want = loop_runs.run("unrolled", "2wise", 1, False, 4, 3)
  weights = sum(len(m.trainable_weights) for m in want.trainer.modules)
  assert want.trainer.loop_plan() == ("unrolled", 1)
  got = loop_runs.run("auto", "2wise", 1, False, 4, 3,
                      max_block_weights=2 * weights)
  assert got.trainer.loop_plan() == ("while", 2)
  assert got.trainer.resolved_loop == "while"
  assert got.trainer.loop_plan(2) == ("unrolled", 1)
  for a, b in zip(got.weights, want.weights):
    np.testing.assert_array_equal(a, b)
  graph = got.trainer.loop_function(4).get_concrete_function(
      got.iterator).graph
  assert [op.type for op in graph.get_operations()].count("While") == 1
  assert _batches_per_block(graph) == [2]
  # Microbatches count: M = 2 writes out twice the weights a step.
  assert loop_runs.trainer("auto", "2wise", 2, steps_per_loop=4,
                           max_block_weights=2 * weights)[0].loop_plan() == (
                               "while", 1)


# Local, K = 2: 5 steps a call in blocks of 2, two iterations and one block
# of the remaining step. 2-wise, K = 3 (the window): 4 steps in blocks of
# 2, two iterations and no remainder, against the unrolled run of 4 steps
# the bit-for-bit test above compares (cached: traced once). Then each
# makes a call of 2 steps (one block, no loop).
@pytest.mark.parametrize("strategy,num_modules,steps_per_loop,blocks", [
    ("local", 2, 5, [1, 2]), ("2wise", 3, 4, [2])])
def test_blocks_of_steps_equal_unrolled_bit_for_bit(strategy, num_modules,
                                                    steps_per_loop, blocks):
  want, _, want_w, _, _ = loop_runs.run("unrolled", strategy, 1, False,
                               steps_per_loop, num_modules)
  got, built, got_w, trainer, iterator = loop_runs.run(
      "while", strategy, 1, False, steps_per_loop, num_modules, block=2)
  for a, b in zip(got_w, want_w):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(got_w, built))
  for a, b in zip(got, want):
    assert a.keys() == b.keys()
    np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a],
                               rtol=3e-7)
  graph = trainer.loop_function(steps_per_loop).get_concrete_function(
      iterator).graph
  assert [op.type for op in graph.get_operations()].count("While") == 1
  assert _batches_per_block(graph) == blocks
  two = trainer.loop_function(2).get_concrete_function(iterator).graph
  assert "While" not in [op.type for op in two.get_operations()]
  assert _batches_per_block(two) == [2]
