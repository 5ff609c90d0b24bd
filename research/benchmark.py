r"""Step-time benchmark: each strategy measured and modelled, vs plain Keras.

  python -m research.benchmark --model=mlp --num_modules=4 \
      --strategies=e2e,local,2wise,3wise --placement=simulated --json

The baseline is what a user has without tf_interlock: the same layers as one
`keras.Sequential` compiled by Keras, in a process of its own with TF's
default threading (every core), timed as the strategies are (Keras's train
function, steps_per_loop steps a call, 2 warm-up calls, median of --steps
calls). Every strategy's speedup is reported against it, against e2e on the
same placement and threads, and against its model-parallel peer: the best
microbatched e2e pipeline (the fastest e2e-mM that ran, GPipe-style).

--role=profile measures the op costs alone (medians of --repetitions),
for `research.model_validation`, which predicts before it times.

With --placement=simulated, TF's thread pools are fixed per process, so each
threading plan (`step_model.threading_plan`: logical devices, intra-op
threads per device, modules per device) runs in its own worker process:
first one device per module with one thread, whose measured op costs let the
schedule model choose each strategy's plan for --num_cores cores; then each
other chosen plan (with e2e on it). --threads_per_device and
--modules_per_device fix the plan instead.
"""

import json
import sys

from train import runtime_env  # noqa: F401  (before TensorFlow)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from layers import aux_heads  # noqa: E402
from layers import resnet  # noqa: E402
from tf_interlock import placement as placement_lib  # noqa: E402
from step_model import profiling  # noqa: E402
from step_model import threading_plan  # noqa: E402
from research import benchmark_lib  # noqa: E402
from research import host_reference  # noqa: E402
from train import error_boundary  # noqa: E402
from train import config as config_lib  # noqa: E402
from train import placement_runtime  # noqa: E402
from train import run_dir  # noqa: E402
from train import user_files  # noqa: E402

_MODEL = flags.DEFINE_string(
    "model", "mlp", "Network: mlp, resnet or lm (the fortunes Transformer "
    "LM's shape, --layers_per_module blocks per module, random token ids).")
_PRESET = flags.DEFINE_string(
    "preset", "resnet20", "model=resnet: depth, one of resnet20/32/56/110 "
    "(CIFAR stem) or resnet18/34/50/101 (ImageNet stem).")
_NUM_MODULES = flags.DEFINE_integer(
    "num_modules", 4, "K, modules the network is split into depthwise "
    "(>= 1; at most its blocks).")
_STRATEGIES = flags.DEFINE_list(
    "strategies", ["e2e", "e2e-m2", "e2e-m4", "e2e-m8", "local", "2wise",
                   "3wise"],
    "Strategies; NAME-mM trains NAME with M microbatches per step (e2e-m4: "
    "the GPipe-style e2e pipeline, the peer of every strategy); a name may "
    "end with -unrolled, -while or -pipelined, its calls' loop "
    "(ExecutionOptions.loop; none: auto), e.g. local-unrolled.")
_PLACEMENT = flags.DEFINE_string(
    "placement", "simulated", "Where modules run: single (one device), "
    "simulated (logical CPU devices, a threading plan each) or gpu.")
_BATCH = flags.DEFINE_integer(
    "batch_size", 512, "Global batch per step (>= 1), in examples "
    "(lm: sequences); divisible by the M of every e2e-mM cell.")
_STEPS = flags.DEFINE_integer(
    "steps", 5, "Timed calls (>= 1) per strategy after 2 warm-up calls; "
    "their median is reported.")
_STEPS_PER_LOOP = flags.DEFINE_integer(
    "steps_per_loop", 16, "Training steps unrolled in each timed "
    "tf.function call (>= 1).")
_WIDTH = flags.DEFINE_integer(
    "width", 1024, "model=mlp: units of every hidden Dense layer "
    "(>= 1).")
_LAYERS = flags.DEFINE_integer(
    "layers_per_module", 1, "Blocks per module (>= 1): hidden Dense layers "
    "(mlp) or Transformer blocks (lm).")
_IMAGE = flags.DEFINE_integer(
    "image_size", 32, "model=resnet: height and width of the random input "
    "images, in pixels (>= 1).")
_CHANNELS = flags.DEFINE_integer(
    "channels", 3, "model=resnet: channels of the random input images "
    "(>= 1; 3: RGB).")
_RESNET_AUX = flags.DEFINE_string(
    "resnet_aux_head", "authors", "model=resnet: aux head of modules "
    f"1..K-1, one of: {aux_heads.describe()}.")
_REPETITIONS = flags.DEFINE_integer(
    "repetitions", 3, "role=profile: how often every op cost is measured "
    "(>= 1; its median and range are reported).")
_MICROBATCHES = flags.DEFINE_list(
    "microbatches", [], "role=profile: also measure the op costs of one "
    "microbatch, batch / M, for each M listed (each must divide the batch):"
    " small ops run less efficiently than 1/M of the full batch's.")
_BALANCE_INTO = flags.DEFINE_integer(
    "balance_into", None, "role=profile, with one block per module: also "
    "split the network into this many modules (>= 1) by the measured time "
    "(`profiling.balance_blocks`).")
_COSTS = flags.DEFINE_bool(
    "costs", True, "role=worker: also measure op costs in this process, "
    "after the first timed strategy, for the in-process prediction.")
_CORES = flags.DEFINE_integer(
    "num_cores", None, "Cores of the host (>= 1) for the schedule model "
    "and the threading plan (default: the cores this process may use).")
_THREADS = flags.DEFINE_integer(
    "threads_per_device", None, "Intra-op threads per simulated device "
    "(>= 1; default: chosen by the schedule model per strategy).")
_MODULES_PER_DEVICE = flags.DEFINE_integer(
    "modules_per_device", None, "Modules per simulated device (>= 1); must "
    "divide K (default: chosen by the schedule model per strategy).")
_EFFICIENCY = flags.DEFINE_float(
    "thread_efficiency", threading_plan.DEFAULT_THREAD_EFFICIENCY,
    "Speedup of an op on t threads is 1 + (t - 1) * this (in [0, 1]).")
_BASELINE = flags.DEFINE_bool(
    "baseline", True, "Also time plain Keras fit on all cores (own process).")
_FIT = flags.DEFINE_bool(
    "fit", True, "Also time each strategy through InterlockModel.fit (on "
    "the first threading plan only).")
_ROLE = flags.DEFINE_string(
    "role", "main", "Internal: main, worker (one threading plan) or "
    "baseline (plain Keras, default threading).")
_JSON = flags.DEFINE_bool(
    "json", False, "Print the report as one JSON object on stdout instead "
    "of the table.")
_JSON_OUT = flags.DEFINE_string(
    "json_out", None, "Also write the JSON report to this file (gfile path).")
_HOST_REFERENCE = flags.DEFINE_bool(
    "host_reference", False, "role=worker or profile: also time the host's "
    "fixed reference workload (research.host_reference) before and after, "
    "on this plan's thread pools: host_reference_ms in the report.")



def validate():
  """One-line errors for bad flags, before anything runs."""
  check = config_lib.check_number
  config_lib.check_choice("model", _MODEL.value, ("mlp", "resnet", "lm"))
  config_lib.check_choice("resnet_aux_head", _RESNET_AUX.value,
                          tuple(aux_heads.names()))
  # The placements of one process that needs no cluster or TPU.
  config_lib.check_choice("placement", _PLACEMENT.value, tuple(
      name for name in placement_lib.names()
      if not (placement_runtime.of(name).needs_cluster or
              placement_runtime.of(name).needs_tpu)))
  config_lib.check_choice("role", _ROLE.value,
                          ("main", "worker", "baseline", "profile"))
  for flag in (_NUM_MODULES, _BATCH, _STEPS, _STEPS_PER_LOOP, _WIDTH,
               _LAYERS, _IMAGE, _CHANNELS, _REPETITIONS):
    check(flag.name, flag.value, minimum=1, integer=True)
  if _JSON_OUT.value and _ROLE.value == "main":
    run_dir.check_lasting(_JSON_OUT.value, "--json_out")
    benchmark_lib.check_json_out(_JSON_OUT.value)
  for flag in (_CORES, _THREADS, _MODULES_PER_DEVICE):
    check(flag.name, flag.value, minimum=1, integer=True, allow_none=True)
  check("thread_efficiency", _EFFICIENCY.value, minimum=0, maximum=1)
  if not _STRATEGIES.value:
    config_lib.fail("strategies", "", "must name at least one strategy")
  benchmark_lib.check_cells(_STRATEGIES.value, _BATCH.value,
                            num_modules=[_NUM_MODULES.value])
  for m in _MICROBATCHES.value:
    if not m.isdigit() or int(m) < 1 or _BATCH.value % int(m):
      config_lib.fail("microbatches", ",".join(_MICROBATCHES.value),
                      f"each M must be an int >= 1 that divides "
                      f"--batch_size={_BATCH.value}")
  if _MODULES_PER_DEVICE.value and _NUM_MODULES.value % \
      _MODULES_PER_DEVICE.value:
    config_lib.fail("modules_per_device", _MODULES_PER_DEVICE.value,
                    f"must divide --num_modules={_NUM_MODULES.value}")
  if _MODEL.value == "resnet":
    config_lib.check_choice("preset", _PRESET.value, tuple(resnet.PRESETS))


def spec():
  return benchmark_lib.make_spec(
      model=_MODEL.value, preset=_PRESET.value, num_modules=_NUM_MODULES.value,
      width=_WIDTH.value, layers_per_module=_LAYERS.value,
      image_size=_IMAGE.value, channels=_CHANNELS.value,
      resnet_aux_head=_RESNET_AUX.value, batch_size=_BATCH.value,
      steps=_STEPS.value, steps_per_loop=_STEPS_PER_LOOP.value)


def _flag_args(**override):
  """This run's flags, as a child process's argv."""
  names = ("model", "preset", "num_modules", "placement", "batch_size",
           "steps", "steps_per_loop", "width", "layers_per_module",
           "image_size", "channels", "resnet_aux_head", "num_cores",
           "thread_efficiency", "fit", "costs")
  values = {name: flags.FLAGS[name].value for name in names}
  values["num_cores"] = _CORES.value or threading_plan.host_cores()
  values.update(override)
  return [f"--{k}={','.join(v) if isinstance(v, list) else v}"
          for k, v in values.items() if v is not None]


def run_child(**override):
  """Runs research.benchmark in a child process; its JSON report."""
  return benchmark_lib.run_child(["--json", *_flag_args(**override)])


def baseline_report():
  """Plain Keras fit and e2e without aux heads, default threading."""
  s = spec()
  plain = benchmark_lib.run_plain_keras(s)
  placement = placement_lib.make_placement("single", s.config.interlock.num_modules)
  _, e2e = benchmark_lib.run_strategy(s, "e2e", placement, aux_heads=False)
  return {"plain_keras_step_s": plain, "e2e_single_step_s": e2e,
          "e2e_overhead_vs_keras": e2e / plain,
          "baseline_threads": threading_plan.host_cores(),
          "baseline_thread_pools": benchmark_lib.threading_state()}


def _placement(plan):
  """This process's placement: `plan`'s simulated devices, or --placement."""
  if plan is None:
    return placement_lib.make_placement(_PLACEMENT.value, _NUM_MODULES.value)
  threading_plan.use_own_pools(plan)  # D pools of t threads, not one.
  placement_lib.configure_simulated_devices(
      plan.num_devices, intra_op_threads=plan.threads_per_device)
  return benchmark_lib.simulated_placement(plan)


def profile_report(plan=None):
  """Op costs of the network on `plan`, with no strategy timed in this
  process: medians over --repetitions and their range."""
  s = spec()
  trainer = benchmark_lib.build_trainer(s, "e2e", _placement(plan))
  x, y = benchmark_lib.make_batch(s)
  cores = plan.threads_per_device if plan else 1
  median, low, high = profiling.repeated_module_costs(
      trainer, x, y, _REPETITIONS.value, cores=cores)
  microbatch = {}
  for m in _MICROBATCHES.value:
    # One microbatch's ops, timed M at a time inside one graph.
    costs = profiling.repeated_module_costs(trainer, x, y, _REPETITIONS.value,
                                            microbatches=int(m), cores=cores)
    microbatch[m] = dict(zip(("module_costs_ms", "module_costs_min_ms",
                              "module_costs_max_ms"),
                             map(benchmark_lib.costs_ms, costs)))
  balance = {} if _BALANCE_INTO.value is None else profiling.balance_blocks(
      median, _BALANCE_INTO.value)
  return {**balance, "module_costs_ms": benchmark_lib.costs_ms(median),
          "module_costs_min_ms": benchmark_lib.costs_ms(low),
          "module_costs_max_ms": benchmark_lib.costs_ms(high),
          "microbatch_costs_ms": microbatch,
          "has_aux": [m.has_aux_head for m in trainer.modules],
          "repetitions": _REPETITIONS.value,
          "plan": plan.describe() if plan else _PLACEMENT.value,
          "thread_pools": benchmark_lib.threading_state()}


def worker_report(strategies, plan=None):
  """Times `strategies` in this process (on `plan` when simulated)."""
  s = spec()
  cores = _CORES.value or threading_plan.host_cores()
  placement = _placement(plan)
  if plan is not None:
    rows, costs = benchmark_lib.measure_strategies(
        s, strategies, placement, cores, plan.threads_per_device,
        plan.module_devices, fit=_FIT.value, costs=_COSTS.value)
  else:
    rows, costs = benchmark_lib.measure_strategies(
        s, strategies, placement, cores if _CORES.value else None,
        fit=_FIT.value, costs=_COSTS.value)
  return {"strategies": rows,
          "module_costs_ms": costs and benchmark_lib.costs_ms(costs),
          "plan": plan.describe() if plan else _PLACEMENT.value,
          "cores_in_use": plan.cores_in_use(cores) if plan else None,
          "threads_per_device": plan.threads_per_device if plan else None,
          "thread_pools": benchmark_lib.threading_state()}


def _around_reference(make_report, plan):
  """make_report()'s report, with --host_reference the host's reference
  time (ms) just before and just after it: how fast the host ran while the
  report was measured."""
  if not _HOST_REFERENCE.value:
    return make_report()
  _placement(plan)  # The plan's devices and thread pools come first.
  before = host_reference.reference_time()
  report = make_report()
  report["host_reference_ms"] = [
      round(1e3 * t, 3) for t in (before, host_reference.reference_time())]
  return report


def _with_e2e(strategies):
  return strategies if "e2e" in strategies else ["e2e"] + list(strategies)


def simulated_runs(strategies, cores):
  """Per strategy its plan and the worker report it was measured in."""
  k = _NUM_MODULES.value
  fixed = _THREADS.value is not None or _MODULES_PER_DEVICE.value is not None
  runs = {}
  if fixed:
    plans = {name: threading_plan.plan_for(
        k, benchmark_lib.parse_cell(name)[0], cores, _THREADS.value,
        _MODULES_PER_DEVICE.value, _EFFICIENCY.value) for name in strategies}
  else:
    first = threading_plan.make_plan(k, k, 1)
    runs[first] = run_child(role="worker", strategies=_with_e2e(strategies),
                            threads_per_device=1, modules_per_device=1)
    costs = benchmark_lib.costs_from_ms(runs[first]["module_costs_ms"])
    plans = {}
    for name in strategies:
      strategy, microbatches = benchmark_lib.parse_cell(name)
      plans[name] = threading_plan.choose_plan(
          costs, strategy, cores, thread_efficiency=_EFFICIENCY.value,
          num_microbatches=microbatches,
          loop=benchmark_lib.cell_run_loop(name, k))[0]
  for plan in dict.fromkeys(plans.values()):
    if plan not in runs:
      names = [n for n in strategies if plans[n] == plan]
      # InterlockModel.fit is timed next to train_loop on the first plan.
      runs[plan] = run_child(
          role="worker", strategies=_with_e2e(names),
          threads_per_device=plan.threads_per_device,
          modules_per_device=k // plan.num_devices,
          fit=_FIT.value and not runs)
  return plans, runs


def _baseline_after(before):
  """The baseline report from `before` (timed before the workers) and a
  second baseline process timed after them: the same host can run 25%
  faster or slower from one minute to the next (docs/results/speed_held),
  so each ratio against plain Keras uses the mean of the two, and the
  report keeps both (`plain_keras_runs_s`, `e2e_single_runs_s`)."""
  if before is None:
    return {}
  after = run_child(role="baseline")
  return benchmark_lib.merge_baselines([before, after])


def main_report():
  """The whole benchmark: workers, the baseline, speedups."""
  strategies = list(dict.fromkeys(_STRATEGIES.value))
  cores = _CORES.value or threading_plan.host_cores()
  before = run_child(role="baseline") if _BASELINE.value else None
  results, runs_out = {}, []
  if placement_runtime.of(_PLACEMENT.value).splits_host_cpu:
    plans, runs = simulated_runs(strategies, cores)
    baseline = _baseline_after(before)
    plain = baseline.get("plain_keras_step_s")
    for plan, run in runs.items():
      rows = run["strategies"]
      benchmark_lib.add_speedups(rows, rows.get("e2e"), plain)
      runs_out.append(run)
    for name in strategies:
      results[name] = dict(runs[plans[name]]["strategies"][name],
                           plan=plans[name].describe(),
                           cores_in_use=plans[name].cores_in_use(cores))
    # The peer: the best microbatched e2e, each M on its own chosen plan.
    benchmark_lib.add_peer(results)
    costs = runs_out[0]["module_costs_ms"]
  else:
    run = worker_report(strategies)
    baseline = _baseline_after(before)
    plain = baseline.get("plain_keras_step_s")
    benchmark_lib.add_speedups(run["strategies"], run["strategies"].get("e2e"),
                               plain)
    results, costs = run["strategies"], run["module_costs_ms"]
  return dict(
      model=_MODEL.value, num_modules=_NUM_MODULES.value,
      placement=_PLACEMENT.value, batch_size=_BATCH.value, num_cores=cores,
      steps_per_loop=_STEPS_PER_LOOP.value, onednn=runtime_env.onednn_state(),
      strategies=results, runs=runs_out, module_costs_ms=costs, **baseline)


@error_boundary.guard()
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  try:
    validate()
    if _ROLE.value == "baseline":
      report = baseline_report()
    elif _ROLE.value in ("worker", "profile"):
      plan = None
      if placement_runtime.of(_PLACEMENT.value).splits_host_cpu:
        plan = threading_plan.make_plan(
            _NUM_MODULES.value,
            _NUM_MODULES.value // (_MODULES_PER_DEVICE.value or 1),
            _THREADS.value or 1,
            num_cores=_CORES.value or threading_plan.host_cores())
      report = _around_reference(
          (lambda: worker_report(_STRATEGIES.value, plan))
          if _ROLE.value == "worker" else (lambda: profile_report(plan)),
          plan)
    else:
      report = main_report()
  except (ValueError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  if report.get("baseline_drift", 0) > benchmark_lib.BASELINE_DRIFT:
    # Also said with --json, whose table is not printed.
    print(f"warning: plain Keras ran {100 * report['baseline_drift']:.0f}% "
          f"apart before and after the strategies: the ratios against it "
          f"are unsure by as much (run on a quiet host)", file=sys.stderr)
  if _JSON.value or _ROLE.value != "main":
    print(json.dumps(report))
  else:
    print(benchmark_lib.format_table(report))
  if _JSON_OUT.value and _ROLE.value == "main":
    user_files.write_output(_JSON_OUT.value,
                            json.dumps(report, indent=1) + "\n", "--json_out")


if __name__ == "__main__":
  app.run(main)
