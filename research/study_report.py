"""A study's outputs: results.json, report.md and PNG plots.

The measured side uses this machine's training clock; the predicted side
puts the same per-step curves on the time axis step * (schedule model's step
time with one core per module), see `step_model.projection`.

In --report_dir (say docs/results/NAME, next to a hand-written reading.md)
compare replaces only its own outputs: an existing results.json, report.md
or plot there is overwritten only when that folder's results.json is a
compare report; any other file is never touched.
"""

import dataclasses
import io
import os
import platform

import tensorflow as tf

from tf_interlock import metric_names
from tf_interlock import placement as placement_lib
from step_model import projection
from research import legacy_heads
from research import study_lib
from research import study_owner
from research import study_store
from train import owned_dir
from train import paths
from train import user_files

PLOTS = ("metric_vs_steps.png", "metric_vs_seconds.png",
         "metric_vs_predicted_seconds.png")
# Our reading of a finished study, written by hand next to report.md; each
# (re)run of the study copies it into the report's "Reading" section.
READING = "reading.md"
RESULTS = "results.json"
REPORT = "report.md"
COMMAND = "python -m research.compare"
# The same binary before the research tools left train/ (older reports).
FORMER_COMMANDS = ("python -m train.compare",)


def _is_compare_results(path):
  """True if `path` is the results.json of a compare study."""
  try:
    results = owned_dir.load_json(path)
  except ValueError:
    return False
  return (isinstance(results.get("strategies"), dict) and
          str(results.get("command", "")).startswith(
              (COMMAND,) + FORMER_COMMANDS))


def check_report_dir(report_dir, plots):
  """Raises unless compare may write its outputs to report_dir; reads only.

  Args:
    report_dir: --report_dir.
    plots: whether the PNGs are written too.

  Raises:
    ValueError: report_dir is, or lies under, a file; or it holds one of
      the outputs' names that compare did not write.
  """
  received = f"Received: report_dir={report_dir!r}"
  blocker = paths.file_above(report_dir)
  if blocker is not None:
    raise ValueError(f"--report_dir={report_dir} is or lies under the file "
                     f"{blocker}. {received}")
  names = [RESULTS, REPORT] + (list(PLOTS) if plots else [])
  present = [paths.join(report_dir, name) for name in names
             if tf.io.gfile.exists(paths.join(report_dir, name))]
  if present and (
      not _is_compare_results(paths.join(report_dir, RESULTS)) or
      any(tf.io.gfile.isdir(path) for path in present)):
    raise ValueError(
        f"--report_dir={report_dir} holds {present[0]}, which is not an "
        f"output of research.compare (none of its reports is there); nothing "
        f"was changed: move it away or pick another directory. {received}")


def machine():
  """What the numbers were measured on."""
  model = platform.processor() or "unknown"
  try:
    with open("/proc/cpuinfo") as f:
      names = [line.split(":", 1)[1].strip() for line in f
               if line.startswith("model name")]
    model = names[0] if names else model
  except OSError:
    pass
  return {"nproc": os.cpu_count(), "cpu": model,
          "tensorflow": tf.__version__, "python": platform.python_version(),
          "gpus": len(tf.config.list_physical_devices("GPU"))}


def _points(row):
  return [projection.CurvePoint(p["step"], p["seconds"], projection.Band(
      p["mean"], p["min"], p["max"])) for p in row["curve"]]


def network_metric(row, metric, num_modules):
  """A strategy row's final band of `metric` for the network's own head
  (module K), also from results written when it was named "final"."""
  heads = legacy_heads.canonical_heads(row["final"], num_modules)
  return heads[metric_names.network_head(heads)][metric]


def add_projection(summary, predicted, cores_here, target=None,
                   pipeline=None):
  """Adds predicted step times, speedups, budgets, target and outcomes.

  Args:
    summary: the study summary; summary["strategies"][s] as made by
      `study_lib.aggregate_runs`.
    predicted: {strategy: {cores: step seconds}} (`predict_step_times`).
    cores_here: the core count of the "model here" column.
    target: the metric to reach; None: e2e's mean final metric.
    pipeline: {cores: {"microbatches", "step_s"}} of the best microbatched
      e2e pipeline (`study_lib.predict_pipeline`), the peer of each
      strategy's modelled step time; None: no peer column.
  """
  rows, k = summary["strategies"], summary["num_modules"]
  metric, higher = summary["metric"], summary["higher_is_better"]
  for name, row in rows.items():
    row["predicted_step_s"] = {"here": predicted[name][cores_here],
                               "one_core_per_module": predicted[name][k]}
    if pipeline is not None:
      row["speedup_vs_pipeline"] = {
          "model_here": pipeline[cores_here]["step_s"] /
                        row["predicted_step_s"]["here"],
          "predicted": pipeline[k]["step_s"] /
                       row["predicted_step_s"]["one_core_per_module"]}
  if pipeline is not None:
    summary["pipeline_peer"] = {"here": pipeline[cores_here],
                                "one_core_per_module": pipeline[k]}
  base = rows.get("e2e")
  for row in rows.values():
    row["speedup_vs_e2e"] = None if base is None else {
        "measured": base["median_step_s"]["mean"] /
                    row["median_step_s"]["mean"],
        "model_here": base["predicted_step_s"]["here"] /
                      row["predicted_step_s"]["here"],
        "predicted": base["predicted_step_s"]["one_core_per_module"] /
                     row["predicted_step_s"]["one_core_per_module"]}
  if target is None and base is not None:
    target = network_metric(base, metric, k)["mean"]
    summary["target_source"] = "e2e's mean final metric"
  elif target is not None:
    summary["target_source"] = "--target"
  else:
    summary["target_source"] = "none (no e2e run and no --target)"
  summary["target"] = target
  # The budget: the fastest strategy's time for the whole run, so that every
  # curve covers it; slower strategies are read part-way.
  axes = {name: {"measured": [p.seconds for p in _points(row)],
                 "predicted": projection.predicted_seconds(
                     _points(row), row["predicted_step_s"][
                         "one_core_per_module"])}
          for name, row in rows.items()}
  summary["budget_s"] = {side: min(axis[side][-1] for axis in axes.values())
                         for side in ("measured", "predicted")}
  for name, row in rows.items():
    row["outcome"] = {}
    for side in ("measured", "predicted"):
      result = projection.outcome(_points(row), axes[name][side],
                                  summary["budget_s"][side], target, higher)
      band = result["metric_at_budget"]
      row["outcome"][side] = {
          "metric_at_budget": None if band is None else band._asdict(),
          "time_to_target_s": result["time_to_target_s"]}


def _one_device_per_module(name):
  """Whether the recorded placement gave each module its own device (one
  core per module when op costs were measured)."""
  return (name in placement_lib.names() and
          placement_lib.get(name).replica_device_type is not None)


def _ms(seconds):
  return f"{1e3 * seconds:.1f}"


def _band_text(band, digits=4):
  if band is None:
    return "-"
  return (f"{band['mean']:.{digits}f} [{band['min']:.{digits}f}, "
          f"{band['max']:.{digits}f}]")


def _seconds_text(value):
  return "not reached" if value is None else f"{value:.3g}"


def _peer_lines(summary):
  """The modelled speedup of each strategy over the best microbatched e2e
  pipeline: the model-parallel user's alternative to interlocking."""
  peer = summary.get("pipeline_peer")
  if peer is None:
    return []
  here, one = peer["here"], peer["one_core_per_module"]
  lines = [
      "", "Against the peer on the same devices: e2e pipelined over M "
      "microbatches (GPipe-style), the best M of the schedule model: "
      f"M = {here['microbatches']}, {_ms(here['step_s'])} ms with "
      f"{summary['cores_here']} core(s); M = {one['microbatches']}, "
      f"{_ms(one['step_s'])} ms with one core per module (modelled, not "
      "measured).", "",
      "| strategy | model vs pipeline, here | predicted vs pipeline, one "
      "core per module |", "|---|---|---|"]
  for name, row in summary["strategies"].items():
    speed = row["speedup_vs_pipeline"]
    lines.append(f"| {name} | {speed['model_here']:.2f}x | "
                 f"{speed['predicted']:.2f}x |")
  return lines


def _work_lines(summary):
  """Per module its one-thread work in a step of e2e (forward, input VJP,
  weight VJP, aux head, update): how well the split balances."""
  costs = summary["module_costs"]["costs"]
  fields = ("forward", "input_vjp", "weight_vjp", "aux", "update")
  work = [sum(c[f] for f in fields) for c in costs]
  lines = ["", "Per-module work, ms of one thread per step (forward + "
           "input VJP + weight VJP + aux head + update; measured op "
           "costs); the slowest module bounds every pipelined schedule:",
           "", "| module | " + " | ".join(fields) + " | total |",
           "|---" * (len(fields) + 2) + "|"]
  for k, (cost, total) in enumerate(zip(costs, work), start=1):
    lines.append(f"| {k} | " + " | ".join(_ms(cost[f]) for f in fields) +
                 f" | {_ms(total)} |")
  ratio = max(work) * len(work) / sum(work)
  return lines + ["", f"Slowest module / mean module: {ratio:.2f}."]


def _length_text(summary):
  """How long each run trained: its steps, or a user study's budget."""
  budget = summary.get("time_budget_s")
  if budget is None:
    return f"{summary['train_steps']} steps"
  return f"{budget:g} s of training (time budget)"


def _points_text(summary):
  if summary.get("time_budget_s") is None:
    return f"{summary['eval_points']} points"
  return ("until the budget ends, and where it ends; the curves keep the "
          "steps that every seed reached")


def report_markdown(summary, reading=None):
  """The tables, the machine and the command of a study.

  Args:
    summary: the study's results (`run_and_report`).
    reading: the text of the "Reading" section, or None.

  Returns:
    The report as markdown.
  """
  metric, rows, k = summary["metric"], summary["strategies"], summary[
      "num_modules"]
  mach, cores = summary["machine"], summary["cores_here"]
  digits = 4 if metric == "accuracy" else 1
  seeds = len(next(iter(rows.values()))["seeds"])
  lines = [
      f"# {summary['preset']}: {_length_text(summary)} per run, "
      f"{seeds} seed(s), K = {k}", "",
      f"Machine: {mach['nproc']} cores ({mach['cpu']}), TensorFlow "
      f"{mach['tensorflow']}, {mach['gpus']} GPU(s).", "",
      f"Each run evaluates {summary['eval_split']} every "
      f"{summary['eval_every_steps']} steps ({_points_text(summary)}). "
      "Times are the training clock: time inside the training loops, the "
      "first loop's tracing (compile) and every evaluation excluded and "
      "reported apart. Values are the mean over seeds, [min, max] in "
      "brackets.", ""]
  if not _one_device_per_module(summary["module_costs"]["placement"]):
    lines += [f"**Op costs measured with placement="
              f"{summary['module_costs']['placement']}: an op may use "
              "several cores, so the model columns are not one core per "
              "module.**", ""]
  if summary["jobs"] > 1:
    lines += [f"**Runs overlapped ({summary['jobs']} at a time): the times "
              "below are not a clean measurement.**", ""]
  lines += [
      "## Step time", "",
      f"Measured here, and from the schedule model fed with this network's "
      f"measured per-module op costs: with {cores} core(s) as here, and "
      f"predicted with one core per module ({k}). The predicted columns are "
      "a model, not a measurement.", "",
      "| strategy | steps | median step ms (measured) | model here ms | "
      f"predicted, {k} cores ms | speedup vs e2e measured | model here | "
      f"predicted | compile s | eval s (total) | final {metric} |",
      "|" + "---|" * 11]
  for name, row in rows.items():
    speed = row["speedup_vs_e2e"] or {}
    steps = sorted({run["steps"] for run in row.get("runs", [])}) or [
        row["steps"]]
    cells = [name, "-".join(str(n) for n in dict.fromkeys(
        [steps[0], steps[-1]])), _ms(row["median_step_s"]["mean"]),
             _ms(row["predicted_step_s"]["here"]),
             _ms(row["predicted_step_s"]["one_core_per_module"])]
    cells += [f"{speed[key]:.2f}x" if speed else "-"
              for key in ("measured", "model_here", "predicted")]
    cells += [f"{row['compile_s']['mean']:.3g}", f"{row['eval_s']['mean']:.3g}",
              _band_text(network_metric(row, metric,
                                        summary["num_modules"]), digits)]
    lines.append("| " + " | ".join(cells) + " |")
  lines += _peer_lines(summary) + _work_lines(summary)
  budget, target = summary["budget_s"], summary["target"]
  target_text = "none" if target is None else f"{target:.{digits}f}"
  lines += [
      "", "## Fixed budget", "",
      f"Budget: the fastest strategy's time for the whole run, "
      f"{budget['measured']:.3g} s measured here and {budget['predicted']:.3g}"
      f" s predicted with one core per module. Target {metric}: "
      f"{target_text} ({summary['target_source']}); time to reach it on the "
      "mean curve, linear between evaluations; '-': the budget ends before "
      "the strategy's first evaluation. **The predicted columns put "
      "the measured per-step curves on the predicted step times: a "
      "prediction, not a measurement.**", "",
      f"| strategy | {metric} at {budget['measured']:.3g} s (measured) | "
      f"time to target s (measured) | {metric} at {budget['predicted']:.3g} s"
      " (predicted) | time to target s (predicted) |",
      "|" + "---|" * 5]
  for name, row in rows.items():
    measured, predicted = row["outcome"]["measured"], row["outcome"][
        "predicted"]
    lines.append("| " + " | ".join([
        name, _band_text(measured["metric_at_budget"], digits),
        _seconds_text(measured["time_to_target_s"]),
        _band_text(predicted["metric_at_budget"], digits),
        _seconds_text(predicted["time_to_target_s"])]) + " |")
  lines += ["", "Plots: " + (", ".join(summary["plots"]) or
                             "not drawn (--noplots)") + ".", "",
            "## Reading", "",
            (reading or "").strip() or (
                f"Not written yet: put it in {READING} next to this report "
                "(where the ranking agrees with Gomez et al. (2022), where it "
                "does not, and why) and rerun the command; finished runs are "
                "reused."), "",
            "## Command", "", "```", summary["command"], "```", ""]
  return "\n".join(lines)


def plot(summary, out_dir, flag="--out_dir"):
  """Draws `PLOTS`: mean curve and min-max band per strategy."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  metric, k = summary["metric"], summary["num_modules"]
  axes_of = {
      PLOTS[0]: ("training steps", lambda row: [p["step"] for p in
                                                row["curve"]], None),
      PLOTS[1]: ("training seconds, measured here (no compile, no eval)",
                 lambda row: [p["seconds"] for p in row["curve"]],
                 summary["budget_s"]["measured"]),
      PLOTS[2]: (f"training seconds, PREDICTED with one core per module "
                 f"(K = {k})",
                 lambda row: [p["step"] * row["predicted_step_s"][
                     "one_core_per_module"] for p in row["curve"]],
                 summary["budget_s"]["predicted"]),
  }
  for name, (label, xs_of, budget) in axes_of.items():
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for strategy, row in summary["strategies"].items():
      xs = xs_of(row)
      line, = axes.plot(xs, [p["mean"] for p in row["curve"]], marker="o",
                        markersize=3, label=strategy)
      axes.fill_between(xs, [p["min"] for p in row["curve"]],
                        [p["max"] for p in row["curve"]],
                        color=line.get_color(), alpha=0.2)
    if budget is not None:
      axes.axvline(budget, color="gray", linestyle="--", linewidth=1,
                   label="budget")
    if summary["target"] is not None:
      axes.axhline(summary["target"], color="gray", linestyle=":",
                   linewidth=1, label="target")
    axes.set_xlabel(label)
    axes.set_ylabel(f"{metric} (last head), mean and min-max over seeds")
    axes.set_title(f"{summary['preset']}, K = {k}")
    axes.set_xlim(left=0)
    axes.grid(alpha=0.3)
    axes.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    pyplot.close(figure)
    user_files.write_output(os.path.join(out_dir, name), buffer.getvalue(),
                            flag)


def write_outputs(summary, out_dir, plots, flag="--out_dir"):
  """results.json, report.md and (if `plots`) the PNGs in out_dir (named
  by the flag `flag`; each file through `user_files.write_output`)."""
  tf.io.gfile.makedirs(out_dir)
  if plots:
    plot(summary, out_dir, flag)
  study_store.write_json(os.path.join(out_dir, RESULTS), summary)
  reading_path = os.path.join(out_dir, READING)
  reading = None
  if tf.io.gfile.exists(reading_path):
    with tf.io.gfile.GFile(reading_path) as f:
      reading = f.read()
  user_files.write_output(os.path.join(out_dir, REPORT),
                          report_markdown(summary, reading),
                          flag)


def run_and_report(study, *, eval_points, target, plots, cost_repeats,
                   command, report_dir=None, break_lock=False,
                   train=study_lib.train_preset,
                   measure=study_lib.launch_costs, run_all=study_lib.run_all,
                   extra=None):
  """Measures the op costs, runs (or reuses) every run, writes the outputs.

  Args:
    study: a `study_lib.Study`.
    eval_points: evaluations per run (for the report).
    target: the metric to reach; None: e2e's mean final metric.
    plots: draw the PNGs (needs matplotlib).
    cost_repeats: timed calls per op for the op costs.
    command: the command line, for the report.
    report_dir: a second folder for the outputs (None: out_dir only).
    break_lock: restart an unfinished run although the process holding
      its lock looks alive.
    train, measure: run one (strategy, seed) and measure the op costs (a
      user model's study, `research.user_study`, passes its own; see
      `study_lib.run_one` and `study_lib.measure_costs`).
    run_all: `study_lib.run_all` or a function that calls it.
    extra: more fields of the summary (None: none).

  Returns:
    The summary written to results.json.

  Raises:
    ValueError: before anything is written, when out_dir holds what this
      study did not make or cannot reuse (`study_lib.check_study`).
  """
  with study_owner.study_lock(study.out_dir, break_lock):
    return _run_and_report(study, eval_points=eval_points, target=target,
                           plots=plots, cost_repeats=cost_repeats,
                           command=command, report_dir=report_dir,
                           break_lock=break_lock, train=train,
                           measure=measure, run_all=run_all, extra=extra)


def _run_and_report(study, *, eval_points, target, plots, cost_repeats,
                    command, report_dir, break_lock, train, measure, run_all,
                    extra):
  """run_and_report while holding out_dir's lock."""
  owner = study_lib.check_study(study, cost_repeats, break_lock)
  study = dataclasses.replace(study, owner=study_owner.claim(study.out_dir,
                                                             owner))
  tf.io.gfile.makedirs(os.path.join(study.out_dir, "logs"))
  costs = study_lib.measure_costs(study, cost_repeats, measure)
  runs = run_all(study, break_lock, train)
  cores_here = min(study.num_modules, os.cpu_count())
  predicted = study_lib.predict_step_times(
      costs, study.strategies, sorted({cores_here, study.num_modules}))
  batches = study.overrides["eval_batches"]
  summary = {
      "command": command, "machine": machine(),
      "preset": study.preset, "overrides": study.overrides,
      "train_steps": study.train_steps, "seeds": list(study.seeds),
      "eval_points": eval_points, "eval_every_steps": study.eval_every_steps,
      "eval_split": "the whole evaluation split" if batches == "none" else
                    f"{batches} batches of the evaluation split (NOT all)",
      "metric": study.metric, "higher_is_better": study.metric == "accuracy",
      "num_modules": study.num_modules, "cores_here": cores_here,
      "jobs": study.jobs, "module_costs": costs,
      "strategies": {s: study_lib.aggregate_runs(rows)
                     for s, rows in runs.items()},
      **(extra or {}),
  }
  add_projection(summary, predicted, cores_here, target,
                 study_lib.predict_pipeline(
                     costs, sorted({cores_here, study.num_modules})))
  summary["plots"] = list(PLOTS) if plots else []
  for name, row in summary["strategies"].items():
    row["runs"] = runs[name]
  for directory in dict.fromkeys([study.out_dir, report_dir or study.out_dir]):
    write_outputs(summary, directory, plots, "--out_dir" if (
        directory == study.out_dir) else "--report_dir")
  return summary
