r"""Draws the README's picture: each study's metric against wall time.

One figure, one panel per committed study (`research.compare`'s
`results.json`): the mean test metric of the network's head (and its
min-max band over seeds) against training seconds, solid as measured on the
study's machine, dashed on the step times the schedule model predicts with
one core per module. It reads only committed results, so the picture is
regenerated without training anything:

  python -m research.plot_study \
      --studies=docs/results/study_fashion_mnist,docs/results/study_fortunes_lm \
      --png_out=docs/results/study_vs_time.png
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env); the
# study's results.json is read by the shared reader of tf_interlock.
from train import runtime_env  # pylint: disable=unused-import

import io
import os
import sys

from absl import app
from absl import flags

from train import user_files

_STUDIES = flags.DEFINE_list(
    "studies", ["docs/results/study_fashion_mnist",
                "docs/results/study_fortunes_lm"],
    "Study folders, comma-separated, each holding a research.compare "
    "results.json.")
_PNG_OUT = flags.DEFINE_string(
    "png_out", "docs/results/study_vs_time.png",
    "Path of the PNG file to write (overwritten if it exists; not a link, "
    "a folder or a FIFO).")


def load_study(folder):
  """A study's results.json as a dict; one line naming the file if not."""
  path = os.path.join(folder, "results.json")
  if not os.path.isfile(path):
    raise ValueError(f"cannot read a study's results from {path} (no such "
                     f"file). Received: studies={folder}")
  summary = user_files.read_json(path, "--studies")
  if "strategies" not in summary or "metric" not in summary:
    raise ValueError(f"{path} is not a research.compare results.json (no "
                     f"'strategies' or 'metric'). Received: studies={folder}")
  return summary


def curves(summary):
  """Per strategy: measured seconds, predicted seconds, mean, min, max.

  Predicted seconds are the step index times the schedule model's step time
  with one core per module (`predicted_step_s["one_core_per_module"]`); a
  study without a projection has None there.
  """
  out = {}
  for strategy, row in summary["strategies"].items():
    points = row["curve"]
    predicted = (row.get("predicted_step_s") or {}).get(
        "one_core_per_module")
    out[strategy] = {
        "seconds": [p["seconds"] for p in points],
        "predicted": (None if predicted is None else
                      [p["step"] * predicted for p in points]),
        "mean": [p["mean"] for p in points],
        "min": [p["min"] for p in points],
        "max": [p["max"] for p in points],
    }
  return out


def draw(summaries):
  """The figure's PNG bytes: one panel per study."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, panels = pyplot.subplots(1, len(summaries),
                                   figsize=(6.5 * len(summaries), 4.5),
                                   squeeze=False)
  for axes, summary in zip(panels[0], summaries):
    for strategy, c in curves(summary).items():
      line, = axes.plot(c["seconds"], c["mean"], marker="o", markersize=3,
                        label=f"{strategy} (measured here)")
      axes.fill_between(c["seconds"], c["min"], c["max"],
                        color=line.get_color(), alpha=0.15)
      if c["predicted"] is not None:
        axes.plot(c["predicted"], c["mean"], linestyle="--",
                  color=line.get_color(), linewidth=1,
                  label=f"{strategy} (predicted, 1 core/module)")
    axes.set_xlabel("training seconds (no tracing, no evaluation)")
    axes.set_ylabel(f"{summary['metric']} of the network's head "
                    "(mean, min-max over seeds)")
    axes.set_title(f"{summary['preset']}, K = {summary['num_modules']}, "
                   f"{len(summary['seeds'])} seed(s), "
                   f"{summary['cores_here']} CPU cores")
    if not summary.get("higher_is_better", True):
      axes.set_yscale("log")
    axes.set_xlim(left=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
  buffer = io.BytesIO()
  figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
  pyplot.close(figure)
  return buffer.getvalue()


def _refuse(e):
  """Leaves with the one line of `e` on stderr, status 1 (as
  error_boundary would: this binary runs without it)."""
  print(f"error: {e}", file=sys.stderr, flush=True)
  sys.exit(1)


def main(argv):
  if len(argv) > 1:  # one line, not absl's usage text
    sys.exit(f"error: Unexpected arguments: {argv[1:]}: this binary takes "
             f"no positional arguments, only --name=value flags (see "
             f"--helpshort). Received: arguments={argv[1:]!r}")
  try:
    user_files.check_output(_PNG_OUT.value, "--png_out")
    summaries = [load_study(folder) for folder in _STUDIES.value]
  except ValueError as e:  # one line, as error_boundary would print it
    _refuse(e)
  png = draw(summaries)
  try:
    user_files.write_output(_PNG_OUT.value, png, "--png_out")
  except ValueError as e:  # the path changed while drawing
    _refuse(e)
  print(f"wrote {_PNG_OUT.value} ({len(png)} bytes) from "
        f"{', '.join(_STUDIES.value)}")


if __name__ == "__main__":
  app.run(main)
