r"""Every device's timeline: one row per device, its ops as bars over time.

  python -m train.train --preset=synthetic_mlp --placement=simulated \
      --model_dir=/tmp/tl --profile_steps=11,15
  python -m research.timeline --model_dir=/tmp/tl \
      --png=docs/results/timeline/2wise_k4.png

Reads the newest profiler trace of a train.train run (--model_dir, written
by --profile_steps) or of any TensorBoard log folder (--tensorboard_dir,
e.g. the "train" folder of `keras.callbacks.TensorBoard(profile_batch=...)`),
puts each op on the device whose executor ran it (research/trace_reader.py)
and draws one PNG: ops coloured forward, backward, update or transfer (a
transfer's bar includes its wait for the tensor). Prints each device's busy
fraction and how much of the time two or more devices were busy, as JSON.
"""

# First: checks the environment and quiets TF before TensorFlow loads.
from train import runtime_env  # pylint: disable=unused-import,g-bad-import-order

import io
import json

from absl import app
from absl import flags

from research import trace_reader
from train import error_boundary
from train import run_dir
from train import user_files

_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "A train.train run folder with a trace "
    "(--profile_steps): its newest one in train/plugins/profile is drawn.")
_TENSORBOARD_DIR = flags.DEFINE_string(
    "tensorboard_dir", None, "Instead of --model_dir: a TensorBoard log folder "
    "holding plugins/profile (e.g. TensorBoard(log_dir)'s train folder).")
_PNG = flags.DEFINE_string("png", None, "The PNG file to write (replaced if "
                           "it exists; not a link, a folder or a FIFO).")
_TITLE = flags.DEFINE_string("title", None, "The picture's title; none: the "
                             "trace's path.")

COLOURS = {"forward": "tab:blue", "backward": "tab:orange",
           "update": "tab:green", "transfer": "tab:gray"}


def trace_path(model_dir=None, log_dir=None):
  """The newest .xplane.pb of the run `model_dir` or the folder `log_dir`.

  Raises:
    ValueError: one line if neither or both are given, or there is no trace.
  """
  if (model_dir is None) == (log_dir is None):
    raise ValueError("give one of --model_dir and --tensorboard_dir. "
                     f"Received: model_dir={model_dir!r}, "
                     f"tensorboard_dir={log_dir!r}")
  folder = (run_dir.RunDir(model_dir).train_log_dir if model_dir else
            log_dir)
  found = trace_reader.find_traces(folder)
  if not found:
    name, value = (("model_dir", model_dir) if model_dir else
                   ("tensorboard_dir", log_dir))
    raise ValueError(f"no profiler trace in {folder}/plugins/profile: train "
                     f"with --profile_steps=FIRST,LAST (or TensorBoard("
                     f"profile_batch=...)) first. Received: {name}={value!r}")
  return found[-1]


def plot(trace, title):
  """The PNG (bytes) of `trace` (a `trace_reader.Trace`)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  devices = trace.devices
  figure, axes = pyplot.subplots(figsize=(11, 0.6 * len(devices) + 1.4))
  for row, device in enumerate(devices):
    for kind, colour in COLOURS.items():
      bars = [(1e3 * op.start_s, max(1e3 * (op.end_s - op.start_s), 1e-3))
              for op in trace.ops if op.device == device and op.kind == kind]
      axes.broken_barh(bars, (row - 0.4, 0.8), facecolors=colour,
                       label=kind if row == 0 else None)
  axes.set_yticks(range(len(devices)), [d.lstrip("/") for d in devices])
  axes.invert_yaxis()
  axes.set_xlim(0, 1e3 * trace.span_s)
  axes.set_xlabel("ms since the first op")
  axes.set_title(title, fontsize=9)
  axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4,
              fontsize=8, frameon=False)
  figure.tight_layout()
  buffer = io.BytesIO()  # written by the caller, atomically
  figure.savefig(buffer, format="png", dpi=80)
  pyplot.close(figure)
  return buffer.getvalue()


@error_boundary.guard()
def main(argv):
  del argv
  if not _PNG.value:
    raise ValueError("--png is required. Received: png=None")
  user_files.check_output(_PNG.value, "--png")  # before reading the trace
  path = trace_path(_MODEL_DIR.value, _TENSORBOARD_DIR.value)
  trace = trace_reader.read(path)
  user_files.write_output(_PNG.value, plot(trace, _TITLE.value or path),
                          "--png")
  print(json.dumps(dict(trace_reader.summary(trace), trace=path,
                        png=_PNG.value), indent=1))


if __name__ == "__main__":
  app.run(main)
