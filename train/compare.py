r"""Every strategy for the same wall-clock budget: `python -m train.compare`.

  python -m train.compare --preset=synthetic_mlp --placement=simulated \
      --strategies=e2e,local,2wise,3wise --budget_s=300 --eval_interval_s=30 \
      --out_dir=/tmp/compare

Each strategy trains in its own `python -m train.train` process (placement
configures devices per process) for --budget_s into out_dir/<strategy>, with
--preset and every Config flag given here. Without --train_steps or --epochs
only the budget stops a run (a step-based LR schedule is then constant).
Unless --eval_every_steps is given, a short probe run per strategy measures
its step time and eval_every_steps is set to evaluate every eval_interval_s.
Curve times are eval events' wall_time minus the start of the first step.

A strategy with an out_dir/<strategy>/result.json is not rerun; an unfinished
one restarts from scratch, so each gets exactly one budget. Writes
results.json, report.md and (with matplotlib) metric_vs_time.png to out_dir.
"""

import collections
import dataclasses
import glob
import io
import json
import os
import shlex
import statistics
import subprocess
import sys

from absl import app
from absl import flags
from tensorboard.backend.event_processing import event_file_loader
import tensorflow as tf

from train import config as config_lib
from train import flags_lib

_STRATEGIES = flags.DEFINE_list("strategies", ["e2e", "local", "2wise",
                                               "3wise"], "Strategies to run.")
_BUDGET_S = flags.DEFINE_float("budget_s", 600.0,
                               "Training wall-clock seconds per strategy.")
_EVAL_INTERVAL_S = flags.DEFINE_float(
    "eval_interval_s", 60.0, "Wall-clock seconds between evaluations.")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "Runs and reports go here.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SET_BY_COMPARE = {"strategy": "--strategies", "time_budget_s": "--budget_s",
                  "model_dir": "--out_dir", "export_dir": "--out_dir"}
PROBE_LOOPS = 3
NEVER = 10**9
RESULT_FILE = "result.json"


class RunError(RuntimeError):
  """A train.train process failed; the message holds the end of its log."""


def config_overrides():
  """{field: flag text} of the Config flags set; only a budget by default.

  Without --train_steps or --epochs both flags are set to none here, so that
  this process's Config and the runs' agree.
  """
  given = [field.name for field in dataclasses.fields(config_lib.Config)
           if not flags.FLAGS[field.name].using_default_value]
  for field in SET_BY_COMPARE:
    if field in given:
      raise ValueError(f"--{field} is set by compare; use "
                       f"{SET_BY_COMPARE[field]}. Received: {field}="
                       f"{flags.FLAGS[field].value!r}")
  if "train_steps" not in given and "epochs" not in given:
    flags.FLAGS.train_steps = flags.FLAGS.epochs = "none"
    given += ["train_steps", "epochs"]
  return {field: flags.FLAGS[field].value for field in given}


def train_args(overrides, **run_flags):
  """train.train's flags: the preset, the overrides, then `run_flags`."""
  merged = {**overrides, **{k: str(v) for k, v in run_flags.items()}}
  return [f"--preset={flags_lib.PRESET.value}"] + [
      f"--{name}={value}" for name, value in merged.items()]


def launch(args, log_path):
  """Runs `python -m train.train args`, its output into `log_path`."""
  print(f"  train.train {' '.join(shlex.quote(a) for a in args)}", flush=True)
  tail = collections.deque(maxlen=20)
  with tf.io.gfile.GFile(log_path, "w") as log:
    proc = subprocess.Popen(
        [sys.executable, "-m", "train.train", *args], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in proc.stdout:
      log.write(line)
      tail.append(line)
    proc.wait()
  if proc.returncode:
    raise RunError(f"train.train exited with {proc.returncode}; end of "
                   f"{log_path}:\n{''.join(tail)}")


def read_scalars(event_dir):
  """{tag: [(step, wall_time, value)]} from a run's event files, by step."""
  found = collections.defaultdict(list)
  for path in glob.glob(os.path.join(event_dir, "events.out.tfevents.*")):
    for event in event_file_loader.EventFileLoader(path).Load():
      for value in event.summary.value:
        found[value.tag].append(
            (event.step, event.wall_time, float(tf.make_ndarray(
                value.tensor))))
  return {tag: sorted(points) for tag, points in found.items()}


def eval_every_steps(step_s, interval_s, steps_per_loop):
  """Whole loops between evaluations, so they fall every `interval_s`."""
  return steps_per_loop * max(1, round(interval_s / (step_s * steps_per_loop)))


def probe_step_time(overrides, strategy, out_dir, steps_per_loop):
  """Seconds per step of `strategy`, from a short run (tracing excluded)."""
  probe_dir = os.path.join(out_dir, f"probe_{strategy}")
  if tf.io.gfile.exists(probe_dir):
    tf.io.gfile.rmtree(probe_dir)
  launch(train_args(overrides, strategy=strategy, model_dir=probe_dir,
                    train_steps=PROBE_LOOPS * steps_per_loop, epochs="none",
                    time_budget_s="none", eval_batches=1,
                    eval_every_steps=NEVER, checkpoint_every_steps=NEVER),
         os.path.join(out_dir, "logs", f"probe_{strategy}.log"))
  times = read_scalars(os.path.join(probe_dir, "train"))["step_time_s"]
  tf.io.gfile.rmtree(probe_dir)
  return statistics.median(value for _, _, value in times[1:])


def summarize_run(model_dir, metric):
  """Steps, step time, final evaluation and curve of a finished run."""
  train = read_scalars(os.path.join(model_dir, "train"))
  evals = read_scalars(os.path.join(model_dir, "eval"))
  step_times = train["step_time_s"]
  # A run starts at step 0, so its first loop began step_time_s * step
  # seconds before the first train event was written.
  first_step, first_wall, first_time = step_times[0]
  origin = first_wall - first_time * first_step
  final_step = evals[f"final/{metric}"][-1][0]
  heads = collections.defaultdict(dict)
  for tag, points in evals.items():
    head, name = tag.split("/", 1)
    heads[head].update({name: v for step, _, v in points if step == final_step})
  return {
      "steps": step_times[-1][0],
      # The first loop also traces the step function.
      "median_step_s": statistics.median(
          v for _, _, v in step_times[1:] or step_times),
      "training_s": step_times[-1][1] - origin,
      "eval": dict(sorted(heads.items(), key=lambda kv: _head_order(kv[0]))),
      "curve": [{"step": step, "seconds": wall - origin, "value": value}
                for step, wall, value in evals[f"final/{metric}"]],
  }


def _head_order(head):
  """exit_1, exit_2, ..., final."""
  return (head == "final", int(head.split("_")[1]) if "_" in head else 0)


def write_json(path, value):
  """Writes `value` to `path` atomically (a reader sees old or new)."""
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    json.dump(value, f, indent=2)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def run_strategy(strategy, overrides, settings, config, out_dir):
  """Trains one strategy unless its result exists; returns its result."""
  model_dir = os.path.join(out_dir, strategy)
  result_path = os.path.join(model_dir, RESULT_FILE)
  if tf.io.gfile.exists(result_path):
    with tf.io.gfile.GFile(result_path) as f:
      result = json.load(f)
    if result["settings"] != settings:
      raise ValueError(f"{result_path} comes from other settings "
                       f"{result['settings']}; use a new --out_dir. "
                       f"Received: {settings}")
    print(f"{strategy}: finished earlier, not rerun", flush=True)
    return result
  if tf.io.gfile.exists(model_dir):
    print(f"{strategy}: restarting the unfinished run in {model_dir}")
    tf.io.gfile.rmtree(model_dir)
  every, probe_s = config.eval_every_steps, None
  if "eval_every_steps" not in overrides:
    probe_s = probe_step_time(overrides, strategy, out_dir,
                              config.steps_per_loop)
    every = eval_every_steps(probe_s, settings["eval_interval_s"],
                             config.steps_per_loop)
  print(f"{strategy}: {settings['budget_s']:g} s, evaluating every {every} "
        "steps", flush=True)
  launch(train_args(overrides, strategy=strategy, model_dir=model_dir,
                    time_budget_s=settings["budget_s"],
                    eval_every_steps=every),
         os.path.join(out_dir, "logs", f"{strategy}.log"))
  result = summarize_run(model_dir, settings["metric"])
  result.update(settings=settings, eval_every_steps=every,
                probe_step_s=probe_s)
  write_json(result_path, result)
  return result


def add_speedups(results):
  """speedup_vs_e2e: e2e's median step time over each strategy's."""
  base = results.get("e2e", {}).get("median_step_s")
  for row in results.values():
    row["speedup_vs_e2e"] = base / row["median_step_s"] if base else None


def report_markdown(summary):
  """The table of results and the command that produced them."""
  metric, results = summary["metric"], summary["strategies"]
  exits = [h for h in next(iter(results.values()))["eval"] if h != "final"]
  lines = [
      f"# {summary['preset']}: {summary['budget_s']:g} s of training per "
      "strategy", "",
      f"Test {metric} of the last head and of each exit at the end of the "
      "budget; curves in metric_vs_time.png.", "",
      "| strategy | steps | median step (ms) | speedup vs e2e | "
      f"final {metric} | " + " | ".join(exits) + " | eval points |",
      "|" + "---|" * (6 + len(exits))]
  for name, row in results.items():
    speedup = row["speedup_vs_e2e"]
    cells = [name, str(row["steps"]), f"{1e3 * row['median_step_s']:.1f}",
             f"{speedup:.2f}x" if speedup else "-",
             f"{row['eval']['final'][metric]:.4f}"]
    cells += [f"{row['eval'][h][metric]:.4f}" for h in exits]
    cells.append(str(len(row["curve"])))
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "Command:", "", "```", summary["command"], "```", ""]
  return "\n".join(lines)


def plot(summary, path):
  """Test metric vs wall-clock seconds, one line per strategy."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  except ImportError:
    print(f"matplotlib is not installed: {path} not drawn")
    return
  figure, axes = pyplot.subplots(figsize=(7, 4.5))
  for name, row in summary["strategies"].items():
    axes.plot([p["seconds"] for p in row["curve"]],
              [p["value"] for p in row["curve"]], marker="o", label=name)
  axes.set_xlabel("wall-clock seconds of training")
  axes.set_ylabel(f"test {summary['metric']} (last head)")
  axes.set_title(f"{summary['preset']}: {summary['budget_s']:g} s per "
                 "strategy")
  axes.set_xlim(left=0)
  axes.grid(alpha=0.3)
  axes.legend()
  buffer = io.BytesIO()
  figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
  pyplot.close(figure)
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(buffer.getvalue())


def compare(strategies, budget_s, eval_interval_s, out_dir, command):
  """Runs (or reuses) every strategy and writes the three outputs."""
  overrides = config_overrides()
  config = flags_lib.config_from_flags()
  for strategy in strategies:  # every error before the first run
    config_lib.validate(dataclasses.replace(
        config, strategy=strategy, time_budget_s=budget_s, model_dir=out_dir))
  metric = "perplexity" if config.is_text else "accuracy"
  settings = {"preset": flags_lib.PRESET.value, "overrides": overrides,
              "budget_s": budget_s, "eval_interval_s": eval_interval_s,
              "metric": metric}
  tf.io.gfile.makedirs(os.path.join(out_dir, "logs"))
  results = {s: run_strategy(s, overrides, settings, config, out_dir)
             for s in strategies}
  add_speedups(results)
  summary = {"command": command, "preset": settings["preset"],
             "budget_s": budget_s, "eval_interval_s": eval_interval_s,
             "metric": metric, "overrides": overrides, "strategies": results}
  write_json(os.path.join(out_dir, "results.json"), summary)
  with tf.io.gfile.GFile(os.path.join(out_dir, "report.md"), "w") as f:
    f.write(report_markdown(summary))
  plot(summary, os.path.join(out_dir, "metric_vs_time.png"))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _OUT_DIR.value:
    raise app.UsageError("--out_dir is required")
  # This process only reads event files: keep it off the runs' GPUs.
  tf.config.set_visible_devices([], "GPU")
  command = "python -m train.compare " + " ".join(
      shlex.quote(a) for a in sys.argv[1:])
  try:
    compare(_STRATEGIES.value, _BUDGET_S.value, _EVAL_INTERVAL_S.value,
            _OUT_DIR.value, command)
  except (ValueError, FileNotFoundError, RunError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(f"wrote {os.path.join(_OUT_DIR.value, 'report.md')}")


if __name__ == "__main__":
  app.run(main)
