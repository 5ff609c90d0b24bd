"""The one forward over exits (`exits`) and the one metric-naming scheme."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers.interlock_module import InterlockModule
from tf_interlock import exits
from tf_interlock import metric_names


class _Scale(keras.layers.Layer):
  """h -> gain * h, counting its calls (to see which modules ran)."""

  def __init__(self, gain, **kwargs):
    super().__init__(**kwargs)
    self.gain, self.calls = gain, 0

  def call(self, inputs):
    self.calls += 1
    return self.gain * inputs

  def compute_output_shape(self, input_shape):
    return input_shape


def _scalar_modules():
  """The worked example's network: h_k = w_k h_{k-1}, w = (2, 3, 4); aux
  heads a_k = (1, -1) on modules 1 and 2; module 3 ends with the output."""
  return [InterlockModule(_Scale(2.0), aux_head=_Scale(1.0)),
          InterlockModule(_Scale(3.0), aux_head=_Scale(-1.0)),
          InterlockModule(_Scale(4.0))]


def test_every_exit_by_hand():
  found = list(exits.exits(_scalar_modules(), tf.constant(1.0)))
  assert [e.index for e in found] == [0, 1, 2]
  # h = (2, 6, 24); exit logits (1 * 2, -1 * 6) and the network's h_3.
  assert [float(e.outputs) for e in found] == [2.0, 6.0, 24.0]
  assert [float(e.logits) for e in found] == [2.0, -6.0, 24.0]


def test_headless_module_has_no_logits_and_heads_filter():
  modules = _scalar_modules()
  modules[1] = InterlockModule(_Scale(3.0))
  found = list(exits.exits(modules, tf.constant(1.0)))
  assert found[1].logits is None and float(found[1].outputs) == 6.0
  assert exits.exit_indices(modules) == [1]
  assert [exits.is_exit(modules, k) for k in range(3)] == [True, False, True]
  only_last = list(exits.exits(modules, tf.constant(1.0), heads=(2,)))
  assert only_last[0].logits is None and float(only_last[2].logits) == 24.0
  with pytest.raises(ValueError, match="Received: k=2"):
    exits.exit_logits(modules, tf.constant(1.0), 2)


def test_exit_logits_runs_only_the_modules_it_needs():
  modules = _scalar_modules()
  x = tf.constant(1.0)
  assert float(exits.exit_logits(modules, x, 2)) == -6.0
  assert modules[2].body.calls == 0  # the generator stopped at module 2
  assert float(exits.exit_logits(modules, x)) == 24.0
  with pytest.raises(ValueError, match="Received: k=4"):
    exits.exit_logits(modules, x, 4)


def test_scope_wraps_each_module_and_outputs_are_cut():
  modules, entered = _scalar_modules(), []

  class _Scope:

    def __init__(self, k):
      self.k = k

    def __enter__(self):
      entered.append(self.k)

    def __exit__(self, *args):
      return False

  x = tf.constant(1.0)
  with tf.GradientTape() as tape:
    tape.watch(x)
    logits = [e.logits for e in exits.exits(modules, x, scope=_Scope)]
  assert entered == [0, 1, 2]
  # Each module's input is cut: nothing reaches x implicitly.
  assert tape.gradient(logits[-1], x) is None


def test_build_creates_every_weight():
  modules = [InterlockModule(keras.layers.Dense(4),
                             aux_head=keras.layers.Dense(2)),
             InterlockModule(keras.layers.Dense(3))]
  out = exits.build(modules, np.ones((5, 6), "float32"))
  assert out.shape == (5, 3)
  assert all(m.built for m in modules)
  assert len(modules[0].weights) == 4  # body and head kernels and biases


def test_metric_names_round_trip():
  assert metric_names.module_name(0) == "module_1"
  assert metric_names.metric_name(2, "loss") == "module_3/loss"
  assert metric_names.parse_metric_name("module_3/loss") == (2, "loss")
  assert metric_names.head_index("module_12") == 11
  with pytest.raises(ValueError, match="Received: head='final'"):
    metric_names.head_index("final")
  assert metric_names.network_head(
      {"module_2": 0, "module_10": 1, "module_3": 2}) == "module_10"
