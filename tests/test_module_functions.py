"""Per-module traced functions: traced once per module and input shape,
however many steps are unrolled, and the same numbers as op by op."""

import collections
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers.interlock_module import InterlockModule
from tests import helpers
from tf_interlock import module_functions
from tf_interlock import placement as placement_lib
from tf_interlock.execution_options import ExecutionOptions
from tf_interlock.trainer import InterlockTrainer

K = 3


def _modules(seed=2, num_modules=K):
  """MLP modules with BatchNormalization and L2 regularizers: the traced
  body must carry BN's moving-statistics updates and return the
  regularization losses."""
  init = lambda i: keras.initializers.GlorotUniform(seed=seed * 100 + i)  # noqa
  modules = []
  for k in range(num_modules):
    body = [keras.layers.Dense(12, activation="relu",
                               kernel_initializer=init(2 * k),
                               kernel_regularizer=keras.regularizers.L2(0.1)),
            keras.layers.BatchNormalization()]
    head = None
    if k == num_modules - 1:
      body.append(keras.layers.Dense(helpers.NUM_CLASSES,
                                     kernel_initializer=init(2 * k + 1)))
    else:
      head = keras.layers.Dense(helpers.NUM_CLASSES,
                                kernel_initializer=init(2 * k + 1))
    modules.append(InterlockModule(body, aux_head=head))
  return modules


def _trainer(steps_per_loop, traced=True, strategy="2wise", microbatches=1,
             loop="unrolled", num_modules=K):
  x, y = helpers.batch(size=8)
  trainer = InterlockTrainer(
      _modules(num_modules=num_modules), lambda k: keras.optimizers.Adam(0.01),
      strategy, loss_fn=helpers.cross_entropy,
      placement=placement_lib.make_placement("simulated", num_modules),
      steps_per_loop=steps_per_loop, num_microbatches=microbatches,
      # unrolled: the per-module functions' steps
      options=ExecutionOptions(loop=loop))
  trainer.step.functions.traced = traced
  trainer.build(x)
  iterator = iter(trainer.distribute_dataset(helpers.repeat_dataset(x, y)))
  return trainer, iterator


_Run = collections.namedtuple("_Run", "trainer iterator weights metrics")


@functools.lru_cache(maxsize=None)
def _traced_run(strategy, steps_per_loop, microbatches, then, num_modules):
  """A trainer with per-module functions after two calls of
  `steps_per_loop` steps (its weights and last metrics then), and after
  one more call of `then` steps (a second loop function), if given.

  Cached (pass every argument by position: one key per run) and shared:
  tests read its traces and the graphs of the loop functions it has
  traced, and run nothing on it.
  """
  trainer, iterator = _trainer(steps_per_loop, strategy=strategy,
                               microbatches=microbatches,
                               num_modules=num_modules)
  metrics = [trainer.train_loop(iterator) for _ in range(2)][-1]
  weights = helpers.weights(trainer.modules)
  if then is not None:
    trainer.train_loop(iterator, num_steps=then)
  return _Run(trainer, iterator, weights, metrics)


def _calls(graph, device):
  """Call ops on `device` in `graph` (traced module work)."""
  return [op for op in graph.get_operations()
          if op.type.endswith("PartitionedCall") and op.device.endswith(device)]


# Steps 2 and 4, M 1 and 2: the traces do not grow with either. (A loop of
# 8 steps of 2 microbatches showed the same at twice the graph of (4, 2).)
# (2, 2) then makes a second loop function, of 4 steps (8 calls per
# module): it calls the same traced functions.
@pytest.mark.parametrize("steps_per_loop,microbatches,then",
                         [(4, 1, None), (2, 2, 4)])
def test_each_module_traced_once_whatever_the_steps(steps_per_loop,
                                                    microbatches, then):
  trainer, iterator, _, _ = _traced_run("2wise", steps_per_loop,
                                        microbatches, then, K)
  expected = {(kind, k): 1 for kind in ("body", "update", "grad_norm")
              for k in range(K)}
  assert dict(trainer.step.functions.traces) == expected
  # The unrolled graph calls module k's body once per step and microbatch,
  # and its update once per step, on module k's device.
  graph = trainer.loop_function(steps_per_loop).get_concrete_function(
      iterator).graph
  for k in range(K):
    names = [op.get_attr("f").name for op in _calls(graph, f"CPU:{k}")]
    bodies = [n for n in names if n.startswith("__forward_counted")]
    assert len(bodies) == steps_per_loop * microbatches, names
    assert len(set(bodies)) == 1


def test_few_calls_per_loop_run_op_by_op():
  """Below MIN_CALLS calls per module in a loop, tracing functions costs
  more than it saves: one step per loop is traced op by op."""
  assert module_functions.MIN_CALLS == 4
  trainer, iterator = _trainer(1)
  trainer.train_loop(iterator)
  assert not trainer.step.functions.traces
  trainer.train_loop(iterator, num_steps=4)  # now worth it
  assert trainer.step.functions.traces[("body", K - 1)] == 1


@pytest.mark.parametrize("strategy", ["2wise", "e2e", "local", "2wise-sum"])
def test_traced_equals_op_by_op(strategy):
  # K = 3: a middle module, which e2e's cotangent for L_3 crosses and
  # 2-wise's for L_2 leaves; local sends no cotangent: K = 2 shows it.
  num_modules = 2 if strategy == "local" else K
  # 2-wise: the run of the first case above.
  traced = _traced_run(strategy, 4, 1, None, num_modules)
  # Op by op, the steps looped (one step traced: cheaper to trace), which
  # changes no bit of the weights (tests/test_step_loop.py).
  inline, it_inline = _trainer(4, traced=False, strategy=strategy,
                               loop="while", num_modules=num_modules)
  for _ in range(2):
    m_inline = inline.train_loop(it_inline)
  assert not inline.step.functions.traces  # really op by op
  assert traced.trainer.step.functions.traces[("body", 0)] == 1
  assert traced.trainer.options.execution.loop == "unrolled"
  for a, b in zip(traced.weights, helpers.weights(inline.modules)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  for key, value in m_inline.items():
    np.testing.assert_allclose(traced.metrics[key], value, atol=1e-6)


def test_a_module_with_one_vjp_gets_first_order_gradients_of_its_body():
  """A module that takes one VJP of its body records it on a plain tape:
  TF's backward function of the traced body then takes a gradient for each
  of the forward function's outputs alone. On a persistent tape (two VJPs)
  it also takes one for each intermediate, zeros added every step."""
  # 2-wise, K = 3: module 1 sends L_1's cotangent down but trains on L_1 +
  # L_2 (a weight and an input VJP); modules 0 and 2 take one VJP each.
  trainer, iterator, _, _ = _traced_run("2wise", 4, 1, None, K)
  assert [s.tape_calls for s in trainer.step.module_steps] == [1, 2, 1]
  graph = trainer.loop_function(4).get_concrete_function(iterator).graph
  for k, step in enumerate(trainer.step.module_steps):
    ops = _calls(graph, f"CPU:{k}")
    (forward,) = {len(op.outputs) for op in ops
                  if op.get_attr("f").name.startswith("__forward_counted")}
    (backward,) = {len(op.inputs) for op in ops
                   if "__backward_counted" in op.get_attr("f").name}
    if step.tape_calls == 1:
      assert backward == forward, k
    else:
      assert backward > forward, k
  local = _traced_run("local", 4, 1, None, 2).trainer
  e2e = _traced_run("e2e", 4, 1, None, K).trainer
  assert [s.tape_calls for s in local.step.module_steps] == [1, 1]
  assert [s.tape_calls for s in e2e.step.module_steps] == [1, 1, 1]


def test_other_strategies_run_op_by_op(mirrored):
  """Under MirroredStrategy, Keras's merge_call (optimizer, synchronized
  BN) cannot run in a nested tf.function: nothing is traced per module."""
  x, y = helpers.batch(size=8)
  with mirrored.scope():
    trainer = InterlockTrainer(
        helpers.mlp_modules(K, seed=1, batch_norm=True),
        lambda k: keras.optimizers.SGD(0.1), "2wise",
        loss_fn=helpers.cross_entropy, distribute=mirrored)
  trainer.build(x)
  trainer.train_loop(iter(trainer.distribute_dataset(
      helpers.repeat_dataset(x, y))))
  assert not trainer.step.functions.traces
  assert tf.reduce_all(tf.math.is_finite(trainer.modules[0].weights[0]))


def test_a_module_waits_only_for_its_own_work():
  """What keeps the overlap: a call waits (control edges, from shared
  variables) only for ops of its own module; module k's forward at step 2
  waits for module k's update at step 1."""
  # The 2-wise run of the tests above (4 steps, M = 1).
  trainer, iterator, _, _ = _traced_run("2wise", 4, 1, None, K)
  graph = trainer.loop_function(4).get_concrete_function(iterator).graph
  # A variable read names no device in the graph: it runs where the
  # variable lives (the handle captured from outside).
  handles = {inner.name: outer for outer, inner in graph.captures}

  def device(op):
    if op.type == "ReadVariableOp" and not op.device:
      return handles[op.inputs[0].name].device
    return op.device

  for k in range(K):
    calls = _calls(graph, f"CPU:{k}")
    for op in calls:
      for before in op.control_inputs:
        assert device(before).endswith(f"CPU:{k}"), (op.name, before.name)
    forwards = [op for op in calls
                if op.get_attr("f").name.startswith("__forward_counted")]
    updates = [op for op in calls if op.type == "StatefulPartitionedCall"
               and op not in forwards]
    assert len(forwards) == 4 and len(updates) == 4
    assert updates[0] in forwards[1].control_inputs
