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

XLA (`jit_compile`, see `resolve_jit_compile` and docs/xla.md). A placement
that puts modules on several devices (`Placement.xla_unit == "module"`)
compiles each of these functions with XLA, on its module's device, and calls
them whatever the number of calls: one XLA program per module and kind of
work (body, update, gradient norm), so the modules still overlap. The body's VJPs come
from the gradient of a compiled function, which TF compiles too. The glue
between modules (routing, aux heads, losses) stays in the TF graph.
"""

import collections
import functools

import tensorflow as tf

from tf_interlock import execution_options
from tf_interlock import tf_private

# Which placements trace each module's body and update once is the
# placement's `one_process`: every module in this process on CPU or GPU.
# TPU (logical cores assigned while the replica function is traced) and the
# cluster's remote devices keep the op-by-op path they were written and
# checked with.
#
# Which compile each per-module function as one XLA program under
# `jit_compile` is its `xla_unit` "module": one function may touch only its
# module's variables, on its module's device (XLA refuses a resource on
# another device). "single" compiles the whole replica step instead
# ("replica_step"); under a TPUStrategy `TPUStrategy.run` compiles it
# itself (the placement's `compiles_step`).

JIT_COMPILE_ALLOWED = "True, False or 'auto'"


# Tracing a function costs more than tracing its ops once inline: TF also
# builds the function's forward-with-intermediates and backward functions,
# and the runtime instantiates the calls. The functions pay from about 4
# calls per trace (measured: docs/results/tracing/report.md). A loop with
# fewer calls per module runs op by op. The default of
# `ExecutionOptions.min_traced_calls`.
MIN_CALLS = execution_options.ExecutionOptions.min_traced_calls


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
    self._function = None

  @property
  def made(self):
    """Whether the `tf.function` exists (the first traced call made it)."""
    return self._function is not None

  def _make_function(self):
    fn, key, owner = self.fn, self.key, self.owner

    def counted(*args):
      owner.traces[key] += 1
      return fn(*args)

    # autograph=False: the work is plain dataflow (Keras layers, optimizer
    # updates); autograph's conversion would only add tracing time.
    return tf.function(counted, autograph=False,
                       jit_compile=owner.jit_compile or None)

  def __call__(self, *args):
    if self.owner.use and not tf.distribute.has_strategy():
      if self._function is None:  # made once `jit_compile` is settled
        self._function = self._make_function()
      return self._function(*args)
    return self.fn(*args)


class ModuleFunctions:
  """Module k's traced work: its body here, and what callers `add`.

  Args:
    modules: the K `InterlockModule`s, in depth order.
    placement: the `placement.Placement`; the work is traced only where
      its `one_process` is true.
    min_calls: a loop that calls each function fewer times runs op by op.

  Attributes:
    traced: whether the functions may be traced at all (False: always op
      by op; a test sets it to compare both).
    jit_compile: whether each function is one XLA program, called on every
      call (set by `compile_each` before the first call).
    traces: how often each per-module function was traced, keyed
      `("body", k)` for the bodies and as callers `add` (a Python counter
      incremented while tracing; calls do not count).
    functions: every `PerModuleFunction`, by key.
  """

  def __init__(self, modules, placement, min_calls=MIN_CALLS):
    self.modules = list(modules)
    self.traced = placement.one_process
    self.jit_compile = False
    self.min_calls = min_calls
    self.calls = min_calls
    self.traces = collections.Counter()
    self.functions = {}
    for k, module in enumerate(self.modules):
      self.add(functools.partial(_body, module), ("body", k))

  @property
  def use(self):
    """Whether calls now go through the traced functions."""
    return self.jit_compile or (self.traced and self.calls >= self.min_calls)

  def compile_each(self):
    """Makes every function one XLA program, called on every call.

    Raises:
      RuntimeError: once a function has been traced without XLA.
    """
    if any(f.made for f in self.functions.values()):
      raise RuntimeError("compile_each must come before the first call of "
                         "a per-module function. Received: traced already")
    self.jit_compile = True

  def tracing_loop(self, calls):
    """Sets how often the loop being traced calls each function: below
    `min_calls`, it runs op by op (cheaper to trace)."""
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


def resolve_jit_compile(jit_compile, placement, distribute):
  """Whether a trainer compiles its step with XLA (True or False).

  "auto" is Keras 3's meaning, on the devices the modules run on: on where
  they run on a non-CPU device, off on CPU (measured slower there,
  docs/results/xla) and off under op determinism (not every XLA kernel is
  deterministic). Keras's own "auto" is also off under any `tf.distribute`
  strategy; here the default strategy, which the trainer always runs
  under, does not count.

  Args:
    jit_compile: True, False or "auto".
    placement: the trainer's `placement.Placement`.
    distribute: the trainer's `tf.distribute.Strategy`.

  Returns:
    The resolved bool: always True where the strategy compiles every
    replica step itself (`placement.compiles_step(distribute)`: "tpu", or
    any placement under a TPUStrategy).

  Raises:
    ValueError: an unknown value, jit_compile=False with placement "tpu", or
      jit_compile=True under a strategy with several replicas other than a
      TPUStrategy.
  """
  if not (isinstance(jit_compile, bool) or jit_compile == "auto"):
    raise ValueError(f"jit_compile must be {JIT_COMPILE_ALLOWED}. "
                     f"Received: jit_compile={jit_compile!r}")
  if placement.compiles_step(distribute):
    if jit_compile is False:
      raise ValueError(
          "A TPU runs only XLA programs: TPUStrategy.run compiles the "
          "replica step whatever jit_compile says; pass True or 'auto'. "
          "Received: jit_compile=False")
    return True
  replicas = distribute.num_replicas_in_sync
  if replicas > 1:
    if jit_compile is True:
      raise ValueError(
          f"jit_compile=True is not supported under "
          f"{type(distribute).__name__} with {replicas} replicas: Keras's "
          f"optimizers and synchronized BatchNormalization all-reduce with "
          f"merge_call, which TF refuses inside a compiled function; use "
          f"'auto' (off here) or False. Received: jit_compile=True")
    return False
  if jit_compile == "auto":
    return (placement.on_accelerator()
            and not tf_private.op_determinism_enabled())
  return jit_compile
