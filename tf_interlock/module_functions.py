"""Each module's body and update as a `tf.function`, traced once per shape.

`InterlockTrainer` unrolls `steps_per_loop` steps (times microbatches) into
one graph, so that module k can run step t + 1 while later modules finish
step t. Written out op by op, that graph costs Python tracing time in
proportion to the number of unrolled steps: every step re-traces every
layer's forward, its backward (through the tape) and the optimizer update.

Here module k's body and its optimizer update are `tf.function`s of their
own. The unrolled graph then holds call ops, one per module and step, and
TF traces each function once per input signature (shapes and dtypes),
whatever the number of steps; the VJPs of a body call come from a second
function (TF's forward/backward pair of a traced function), also made once.
What stays per step is the glue between modules: cutting, routing and
summing cotangents, the aux heads, losses and metrics. A loop that calls
each function fewer than `MIN_CALLS` times runs op by op: there, tracing the
functions would cost more than it saves.

Why the numbers and the overlap do not change:
- the functions run the same ops on the same values;
- each call op is created in module k's device scope, and the ops inside
  name no device, so they run on the device of their call;
- TF orders a call after an earlier op only when both use the same
  variable (automatic control dependencies): module k's forward at step
  t + 1 waits for module k's update at step t, the dependency the unrolled
  graph had already, and for nothing of any other module
  (tests/test_module_functions.py looks at the graph).

The body's regularization losses are summed inside the function and
returned: tensors a layer keeps in `losses` belong to the function's own
graph and cannot be read outside it.
"""

import collections
import functools

import tensorflow as tf

# Placements whose modules' bodies and updates are traced once: one process
# under the default strategy. TPU (logical cores assigned while the replica
# function is traced) and the cluster's remote devices keep the op-by-op
# path they were written and checked with.
TRACED_KINDS = ("single", "simulated", "gpu")


# Tracing a function costs more than tracing its ops once inline: TF also
# builds the function's forward-with-intermediates and backward functions,
# and the runtime instantiates the calls. The functions pay from about 4
# calls per trace (measured: docs/results/tracing/report.md). A loop with
# fewer calls per module runs op by op.
MIN_CALLS = 4


class PerModuleFunction:
  """`fn(*args)` traced as a `tf.function` once per argument signature.

  The trace count is a Python side effect of tracing, kept in
  `owner.traces[key]`: it grows once per trace, never per call.

  `fn` runs inline (op by op, counting nothing) while `owner.use` is
  false, and under a `tf.distribute` strategy other than the default one:
  Keras's optimizers and synchronized BatchNormalization synchronise
  replicas with `merge_call`, which TF refuses inside a nested
  `tf.function`.
  """

  def __init__(self, fn, key, owner):
    self.fn = fn
    self.key = key
    self.owner = owner

    def counted(*args):
      owner.traces[key] += 1
      return fn(*args)

    # autograph=False: the work is plain dataflow (Keras layers, optimizer
    # updates); autograph's conversion would only add tracing time.
    self._function = tf.function(counted, autograph=False)

  def __call__(self, *args):
    if self.owner.use and not tf.distribute.has_strategy():
      return self._function(*args)
    return self.fn(*args)


class ModuleFunctions:
  """Module k's traced work: its body here, and what callers `add`.

  Args:
    modules: the K `InterlockModule`s, in depth order.
    placement: the `placement.Placement`; the work is traced only for
      `TRACED_KINDS`.

  Attributes:
    traced: whether the functions may be traced at all (False: always op
      by op; a test sets it to compare both).
    traces: how often each per-module function was traced, keyed
      `("body", k)` for the bodies and as callers `add` (a Python counter
      incremented while tracing; calls do not count).
    functions: every `PerModuleFunction`, by key.
  """

  def __init__(self, modules, placement):
    self.modules = list(modules)
    self.traced = placement.kind in TRACED_KINDS
    self.calls = MIN_CALLS
    self.traces = collections.Counter()
    self.functions = {}
    for k, module in enumerate(self.modules):
      self.add(functools.partial(_body, module), ("body", k))

  @property
  def use(self):
    """Whether calls now go through the traced functions."""
    return self.traced and self.calls >= MIN_CALLS

  def tracing_loop(self, calls):
    """Sets how often the loop being traced calls each function: below
    `MIN_CALLS`, it runs op by op (cheaper to trace)."""
    self.calls = calls

  def add(self, fn, key):
    """Registers `fn` as the per-module function `key`; returns it."""
    self.functions[key] = PerModuleFunction(fn, key, self)
    return self.functions[key]

  def body(self, k, x):
    """h_k = M_k(x) in training mode, and M_k's summed regularization
    losses (None when it has none), unscaled."""
    return self.functions[("body", k)](x)


def _body(module, x):
  h = module.body(x, training=True)
  reg = tf.add_n(module.body.losses) if module.body.losses else None
  return h, reg
