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


def points(report):
  """(name, MB per device, measured ms, predicted ms or None) per cell that
  has a memory count."""
  out = []
  for name, row in report["strategies"].items():
    counts = row.get("memory_count_mb")
    if not counts:
      continue
    predicted = row.get("predicted_step_s")
    out.append((name, max(c["total"] for c in counts),
                1e3 * row["measured_step_s"],
                None if predicted is None else 1e3 * predicted))
  return out


def frontier(cells):
  """The names of `cells` ((name, MB, ms, ...)) that no other cell beats on
  both memory and time."""
  return {name for name, mb, ms, *_ in cells
          if not any(m2 <= mb and t2 < ms or m2 < mb and t2 <= ms
                     for _, m2, t2, *_ in cells)}


def plot(report, out):
  """Draws the frontier of `report` into the PNG `out`."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  cells = points(report)
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
  ax.set_xlabel("peak memory per device, MB (count; largest device)")
  ax.set_ylabel("ms per step")
  ax.set_title(f"{report['model']}, K = {report['num_modules']}, "
               f"{report['placement']}: filled measured "
               f"({report['num_cores']} cores), hollow predicted (one core "
               f"per module); outlined: the frontier", fontsize=9)
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
  if not points(report):
    raise ValueError(f"{_REPORT.value} has no cell with a memory count "
                     f"(a report from before memory was measured). "
                     f"Received: report={_REPORT.value!r}")
  plot(report, _PNG.value)
  print(_PNG.value)


if __name__ == "__main__":
  app.run(main)
