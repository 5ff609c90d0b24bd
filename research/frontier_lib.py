"""The predicted frontier, as functions of values: no flags, no profiling.

A cell (`benchmark_lib.parse_cell`: strategy x M x recompute) is predicted
for one device per module: its step time by the schedule model
(`benchmark_lib.predict`, K cores, one thread per op, no contention) and
its memory by the count (`step_model.memory.count`, the largest device's
total). `research.predict_frontier` measures the inputs and draws them.
"""

import dataclasses
import io

from research import benchmark_lib
from step_model import memory

STRATEGIES = ("e2e", "local", "2wise", "3wise")
MICROBATCHES = (1, 2, 4, 8)
# A pipeline "at equal memory" may hold this much more than the cell it is
# compared with: M >= 2 doubles the gradients (0.5% of ResNet-20's largest
# device), far below the count's own error.
EQUAL_MEMORY_TOLERANCE = 0.02


def cell_names(strategies=STRATEGIES, microbatches=MICROBATCHES):
  """Every cell: each strategy at each M, without and with recomputation
  ("2wise-m4", "2wise-m4-rc"; M = 1 has no "-m1")."""
  names = []
  for recompute in (False, True):
    for strategy in strategies:
      for m in microbatches:
        name = strategy if m == 1 else f"{strategy}-m{m}"
        names.append(name + ("-rc" if recompute else ""))
  return names


def footprints_to_json(footprints):
  """A list of `memory.ModuleFootprint` as JSON-ready dicts (bytes)."""
  return [dataclasses.asdict(f) for f in footprints]


def footprints_from_json(rows):
  """The inverse of `footprints_to_json`."""
  return [memory.ModuleFootprint(
      memory.DeviceMemory(**row["fixed"]), row["activations"], row["aux"],
      row["inputs"], row["output_saved"]) for row in rows]


def predict_cell(name, costs, microbatch_costs, footprints, staged_bytes):
  """One cell's prediction with one device per module.

  Args:
    name: the cell ("2wise-m4-rc").
    costs: K `schedule.ModuleCost`s of the whole batch.
    microbatch_costs: {M: K `ModuleCost`s measured at batch / M}.
    footprints: {M: K `memory.ModuleFootprint`s of one microbatch of
      batch / M}; M = 1 is the whole batch.
    staged_bytes: bytes of the batches a training call reads ahead
      (`memory.count`'s staged_inputs).

  Returns:
    {"step_ms", "memory_mb" (the largest device), "memory_per_device_mb"}.
  """
  m = benchmark_lib.parse_cell(name)[1]
  if m not in footprints:
    raise ValueError(f"cell {name} needs the footprints of batch / {m}; "
                     f"measured only for M in {sorted(footprints)}. "
                     f"Received: name={name!r}")
  step = benchmark_lib.predict(costs, name, num_cores=len(costs), threads=1,
                               microbatch_costs=microbatch_costs)
  devices = memory.count(
      footprints[m], m, recompute=benchmark_lib.cell_options(name)[
          "recompute"], staged_inputs=staged_bytes)
  per_device = [round(d.total / 1e6, 2) for d in devices]
  return {"step_ms": round(1e3 * step, 2), "memory_mb": max(per_device),
          "memory_per_device_mb": per_device}


def frontier(cells, tolerance=1e-3):
  """The names of the cells ({name: {"step_ms", "memory_mb"}}) that no
  other cell beats on both, in `cells`' order. A cell beats another when it
  is no larger and no slower and, by more than `tolerance` (a fraction),
  smaller or faster: cells that tie up to the simulation's rounding (two
  strategies bound by the same device) stay together."""
  def beats(b, a):
    return (b["memory_mb"] <= a["memory_mb"] and b["step_ms"] <= a["step_ms"]
            and (b["memory_mb"] < a["memory_mb"] * (1 - tolerance) or
                 b["step_ms"] < a["step_ms"] * (1 - tolerance)))
  return [n for n, a in cells.items()
          if not any(beats(b, a) for b in cells.values())]


def versus_pipeline(cells, tolerance=EQUAL_MEMORY_TOLERANCE):
  """Each interlocking cell (not e2e) against the fastest e2e pipeline
  (e2e-mM, M >= 2, with or without recomputation) that holds at most
  (1 + tolerance) times its memory per device.

  Returns:
    {name: {"pipeline": the pipeline cell or None (none fits),
            "speedup": the pipeline's step over the cell's (> 1: the cell
            is faster), or None}}.
  """
  pipes = {n: c for n, c in cells.items() if benchmark_lib.is_pipeline(n)}
  out = {}
  for name, cell in cells.items():
    if benchmark_lib.parse_cell(name)[0] == "e2e":
      continue
    fits = [n for n, p in pipes.items()
            if p["memory_mb"] <= cell["memory_mb"] * (1 + tolerance)]
    best = min(fits, key=lambda n: pipes[n]["step_ms"], default=None)
    out[name] = {"pipeline": best, "speedup": None if best is None else round(
        pipes[best]["step_ms"] / cell["step_ms"], 3)}
  return out


def _spread(values):
  values = [v for v in values if v is not None]
  return [round(min(values), 3), round(max(values), 3)] if values else None


def measured_error(report, costs, microbatch_costs):
  """The model's error on a measured `research.benchmark` report of the
  same network and K on simulated devices: each cell that the schedule
  model takes (not the memory-lean ones) predicted on the report's plan
  (its cores, one device per module, one thread per op, a process's
  inter-op pool of K threads) from `costs`, over its measured step; and
  the count over the measured memory (the report's, a sum over devices on
  simulated CPUs).

  Returns:
    {"time_model_over_measured": [min, max], "time_cells": {name: ratio},
     "memory_count_over_measured": [min, max]}.
  """
  k = len(costs)
  time_cells = {}
  for name, row in report["strategies"].items():
    if benchmark_lib.cell_options(name)["memory_lean"]:
      continue
    predicted = benchmark_lib.predict(
        costs, name, report["num_cores"], 1, module_devices=list(range(k)),
        microbatch_costs=microbatch_costs, ops_per_device=k)
    time_cells[name] = round(predicted / row["measured_step_s"], 3)
  return {"time_model_over_measured": _spread(time_cells.values()),
          "time_cells": time_cells,
          "memory_count_over_measured": _spread(
              r.get("memory_count_over_measured")
              for r in report["strategies"].values())}


def _coinciding(cells, tolerance=2e-3):
  """{(MB, ms): the names of the cells drawn at that point, or within
  `tolerance` (a fraction) of it on both axes}."""
  points = {}
  for name, cell in cells.items():
    here = (cell["memory_mb"], cell["step_ms"])
    near = [p for p in points
            if all(abs(a - b) <= tolerance * b for a, b in zip(here, p))]
    points.setdefault(near[0] if near else here, []).append(name)
  return points


def _label(names):
  """One label for cells at one point: "e2e/local-m4-rc" when they differ
  only in the strategy, else the names."""
  strategies = [benchmark_lib.parse_cell(n)[0] for n in names]
  rests = {n[len(s):] for n, s in zip(names, strategies)}
  if len(rests) == 1:
    return "/".join(strategies) + rests.pop()
  return ", ".join(names)


def plot(result):
  """The PNG (bytes) of `result` (`research.predict_frontier`'s JSON for
  one K): hollow markers (predicted), the frontier outlined."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  colors = {"e2e": "tab:blue", "local": "tab:green", "2wise": "tab:orange",
            "3wise": "tab:purple"}
  best = set(result["frontier"])
  fig, ax = pyplot.subplots(figsize=(9, 6))
  # Cells that coincide (the same device bounds every strategy) show as
  # concentric rings: one size per strategy.
  for size, (strategy, color) in zip((25, 55, 95, 145), colors.items()):
    for recompute, marker in ((False, "o"), (True, "s")):
      names = [n for n in result["cells"]
               if benchmark_lib.parse_cell(n)[0] == strategy and
               benchmark_lib.cell_options(n)["recompute"] == recompute]
      if names:
        ax.scatter([result["cells"][n]["memory_mb"] for n in names],
                   [result["cells"][n]["step_ms"] for n in names],
                   facecolors="none", edgecolors=color, marker=marker,
                   s=size, label=strategy + (" recompute" if recompute
                                             else ""))
  for (mb, ms), names in _coinciding(result["cells"]).items():
    ax.annotate(_label(names), (mb, ms), fontsize=6, xytext=(5, 3),
                textcoords="offset points",
                weight="bold" if best & set(names) else "normal")
  edge = sorted((result["cells"][n]["memory_mb"], result["cells"][n][
      "step_ms"]) for n in best)
  ax.step([e[0] for e in edge], [e[1] for e in edge], where="post",
          color="black", linewidth=0.8, label="predicted frontier")
  error = result["measured_error"]

  def spread(key):
    return "-" if error.get(key) is None else "{:.2f}-{:.2f}".format(
        *error[key])

  ax.set_xlabel("peak memory per device, MB (count; largest device)")
  ax.set_ylabel("ms per step (schedule model)")
  ax.set_title(
      f"PREDICTED, one device per module: {result['model']}, K = "
      f"{result['num_modules']}, batch {result['batch_size']} (hollow: "
      f"not measured)\nthe model's measured error on "
      f"{error.get('plan', 'the measured plan')}: time model/measured "
      f"{spread('time_model_over_measured')}, memory count/measured "
      f"{spread('memory_count_over_measured')}", fontsize=8)
  ax.legend(fontsize=7, title="predicted", title_fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  buffer = io.BytesIO()  # written by the caller, atomically
  fig.savefig(buffer, format="png", dpi=110)
  pyplot.close(fig)
  return buffer.getvalue()
