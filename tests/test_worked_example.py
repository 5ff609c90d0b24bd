"""The shared doc's worked example, every row, through the real trainer.

K = 3 scalar modules h_k = w_k h_{k-1}, w = (2, 3, 4); scalar aux heads
A_k(h) = a_k h, a = (1, 1); x = 1; every loss is 0.1 * logit. With SGD at
learning rate 1 each parameter moves by minus its hand-worked gradient.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.framework import meta_graph
from tensorflow.python.grappler import tf_optimizer

from layers.interlock_module import InterlockModule
from tf_interlock import tf_private
from tf_interlock.trainer import InterlockTrainer

W = (2.0, 3.0, 4.0)
A = (1.0, 1.0)

# strategy: (dtheta_1, dtheta_2, dtheta_3, dphi_1, dphi_2), by hand.
ROWS = {
    "e2e": (1.2, 0.8, 0.6, 0.2, 0.6),
    "local": (0.1, 0.2, 0.6, 0.2, 0.6),
    "2wise": (0.3, 0.8, 0.6, 0.2, 0.6),
    "2wise-sum": (0.4, 1.0, 0.6, 0.2, 0.6),
    "3wise": (1.2, 0.8, 0.6, 0.2, 0.6),
    "3wise-sum": (1.2, 0.8, 0.6, 0.2, 0.6),  # n >= K: end-to-end.
}


def _scalar(value, name):
  return keras.layers.Dense(1, use_bias=False, name=name,
                            kernel_initializer=keras.initializers.Constant(value))


def scalar_modules():
  return [
      InterlockModule(_scalar(W[0], "w1"), aux_head=_scalar(A[0], "a1")),
      InterlockModule(_scalar(W[1], "w2"), aux_head=_scalar(A[1], "a2")),
      InterlockModule(_scalar(W[2], "w3")),
  ]


def tenth_of_logit(labels, logits):
  del labels
  return 0.1 * tf.reshape(logits, [-1])


def one_sgd_step(strategy, **kwargs):
  modules = scalar_modules()
  trainer = InterlockTrainer(
      modules, lambda k: keras.optimizers.SGD(1.0), strategy,
      loss_fn=tenth_of_logit, metric_fn=None, **kwargs)
  x = tf.ones([1, 1])
  trainer.build(x)
  dataset = tf.data.Dataset.from_tensors((x, tf.zeros([1]))).repeat()
  metrics = trainer.train_loop(iter(trainer.distribute_dataset(dataset)))
  values = [m.body.kernel for m in modules] + [
      m.aux_head.kernel for m in modules[:2]]
  return np.array([float(tf.reshape(v, [])) for v in values]), metrics


@pytest.mark.parametrize("strategy", sorted(ROWS))
def test_worked_example(strategy):
  after, metrics = one_sgd_step(strategy)
  before = np.array(W + A)
  np.testing.assert_allclose(before - after, ROWS[strategy], atol=1e-6)
  # Losses at the initial weights: 0.1 * (h_1, h_2, h_3) = 0.2, 0.6, 2.4.
  np.testing.assert_allclose(
      [metrics[f"module_{k}/loss"] for k in (1, 2, 3)], [0.2, 0.6, 2.4],
      rtol=1e-6)


def test_microbatches_match_full_batch_on_worked_example():
  full, _ = one_sgd_step("2wise-sum")
  modules = scalar_modules()
  trainer = InterlockTrainer(
      modules, lambda k: keras.optimizers.SGD(1.0), "2wise-sum",
      loss_fn=tenth_of_logit, metric_fn=None, num_microbatches=4)
  x = tf.ones([4, 1])
  trainer.build(x)
  dataset = tf.data.Dataset.from_tensors((x, tf.zeros([4]))).repeat()
  trainer.train_loop(iter(trainer.distribute_dataset(dataset)))
  micro = [float(tf.reshape(m.body.kernel, [])) for m in modules]
  np.testing.assert_allclose(micro, full[:3], atol=1e-6)


def _unordered_reads(graph, rewrite_options):
  """The ReadVariableOps of `graph` that neither precede nor follow a write
  of the same variable once TF's graph optimiser ran on it with
  `rewrite_options` (as when a function is instantiated)."""
  meta = meta_graph.create_meta_graph_def(graph=graph)
  meta.collection_def["train_op"].node_list.value.extend(
      t.name for t in graph.outputs)
  config = config_pb2.ConfigProto()
  config.graph_options.rewrite_options.CopyFrom(rewrite_options)
  nodes = {n.name: n for n in tf_optimizer.OptimizeGraph(config, meta).node}

  def ancestors(name):
    seen, stack = set(), [name]
    while stack:
      for i in nodes[stack.pop()].input:
        parent = i.lstrip("^").split(":")[0]
        if parent in nodes and parent not in seen:
          seen.add(parent)
          stack.append(parent)
    return seen

  by_variable = {}
  for node in nodes.values():
    if node.op == "ReadVariableOp" or node.op.startswith("Assign"):
      by_variable.setdefault(node.input[0], []).append(node.name)
  unordered = []
  for names in by_variable.values():
    reads = [n for n in names if nodes[n].op == "ReadVariableOp"]
    for write in (n for n in names if n not in reads):
      before = ancestors(write)
      unordered += [r for r in reads
                    if r not in before and write not in ancestors(r)]
  return unordered


@pytest.mark.parametrize("light", [False, True])
@pytest.mark.parametrize("strategy", ["e2e", "local", "2wise"])
def test_every_read_of_a_weight_precedes_its_update(strategy, light):
  # Nothing an update needs is computed from some reads of the weights here
  # (a loss linear in its logit, linear modules): end to end modules 1's
  # and 2's, and local's aux heads', over 3 unrolled steps. Only control
  # edges order those reads against the writes, after TF's optimiser ran
  # (its default passes, and the light ones "auto" uses on CPUs). Without
  # the engine's edges (`engine.after_reads`) it dropped them, and one
  # e2e run read the updated theta_2 (theta_1 moved 0.88).
  trainer = InterlockTrainer(
      scalar_modules(), lambda k: keras.optimizers.SGD(1.0), strategy,
      loss_fn=tenth_of_logit, metric_fn=None, steps_per_loop=3)
  x = tf.ones([1, 1])
  trainer.build(x)
  iterator = iter(trainer.distribute_dataset(
      tf.data.Dataset.from_tensors((x, tf.zeros([1]))).repeat()))
  outer = trainer.loop_function(3).get_concrete_function(iterator).graph
  # The steps: in the call's graph (unrolled), or in the function it calls
  # (looped).
  graphs = [outer] + [
      outer._get_function(op.get_attr("f").name).graph  # pylint: disable=protected-access
      for op in outer.get_operations() if op.type == "StatefulPartitionedCall"]
  rewrites = rewriter_config_pb2.RewriterConfig()
  if light:
    tf_private.light_rewrites(rewrites)
  for graph in graphs:
    assert not _unordered_reads(graph, rewrites)
