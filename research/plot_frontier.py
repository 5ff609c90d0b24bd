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

import io
import math
import sys

from absl import app
from absl import flags

from train import error_boundary
from train import user_files
from research import benchmark_lib

_REPORT = flags.DEFINE_string("report", None, "A research.benchmark JSON "
                              "report (--json_out): a regular file.")
_PNG = flags.DEFINE_string("png", None, "The PNG file to write the "
                           "frontier picture to (replaced if it exists; not "
                           "a link, a folder or a FIFO).")
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


def _finite(value):
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def drawable(report, path, memory="count"):
  """`points` of the report read from `path` whose numbers are all finite.

  A report of another shape (a cell that is no object, a step time that
  is text) is refused in one line naming the file; cells with NaN or
  infinite numbers are left out with a warning, and a report with none
  left is refused: a picture of nothing would say the run was fine.

  Raises:
    ValueError: one line naming --report and the file.
  """
  received = f"Received: report={path!r}"
  try:
    cells = points(report, memory)
  except (KeyError, TypeError, AttributeError, ValueError) as e:
    raise ValueError(f"--report={path} is not a research.benchmark report "
                     f"(its 'strategies' hold a cell of another shape: "
                     f"{type(e).__name__} {str(e)[:60]}). {received}"
                     ) from None
  if not cells:
    raise ValueError(f"--report={path} has no cell with a memory {memory} "
                     f"(a report from before memory was measured). "
                     f"{received}")
  kept = [(name, mb, ms, predicted if _finite(predicted) else None)
          for name, mb, ms, predicted in cells
          if _finite(mb) and _finite(ms)]
  if not kept:
    raise ValueError(f"--report={path}: no cell has a finite memory and "
                     f"step time (NaN or infinite in all {len(cells)}); "
                     f"nothing was drawn. {received}")
  left = sorted({c[0] for c in cells} - {c[0] for c in kept})
  if left:
    print(f"warning: --report={path}: cells {', '.join(left)} have NaN or "
          f"infinite numbers and are not drawn", file=sys.stderr, flush=True)
  return kept


def plot(report, cells, memory="count"):
  """The PNG (bytes) of the frontier of `cells` (`drawable`) of `report`
  (`points`' memory axis)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
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
  ax.set_title(f"{report.get('model')}, K = {report.get('num_modules')}, "
               f"{report.get('placement')}: filled measured "
               f"({report.get('num_cores')} cores){hollow}; outlined: the "
               f"frontier", fontsize=9)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  buffer = io.BytesIO()  # written by the caller, atomically
  fig.savefig(buffer, format="png", dpi=110)
  pyplot.close(fig)
  return buffer.getvalue()


@error_boundary.guard()
def main(argv):
  del argv
  if not _REPORT.value or not _PNG.value:
    raise ValueError("--report and --png are both needed. Received: "
                     f"report={_REPORT.value!r}, png={_PNG.value!r}")
  user_files.check_output(_PNG.value, "--png")
  report = user_files.read_json(_REPORT.value, "--report",
                                {"strategies": dict})
  cells = drawable(report, _REPORT.value, _MEMORY.value)
  user_files.write_output(_PNG.value, plot(report, cells, _MEMORY.value),
                          "--png")
  print(_PNG.value)


if __name__ == "__main__":
  app.run(main)
