"""What each device must hold for one training step: counted, and measured.

The count (`count`) adds, per module k on its device:

* weights: every variable of M_k and its aux head A_k (BatchNorm's moving
  statistics too);
* slots: module k's optimizer variables (momentum, Adam's moments, step
  counter);
* gradients: one gradient per trainable variable, twice with microbatches
  (the running sum and the microbatch being added to it);
* activations: the forward tensors that M_k's backward reads (what the
  tape keeps), read from the traced graph of M_k's VJP
  (`saved_bytes`), for every microbatch in flight;
* aux: the same for the aux head A_k (and its loss);
* inputs: x_k = h_{k-1}, which the input VJP and the weight VJP read;
* update: what module k's optimizer update computes from its state alone,
  before the gradient exists (SGD with momentum: m * momentum, one tensor
  of each weight's size), read from the traced update (`update_held_bytes`):
  nothing orders it after the backward, so it is computed as the step
  starts and held until the gradient arrives, across the step's peak.

How many microbatches are in flight is the dataflow's bound: TF runs any op
whose inputs are ready, so every microbatch's forward may run before the
first backward (GPipe without recomputation keeps M microbatches' activations,
i.e. one whole batch's). A module with `recompute` keeps only its input per
microbatch and holds one microbatch's activations while it re-runs the
forward in its backward. On one device ("single") the modules share it:
in the dataflow order every module's activations may be alive at once (the
sum over modules); in the memory-lean order
(`InterlockTrainer(memory_lean=True)`, local learning only) module k+1's
forward waits for module k's backward, so only one module's activations
are (the largest).

The measurement (`peak_bytes`) reads TF's allocator statistics
(`tf.config.experimental.get_memory_info`). Every logical CPU device of a
process allocates from the one process-wide CPU allocator (checked: a
reset on CPU:2 clears CPU:0's peak, and all report the same bytes), so on
simulated devices the figure is the process's peak, the sum over devices
at the worst moment; GPUs have an allocator each. The CPU allocator keeps
statistics only with oneDNN on (`TF_ENABLE_ONEDNN_OPTS=1`, the runs' default
on x86-64) or `TF_CPU_ALLOCATOR_USE_BFC=true`; otherwise TF raises "Allocator
stats not available".
"""

import dataclasses
import gc

import numpy as np
import tensorflow as tf

# Forward ops whose outputs are weights or handles, not activations.
_NOT_ACTIVATIONS = ("ReadVariableOp", "Placeholder", "Const", "VarHandleOp",
                    "Shape", "Identity")


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
  """Bytes one device must hold at its peak, by kind."""
  weights: int = 0
  slots: int = 0
  gradients: int = 0
  activations: int = 0
  aux: int = 0
  inputs: int = 0
  update: int = 0

  @property
  def total(self):
    return sum(dataclasses.astuple(self))

  def __add__(self, other):
    return DeviceMemory(*(a + b for a, b in zip(dataclasses.astuple(self),
                                                 dataclasses.astuple(other))))

  def as_mb(self):
    """Each kind and the total in MB (1e6 bytes), rounded to 0.01."""
    out = {k: round(v / 1e6, 2) for k, v in dataclasses.asdict(self).items()}
    out["total"] = round(self.total / 1e6, 2)
    return out


def _bytes(tensors):
  total = 0
  for t in tensors:
    shape = t.shape if hasattr(t, "shape") else None
    if shape is None or not shape.is_fully_defined():
      continue
    total += int(np.prod(shape.as_list(), dtype=np.int64)) * t.dtype.size
  return total


def saved_bytes(fn, variables, x):
  """Bytes of the forward tensors that the backward of `fn(x)` reads, and
  the output's `tf.TensorSpec` (`saved_tensors` gives more).

  Traces `fn` and the VJP of its (summed) output with respect to
  `variables` (and `x` when it is a float tensor) into one graph, nothing
  run, and adds up each forward tensor that a gradient op reads; `x` itself,
  weights and constants are not counted.

  Args:
    fn: `fn(x) -> tensor`, e.g. a module's body in training mode.
    variables: the trainable variables the backward differentiates.
    x: a `tf.TensorSpec` (or tensor) of the batch to count for.
  """
  saved, output, _ = saved_tensors(fn, variables, x)
  return saved, output


def saved_tensors(fn, variables, x):
  """`saved_bytes`, and the bytes of the output itself among those saved
  (a ReLU's output, which ReluGrad reads): the next module's input is that
  same tensor, not a second one, on a device that holds both.

  Returns:
    (saved bytes, the output's `tf.TensorSpec`, output bytes saved or 0).
  """
  spec = tf.TensorSpec(x.shape, x.dtype)
  watch = spec.dtype.is_floating
  output, forward = [], set()

  def vjp(inputs):
    with tf.GradientTape() as tape:
      if watch:
        tape.watch(inputs)
      out = fn(inputs)
      total = tf.reduce_sum(tf.cast(out, tf.float32))
    output.append(out)
    # Every op traced so far is the forward's; the rest is the backward
    # (the tape also adds ops outside its name scope, e.g. the AddN that
    # sums the gradients of a tensor read twice).
    forward.update(op.name for op in tf.compat.v1.get_default_graph()
                   .get_operations())
    return tape.gradient(total, list(variables) + ([inputs] if watch else []))

  graph = tf.function(vjp, autograph=False).get_concrete_function(spec).graph
  saved = {}
  for op in graph.get_operations():
    if op.name in forward:
      continue
    for t in op.inputs:
      if t.op.name in forward and t.op.type not in _NOT_ACTIVATIONS:
        saved[t.name] = t
  out = output[0]
  return (_bytes(saved.values()), tf.TensorSpec(out.shape, out.dtype),
          _bytes([out]) if out.name in saved else 0)


def _variable_bytes(variables):
  return sum(int(np.prod(v.shape, dtype=np.int64)) * tf.as_dtype(v.dtype).size
             for v in variables)


@dataclasses.dataclass(frozen=True)
class ModuleFootprint:
  """One module's terms of the count, for one microbatch.

  Attributes:
    fixed: weights, slots, one set of gradients and the update's held
      operands (batch-independent).
    activations: bytes the body's backward reads, per microbatch.
    aux: bytes the aux head's backward reads, per microbatch.
    inputs: bytes of the module's input x_k, per microbatch.
    output_saved: bytes of h_k among `activations` (its backward reads it),
      per microbatch: module k + 1's input on the same device.
  """
  fixed: DeviceMemory
  activations: int
  aux: int
  inputs: int
  output_saved: int = 0


def footprints(trainer, features_spec):
  """Each module's `ModuleFootprint` for one microbatch of `features_spec`.

  Args:
    trainer: a built `InterlockTrainer` (its modules and optimizers).
    features_spec: a `tf.TensorSpec` (or tensor) of one microbatch of
      network inputs.
  """
  out, spec = [], tf.TensorSpec(features_spec.shape, features_spec.dtype)
  for k, module in enumerate(trainer.modules):
    act, out_spec, out_saved = saved_tensors(
        lambda x, m=module: m.body(x, training=True),
        module.body.trainable_variables, spec)
    aux = 0
    if module.has_aux_head:
      aux, _ = saved_bytes(lambda h, m=module: m.aux_head(h, training=True),
                           module.aux_head.trainable_variables, out_spec)
    fixed = DeviceMemory(
        weights=_variable_bytes(module.weights),
        slots=_variable_bytes(trainer.optimizers[k].variables),
        gradients=_variable_bytes(trainer.variables(k)),
        update=update_held_bytes(trainer.optimizers[k], trainer.variables(k)))
    out.append(ModuleFootprint(fixed, act, aux, _bytes([spec]), out_saved))
    spec = out_spec
  return out


def update_held_bytes(optimizer, variables):
  """Bytes of the tensors `optimizer`'s update of `variables` computes
  without the gradient and then combines with it.

  A scratch copy of the optimizer (its config, built on zero copies of the
  variables: the trainer's weights and slots are not touched) traces its
  update with the gradients as placeholders, nothing run. A tensor that
  needs no gradient, is not a variable read or a constant, and feeds an op
  that needs one is ready as soon as the step starts and is held until the
  gradient exists. Keras's SGD with momentum computes m * momentum so, one
  tensor of each weight's size (measured: 5.86 MB peak against a count of
  4.86 MB without it, the MLP of tests/test_memory_count.py); its plain
  SGD and Adam compute nothing of the kind (their updates start from the
  gradient) and measured within 1% of the count
  (docs/results/memory/README.md).

  Args:
    optimizer: a Keras optimizer (its class and config are read).
    variables: the variables it updates.

  Returns:
    Bytes; 0 for no variables.
  """
  if not variables:
    return 0
  # A LossScaleOptimizer runs its inner optimizer's update inside a
  # conditional (skipped on a non-finite gradient), out of the traced
  # graph's sight: the inner update is what it holds.
  optimizer = getattr(optimizer, "inner_optimizer", optimizer)
  copies = [tf.Variable(tf.zeros(v.shape, v.dtype)) for v in variables]
  scratch = optimizer.__class__.from_config(optimizer.get_config())
  scratch.build(copies)
  specs = [tf.TensorSpec(v.shape, v.dtype) for v in copies]

  def update(*gradients):
    scratch.apply(list(gradients), copies)

  graph = tf.function(update, autograph=False).get_concrete_function(
      *specs).graph
  # The ops that wait for a gradient: through their inputs, or through the
  # automatic control dependencies (a read of a slot after its update).
  waits = set()
  for op in graph.get_operations():  # In the order they were traced.
    if ((op.type == "Placeholder" and op.outputs[0].dtype != tf.resource) or
        any(t.op.name in waits for t in op.inputs) or
        any(c.name in waits for c in op.control_inputs)):
      waits.add(op.name)
  held = {}
  for op in graph.get_operations():
    if op.name not in waits:
      continue
    for t in op.inputs:
      if (t.op.name not in waits and t.dtype.is_floating and
          t.op.type not in _NOT_ACTIVATIONS):
        held[t.ref()] = t
  return _bytes(held.values())


def module_peak(footprint, num_microbatches=1, recompute=False):
  """What module k's device holds at its peak, from its `footprint` (one
  microbatch's terms): every microbatch in flight (the dataflow's bound),
  or with `recompute` every microbatch's input and one microbatch's
  activations (re-run inside its backward)."""
  m = num_microbatches
  grads = footprint.fixed.gradients * (2 if m > 1 else 1)
  held = 1 if recompute else m
  return dataclasses.replace(
      footprint.fixed, gradients=grads,
      activations=footprint.activations * held, aux=footprint.aux * held,
      inputs=footprint.inputs * m)


def count(footprints_, num_microbatches=1, recompute=False, one_device=False,
          lean=False, staged_inputs=0):
  """The count per device: a list of `DeviceMemory`, one per module, or
  one entry for all of them on one device.

  Args:
    footprints_: `footprints(...)` of one microbatch.
    num_microbatches: M.
    recompute: bool, or one per module.
    one_device: every module on one device (placement "single").
    lean: with one_device, the memory-lean order (one module's activations
      alive at a time); else every module's may be.
    staged_inputs: bytes of the batches a training call reads ahead, held
      by the first device: a loop of S steps fetches every step's batch as
      soon as it can (nothing orders the iterator's reads after the steps),
      so S - 1 batches beyond the current one may be alive at once.
  """
  if isinstance(recompute, bool):
    recompute = [recompute] * len(footprints_)
  peaks = [module_peak(f, num_microbatches, r)
           for f, r in zip(footprints_, recompute)]
  peaks[0] = peaks[0] + DeviceMemory(inputs=staged_inputs)
  if not one_device:
    return peaks
  fixed = sum((dataclasses.replace(p, activations=0, aux=0, inputs=0)
               for p in peaks), DeviceMemory())
  live = [DeviceMemory(activations=p.activations, aux=p.aux, inputs=p.inputs)
          for p in peaks]
  if lean:
    return [fixed + max(live, key=lambda d: d.total)]
  # An aux head's backward runs right after its forward, and a recomputed
  # module's activations live only while its backward runs: those are
  # alive one module at a time (the largest counts); the rest is kept.
  # Module k's input is module k - 1's output: one tensor, counted once
  # where module k - 1's backward keeps it anyway.
  shared = [0] + [0 if r else f.output_saved * num_microbatches
                  for f, r in zip(footprints_[:-1], recompute[:-1])]
  kept = sum((DeviceMemory(activations=0 if r else d.activations,
                           inputs=d.inputs - s)
              for d, r, s in zip(live, recompute, shared)), DeviceMemory())
  transient = max((DeviceMemory(activations=d.activations if r else 0,
                                aux=d.aux) for d, r in zip(live, recompute)),
                  key=lambda d: d.total)
  return [fixed + kept + transient]


def peak_bytes(run, devices):
  """Runs `run()` and returns {device: peak bytes} from TF's allocator
  statistics, each reset first. Devices that share an allocator (every
  logical CPU of a process) report the same, the process's peak."""
  for d in devices:
    _stats(tf.config.experimental.reset_memory_stats, d)
  run()
  return {d: _stats(tf.config.experimental.get_memory_info, d)["peak"]
          for d in devices}


def has_stats(device):
  """Whether TF keeps allocator statistics for `device` in this process."""
  try:
    tf.config.experimental.get_memory_info(device)
  except ValueError:
    return False
  return True


def _stats(fn, device):
  """fn(device), with TF's "Allocator stats not available" as one line
  that says how to get them."""
  try:
    return fn(device)
  except ValueError as e:
    raise ValueError(
        f"TF keeps no allocator statistics for {device} in this process: on "
        f"a CPU start TF with TF_ENABLE_ONEDNN_OPTS=1 (train.runtime_env "
        f"sets it) or TF_CPU_ALLOCATOR_USE_BFC=true. Received: "
        f"device={device!r}") from e


def allocator_names(placement, num_modules):
  """The names `get_memory_info` takes ("CPU:1") for each module's device;
  ["CPU:0"] for a placement without devices (everything on the default)."""
  if placement.devices is None:
    return ["CPU:0"]
  names = []
  for d in placement.devices[:num_modules]:
    spec = tf.DeviceSpec.from_string(d)
    names.append(f"{spec.device_type}:{spec.device_index or 0}")
  return list(dict.fromkeys(names))


def measure_step(run, devices):
  """What one call of `run()` allocates at its peak, above what was live
  before it: {device: bytes}.

  Garbage (an earlier trainer's variables, say) is collected first, and the
  bytes live before the call are subtracted, so the figure is the call's
  own: gradients, activations, inputs, temporaries. Add the weights and
  slots (`DeviceMemory.weights + slots`, exact) for what the device holds.
  """
  gc.collect()
  before = {d: _stats(tf.config.experimental.get_memory_info, d)["current"]
            for d in devices}
  peaks = peak_bytes(run, devices)
  return {d: peaks[d] - before[d] for d in devices}


def recompute_costs(costs):
  """The schedule model's op costs (`schedule.ModuleCost`s) of modules that
  recompute: the forward is paid again by the backward pass that runs
  first (the fused VJP, else the weight VJP)."""
  return [dataclasses.replace(
      c, weight_vjp=c.weight_vjp + c.forward,
      fused_vjp=None if c.fused_vjp is None else c.fused_vjp + c.forward)
          for c in costs]
