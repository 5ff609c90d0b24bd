r"""The frontier: step time against peak memory per device, every cell.

  python -m research.plot_frontier \
      --report=docs/results/memory/mlp_k4_simulated.json \
      --png=docs/results/memory/frontier_mlp_k4.png

Reads one `research.benchmark --json_out` report. Each cell (strategy x M x
recompute) is one point: its peak memory per device (the largest device's
count, `step_model.memory.count`; on simulated CPUs TF measures only the
process's sum over devices, which the count is checked against in the
report) against its measured step time (filled) and the schedule model's
prediction for one core per module (hollow, "predicted"). The cells on the
lower-left edge are the frontier: no other cell is both faster and smaller.
"""

# First: checks the environment and quiets TF before TensorFlow loads.
from train import runtime_env  # pylint: disable=unused-import,g-bad-import-order

import json

from absl import app
from absl import flags

from train import error_boundary
from research import benchmark_lib

_REPORT = flags.DEFINE_string("report", None, "A research.benchmark JSON "
                              "report (--json_out).")
_PNG = flags.DEFINE_string("png", None, "The PNG file to write the "
                           "frontier picture to (replaced if it exists).")
_MEMORY = flags.DEFINE_enum(
    "memory", "count", ["count", "measured"], "The memory axis: count (the "
    "largest device's count) or measured (TF's allocator peak; on "
    "simulated CPUs, which share one allocator, the process's total).")

_AXIS = {"count": "peak memory per device, MB (count; largest device)",
         "measured": "peak memory, MB (measured; one allocator: the sum over "
                     "devices on simulated CPUs)"}


def points(report, memory="count"):
  """(name, MB, measured ms, predicted ms or None) per cell that has a
  memory count (memory="count": the largest device's) or a measured peak
  (memory="measured": the largest device's allocator peak)."""
  out = []
  for name, row in report["strategies"].items():
    if memory == "count":
      mb = [c["total"] for c in row.get("memory_count_mb") or []]
    else:
      mb = list((row.get("memory_measured_mb") or {}).values())
    if not mb:
      continue
    predicted = row.get("predicted_step_s")
    out.append((name, max(mb),
                1e3 * row["measured_step_s"],
                None if predicted is None else 1e3 * predicted))
  return out


def frontier(cells):
  """The names of `cells` ((name, MB, ms, ...)) that no other cell beats on
  both memory and time."""
  return {name for name, mb, ms, *_ in cells
          if not any(m2 <= mb and t2 < ms or m2 < mb and t2 <= ms
                     for _, m2, t2, *_ in cells)}


def plot(report, out, memory="count"):
  """Draws the frontier of `report` into the PNG `out` (`points`' memory
  axis)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  cells = points(report, memory)
  best = frontier(cells)
  fig, ax = pyplot.subplots(figsize=(8, 5.5))
  colors = {"e2e": "tab:blue", "local": "tab:green"}
  for name, mb, ms, predicted in cells:
    strategy, _ = benchmark_lib.parse_cell(name)
    color = colors.get(strategy, "tab:orange" if strategy == "2wise"
                       else "tab:purple")
    ax.scatter(mb, ms, color=color, s=60 if name in best else 30,
               edgecolors="black" if name in best else "none")
    ax.annotate(name, (mb, ms), fontsize=7, xytext=(3, 3),
                textcoords="offset points")
    if predicted is not None:
      ax.scatter(mb, predicted, facecolors="none", edgecolors=color, s=30)
  ax.set_xlabel(_AXIS[memory])
  ax.set_ylabel("ms per step")
  hollow = (", hollow predicted (one core per module)"
            if any(c[3] is not None for c in cells) else "")
  ax.set_title(f"{report['model']}, K = {report['num_modules']}, "
               f"{report['placement']}: filled measured "
               f"({report['num_cores']} cores){hollow}; outlined: the "
               f"frontier", fontsize=9)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(out, dpi=110)


@error_boundary.guard()
def main(argv):
  del argv
  if not _REPORT.value or not _PNG.value:
    raise ValueError("--report and --out are both needed. Received: "
                     f"report={_REPORT.value!r}, png={_PNG.value!r}")
  with open(_REPORT.value) as f:
    report = json.load(f)
  if not points(report, _MEMORY.value):
    raise ValueError(f"{_REPORT.value} has no cell with a memory "
                     f"{_MEMORY.value} (a report from before memory was "
                     f"measured). Received: report={_REPORT.value!r}")
  plot(report, _PNG.value, _MEMORY.value)
  print(_PNG.value)


if __name__ == "__main__":
  app.run(main)
