r"""XLA or not: each strategy and plain Keras timed with and without jit_compile.

  nice -n -5 python -m research.xla_benchmark --repeats=3 \
      --out=docs/results/xla/raw.json

Every cell runs in a process of its own (TF's thread pools are per process,
and plain Keras gets the host's default threading, as in
`research.benchmark`): a "strategies" process times every strategy of one
placement with one jit setting (`benchmark_lib.run_strategy`: 2 warm-up
calls, median of --steps calls of steps_per_loop steps), a "keras" process
times the same layers as one `keras.Sequential` under Keras's own
`jit_compile` (`benchmark_lib.run_plain_keras`). The processes are
interleaved: repeat r runs every cell once, with and without XLA in
alternating order, so that a change of the host's load hits both. The
report is the median over repeats of each cell's per-step median, and the
ratio jit / no jit per cell (< 1: XLA is faster).
"""

import json
import sys

from train import runtime_env  # noqa: F401  (before TensorFlow)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

from research import benchmark_lib  # noqa: E402
from tf_interlock import placement as placement_lib  # noqa: E402
from train import error_boundary  # noqa: E402
from train import placement_runtime  # noqa: E402
from train import user_files  # noqa: E402

_ROLE = flags.DEFINE_string(
    "role", "main", "main (runs the children), strategies or keras (one "
    "child: times its cells, prints one JSON line).")
_MODEL = flags.DEFINE_string("model", "mlp", "Network: mlp, resnet or lm "
                             "(as research.benchmark).")
_NUM_MODULES = flags.DEFINE_integer(
    "num_modules", 4, "K, modules the network is split into (>= 1).")
_WIDTH = flags.DEFINE_integer(
    "width", 512, "model=mlp: units of every hidden Dense layer (>= 1).")
_BATCH = flags.DEFINE_integer(
    "batch_size", 256, "Global batch per step, in examples (>= 1).")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed calls per cell (>= 1), "
                              "after 2 warm-ups.")
_STEPS_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 8, "Steps per "
                                       "timed call (>= 1).")
_STRATEGIES = flags.DEFINE_list(
    "strategies", ["e2e", "local", "2wise"], "Strategy cells (NAME, or "
    "NAME-mM for M microbatches).")
_PLACEMENTS = flags.DEFINE_list(
    "placements", ["single", "simulated"], "single (one XLA program per "
    "step) and/or simulated (K logical CPUs, one XLA program per module "
    "and kind of work).")
_PLACEMENT = flags.DEFINE_string("placement", "single", "Child: the "
                                 "placement of role=strategies.")
_JIT = flags.DEFINE_bool(
    "jit", False, "Child (role=strategies or keras): compile the step "
    "with XLA.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Interleaved repeats of "
                                "every cell (>= 1).")
_OUT = flags.DEFINE_string("out", None, "Write the report (JSON) here too.")


def _spec():
  return benchmark_lib.make_spec(
      _MODEL.value, _NUM_MODULES.value, width=_WIDTH.value,
      batch_size=_BATCH.value, steps=_STEPS.value,
      steps_per_loop=_STEPS_PER_LOOP.value)


def child_report():
  """Times this child's cells: {cell: seconds per step}."""
  spec = _spec()
  if _ROLE.value == "keras":
    return {"keras": benchmark_lib.run_plain_keras(spec, _JIT.value)}
  placement = _PLACEMENT.value
  # Before the TF runtime starts: "simulated" splits the host CPU.
  placement_runtime.of(placement).configure_devices(_NUM_MODULES.value)
  times = {}
  for name in _STRATEGIES.value:
    _, seconds = benchmark_lib.run_strategy(
        spec, name, placement_lib.make_placement(placement,
                                                 _NUM_MODULES.value),
        jit_compile=_JIT.value)
    times[f"{placement}/{name}"] = seconds
  return times


def _child_args(role, jit, placement="single"):
  args = [f"--role={role}", f"--jit={str(jit).lower()}",
          f"--placement={placement}"]
  for flag in (_MODEL, _NUM_MODULES, _WIDTH, _BATCH, _STEPS,
               _STEPS_PER_LOOP, _STRATEGIES):
    value = flag.value
    value = ",".join(value) if isinstance(value, list) else value
    args.append(f"--{flag.name}={value}")
  return args


def main_report():
  """Interleaved repeats of every child; medians and jit/no-jit ratios."""
  children = [("strategies", p) for p in _PLACEMENTS.value] + [
      ("keras", "single")]
  runs = {False: [], True: []}
  for r in range(_REPEATS.value):
    for role, placement in children:
      order = (False, True) if r % 2 == 0 else (True, False)
      for jit in order:
        times = benchmark_lib.run_child(_child_args(role, jit, placement),
                                        module="research.xla_benchmark")
        runs[jit].append(times)
        print(json.dumps({"repeat": r, "jit": jit, "ms_per_step": {
            k: round(v * 1e3, 3) for k, v in times.items()}}),
              file=sys.stderr, flush=True)
  cells = sorted({k for times in runs[False] for k in times})
  table = {}
  for cell in cells:
    off = float(np.median([t[cell] for t in runs[False] if cell in t]))
    on = float(np.median([t[cell] for t in runs[True] if cell in t]))
    table[cell] = {"no_jit_ms": round(off * 1e3, 3),
                   "jit_ms": round(on * 1e3, 3),
                   "jit_over_no_jit": round(on / off, 3)}
  return {"spec": {"model": _MODEL.value, "num_modules": _NUM_MODULES.value,
                   "width": _WIDTH.value, "batch_size": _BATCH.value,
                   "steps": _STEPS.value,
                   "steps_per_loop": _STEPS_PER_LOOP.value,
                   "repeats": _REPEATS.value},
          "cells": table, "runs": {str(k).lower(): v for k, v in
                                   runs.items()}}


def format_table(report):
  lines = [f"{'cell':<22} {'no jit ms':>10} {'jit ms':>10} {'jit/no':>7}"]
  for cell, row in report["cells"].items():
    lines.append(f"{cell:<22} {row['no_jit_ms']:>10.2f} "
                 f"{row['jit_ms']:>10.2f} {row['jit_over_no_jit']:>7.3f}")
  return "\n".join(lines)


@error_boundary.guard()
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  if _ROLE.value != "main":
    print(json.dumps(child_report()))
    return
  if _OUT.value:
    try:
      benchmark_lib.check_json_out(_OUT.value, "out")
    except ValueError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(1)
  report = main_report()
  print(format_table(report))
  if _OUT.value:
    user_files.write_output(_OUT.value, json.dumps(report, indent=1),
                            "--out")


if __name__ == "__main__":
  app.run(main)
