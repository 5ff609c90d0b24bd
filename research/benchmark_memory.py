"""Memory per device of a benchmark cell: measured beside the count.

`research.benchmark` adds `memory_row` to every cell it times: one more
`train_loop` call (steps_per_loop steps) whose peak allocation is read from
TF's allocator statistics (`step_model.memory.measure_step`), next to the
count of what each device must hold (`step_model.memory.count`) and the
count's error.

On simulated devices every logical CPU shares the process's one allocator
(`step_model.memory`): the measured figure is then the sum over devices at
the worst moment, compared with the sum of the per-device counts. Where
devices have their own allocator (GPUs) each device is compared with its
own count.
"""

import tensorflow as tf

from step_model import memory


def _mb(value):
  return round(value / 1e6, 2)


def memory_row(trainer, batch, microbatches=1, recompute=False, lean=False):
  """A cell's peak memory per device, measured and counted.

  Args:
    trainer: the cell's built `InterlockTrainer` (timed already: traced).
    batch: (features, labels), one global batch of the cell.
    microbatches: M of the cell.
    recompute, lean: as the trainer was built (see `memory.count`).

  Returns:
    {"memory_measured_mb": {device: MB}, "memory_shared_allocator": bool,
     "memory_count_mb": [per device, by kind], "memory_count_over_measured":
     the count's total over the measured one (1.0: exact)}; the measured
    figures are None where TF keeps no allocator statistics.
  """
  one_device = trainer.placement.devices is None
  devices = memory.allocator_names(trainer.placement, trainer.num_modules)
  step = None
  if memory.has_stats(devices[0]):
    dataset = tf.data.Dataset.from_tensors(batch)
    iterator = iter(trainer.distribute_dataset(dataset.repeat()))
    step = memory.measure_step(lambda: trainer.train_loop(iterator), devices)
  x = batch[0]
  shape = (x.shape[0] // microbatches,) + x.shape[1:]
  footprints = memory.footprints(trainer,
                                 tf.TensorSpec(shape, tf.as_dtype(x.dtype)))
  staged = (trainer.steps_per_loop - 1) * sum(
      t.size * t.dtype.itemsize for t in batch)
  counts = memory.count(footprints, microbatches, recompute=recompute,
                        one_device=one_device, lean=lean,
                        staged_inputs=staged)
  shared = len(devices) < len(counts) or all(
      d.startswith("CPU") for d in devices)
  if step is None:  # no allocator statistics: the count alone
    measured, over = None, None
  elif shared:
    held = sum(c.weights + c.slots for c in counts)
    measured = {d: held + b for d, b in step.items()}
    over = sum(c.total for c in counts) / measured[devices[0]]
  else:
    measured = {d: counts[k].weights + counts[k].slots + step[d]
                for k, d in enumerate(devices)}
    over = max(c.total / measured[d] for c, d in zip(counts, devices))
  return {"memory_measured_mb": measured and {
      d: _mb(b) for d, b in measured.items()},
          "memory_shared_allocator": shared,
          "memory_count_mb": [c.as_mb() for c in counts],
          "memory_count_over_measured": over and round(over, 3)}


def format_memory(strategies):
  """The report's memory lines: per cell the measured peak, the count and
  the count's error (None when no cell measured it)."""
  rows = {n: r for n, r in strategies.items() if r.get("memory_measured_mb")}
  if not rows:
    return None
  lines = ["", "Memory (MB): measured peak (one allocator for every logical "
           "CPU: the process's sum over devices), counted (per device, "
           "their sum) and the count over the measured:",
           f"{'strategy':14s} {'measured':>9s} {'count':>8s} {'count/meas':>10s}"
           f"  count per device"]
  for name, row in rows.items():
    measured = max(row["memory_measured_mb"].values())
    counts = [c["total"] for c in row["memory_count_mb"]]
    lines.append(f"{name:14s} {measured:9.1f} {sum(counts):8.1f} "
                 f"{row['memory_count_over_measured']:10.2f}  "
                 f"{' '.join(f'{c:.1f}' for c in counts)}")
  return "\n".join(lines)
