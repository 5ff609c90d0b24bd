"""A study run's clocks, read from its TensorBoard event files.

`research.compare` runs each (strategy, seed) in its own `train.train` process
and reads three clocks from the events that run wrote:

* the training clock: the time spent inside the training loops, where the
  first loop (which also traces and compiles the step function) counts as
  many steps at the median step time; what it took beyond that is compile_s;
* eval_s: per evaluation, from the end of the loop it follows (the train
  event of that step) to its own eval event;
* wall_s: from the start of the first loop to the last evaluation.
"""

import collections
import glob
import os
import statistics

from tensorboard.backend.event_processing import event_file_loader
import tensorflow as tf

from tf_interlock import metric_names
from train import run_dir
from research import legacy_heads


def read_scalars(event_dir):
  """{tag: [(step, wall_time, value)]} from a run's event files, by step."""
  found = collections.defaultdict(list)
  for path in tf.io.gfile.glob(os.path.join(glob.escape(event_dir),
                                            "events.out.tfevents.*")):
    for event in event_file_loader.EventFileLoader(path).Load():
      for value in event.summary.value:
        found[value.tag].append(
            (event.step, event.wall_time, float(tf.make_ndarray(
                value.tensor))))
  return {tag: sorted(points) for tag, points in found.items()}


def account_time(loops, eval_walls):
  """Splits a run's time into training, compile and evaluation.

  Args:
    loops: per training loop in step order, (step at its end, wall time of
      its train event, step_time_s = loop seconds / loop steps).
    eval_walls: {step: wall time of that step's eval event}.

  Returns:
    {"median_step_s", "compile_s", "training_s", "eval_s", "wall_s",
     "eval_s_each": {step: s}, "clock": {step: training seconds}}.

  Raises:
    ValueError: fewer than two loops (tracing cannot be told apart), or an
      evaluation at a step where no loop ended.
  """
  if len(loops) < 2:
    raise ValueError(f"a run needs >= 2 training loops to separate tracing "
                     f"from step time; raise --train_steps. Received: "
                     f"{len(loops)} loop(s)")
  sizes = [step - previous for (step, _, _), previous in
           zip(loops, [0] + [step for step, _, _ in loops])]
  median = statistics.median(t for _, _, t in loops[1:])
  first_s = loops[0][2] * sizes[0]
  compile_s = max(0.0, first_s - median * sizes[0])
  clock, total = {}, first_s - compile_s
  clock[loops[0][0]] = total
  for (step, _, step_s), size in zip(loops[1:], sizes[1:]):
    total += step_s * size
    clock[step] = total
  loop_walls = {step: wall for step, wall, _ in loops}
  each = {}
  for step, wall in sorted(eval_walls.items()):
    if step not in loop_walls:
      raise ValueError(f"evaluation at step {step} follows no training loop. "
                       f"Received: loop ends {sorted(loop_walls)}")
    each[step] = wall - loop_walls[step]
  origin = loops[0][1] - first_s
  end = max([loops[-1][1]] + list(eval_walls.values()))
  return {"median_step_s": median, "compile_s": compile_s,
          "training_s": total, "eval_s": sum(each.values()),
          "wall_s": end - origin, "eval_s_each": each, "clock": clock}


def summarize_run(model_dir, metric):
  """Step times, clocks, final evaluation and curve of a finished run."""
  run = run_dir.RunDir(model_dir)
  train = read_scalars(run.train_log_dir)
  evals = read_scalars(run.eval_log_dir)
  # {head: {metric: points}}, heads named "module_k" (older runs' "exit_k"
  # and "final" tags read in those names); the deepest is the network's.
  by_head = collections.defaultdict(dict)
  for tag, points in evals.items():
    head, _, name = tag.partition("/")
    if name:
      by_head[head][name] = points
  by_head = legacy_heads.canonical_heads(by_head) if by_head else {}
  network = metric_names.network_head(by_head) if by_head else "module_K"
  for scalars, events, tag in (
      (train, run.train_log_dir, "step_time_s"),
      ({f"{h}/{n}" for h, names in by_head.items() for n in names},
       run.eval_log_dir, f"{network}/{metric}")):
    if tag not in scalars:
      raise ValueError(f"{events} holds no {tag!r} events: the run did not "
                     f"train here as compare asked. Received: "
                     f"model_dir={model_dir!r}")
  curve_points = by_head[network][metric]
  timing = account_time(train["step_time_s"],
                        {step: wall for step, wall, _ in curve_points})
  if "eval_time_s" in evals:  # timed by train.train itself, when it does
    timing["eval_s_each"] = {step: v for step, _, v in evals["eval_time_s"]}
    timing["eval_s"] = sum(timing["eval_s_each"].values())
  final_step = curve_points[-1][0]
  heads = {head: {name: v for name, points in names.items()
                  for step, _, v in points if step == final_step}
           for head, names in by_head.items()}
  clock = timing.pop("clock")
  each = timing.pop("eval_s_each")
  return {
      "steps": final_step, **timing,
      "eval": heads,  # in depth order, module_1 first
      "curve": [{"step": step, "seconds": clock[step], "value": value,
                 "eval_s": each[step]} for step, _, value in curve_points],
  }

