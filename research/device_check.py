r"""One device per module, measured against the schedule model: `make device-check`.

  python -m research.device_check --out_dir=runs/device_check

Runs `research.benchmark` (an MLP split into K modules, every strategy) in one
process per case, since device configuration is fixed per process:

* cpu_k4, cpu_k8: K logical CPU devices, one intra-op thread each (one core
  per module), on a machine with >= 2K cores (K = 4 from 8 cores, K = 8 from
  16; the other K threads are left to the runtime and the input);
* virtual_gpu_k4: module k on logical GPU k of one physical GPU;
* gpu_k4, gpu_k8: module k on physical GPU k, when there are K GPUs.

On a machine with fewer than 8 cores and no GPU it runs its degenerate form,
cpu_k2 with tiny sizes, so that the check itself is tested anywhere. Each
case gives, per strategy, the measured step time, the schedule model's step
time from the op costs measured in the same process (with K cores), and the
speedups over e2e. Writes device_check.json and device_check.md to out_dir;
cases this machine cannot run are listed with the reason. The whole check
stops with an error after --time_limit_s.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags
import tensorflow as tf

from train import config as config_lib
from train import error_boundary
from train import placement_runtime
from train import user_files

_OUT_DIR = flags.DEFINE_string(
    "out_dir", "runs/device_check", "Folder device_check.json and "
    "device_check.md are written to.")
_TIME_LIMIT_S = flags.DEFINE_float(
    "time_limit_s", 480.0, "Seconds (> 0) for all cases together; the "
    "check stops with an error past it.")
_STRATEGIES = flags.DEFINE_list(
    "strategies", ["e2e", "local", "2wise", "3wise"], "Strategies every "
    "case times, comma-separated (research.benchmark names).")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# research.benchmark sizes: (width, batch_size, timed calls, steps per call).
FULL_CPU = (1024, 512, 5, 16)
FULL_GPU = (4096, 1024, 5, 16)
TINY = (64, 32, 2, 4)


def plan_cases(num_cpus, num_gpus):
  """The cases this machine can run, and those it cannot with the reason.

  Returns:
    (cases, skipped): cases are dicts with name, module (the binary),
    placement, num_modules, sizes and env; skipped are {name, reason}.
  """
  cases, skipped = [], []
  no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
  for k in (4, 8):
    name = f"cpu_k{k}"
    if num_cpus >= 2 * k:
      cases.append(dict(name=name, module="research.benchmark",
                        placement="simulated", num_modules=k, sizes=FULL_CPU,
                        env=no_gpu, extra=[]))
    else:
      skipped.append({"name": name, "reason": f"needs >= {2 * k} cores; "
                                              f"this machine has {num_cpus}"})
  if not cases and not num_gpus:
    # The plain Keras baseline (its own process) is left out here.
    cases.append(dict(name="cpu_k2_degenerate", module="research.benchmark",
                      placement="simulated", num_modules=2, sizes=TINY,
                      env=no_gpu, extra=["--nobaseline"]))
  if num_gpus:
    cases.append(dict(name="virtual_gpu_k4",
                      module="research.benchmark_virtual_gpus", placement="gpu",
                      num_modules=4, sizes=FULL_GPU,
                      env={"CUDA_VISIBLE_DEVICES": "0"},
                      extra=["--virtual_gpus=4"]))
  else:
    skipped.append({"name": "virtual_gpu_k4", "reason": "no GPU"})
  for k in (4, 8):
    name = f"gpu_k{k}"
    if num_gpus >= k:
      cases.append(dict(name=name, module="research.benchmark", placement="gpu",
                        num_modules=k, sizes=FULL_GPU, env={}, extra=[]))
    else:
      skipped.append({"name": name, "reason": f"needs {k} GPUs; this "
                                              f"machine has {num_gpus}"})
  return cases, skipped


def case_args(case, strategies):
  """research.benchmark's flags for `case`."""
  width, batch, steps, per_loop = case["sizes"]
  k = case["num_modules"]
  # One device per module, one intra-op thread each: no threading plan.
  plan = (["--threads_per_device=1", "--modules_per_device=1"]
          if placement_runtime.of(case["placement"]).splits_host_cpu else [])
  return ["--json", "--model=mlp", f"--num_modules={k}",
          f"--placement={case['placement']}", f"--num_cores={k}", *plan,
          "--nofit", f"--width={width}", f"--batch_size={batch}",
          f"--steps={steps}", f"--steps_per_loop={per_loop}",
          f"--strategies={','.join(strategies)}", *case["extra"]]


def rows(report):
  """Per strategy: measured and modelled step time, and the speedups."""
  return {name: {
      "measured_step_s": row["measured_step_s"],
      "model_step_s": row["predicted_step_s"],
      "model_over_measured": row["predicted_step_s"] / row["measured_step_s"],
      "measured_speedup": row.get("measured_speedup"),
      "predicted_speedup": row.get("predicted_speedup"),
  } for name, row in report["strategies"].items()}


def run_case(case, strategies, timeout_s):
  """Runs one case's benchmark process; its JSON report."""
  args = [sys.executable, "-m", case["module"],
          *case_args(case, strategies)]
  env = dict(os.environ, **case["env"], PYTHONPATH=ROOT)
  try:
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=max(1.0, timeout_s))
  except subprocess.TimeoutExpired:
    raise RuntimeError(f"case {case['name']} ran past the time left "
                       f"({timeout_s:.0f} s of --time_limit_s)") from None
  if proc.returncode:
    raise RuntimeError(f"case {case['name']} failed ({proc.returncode}):\n"
                       f"{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1]), args


def table(result):
  """The short markdown table of a device check."""
  lines = ["| case | K | strategy | measured ms | model ms | model / measured"
           " | speedup vs e2e measured | predicted |", "|" + "---|" * 8]
  for case in result["cases"]:
    for name, row in case["rows"].items():
      speeds = [row["measured_speedup"], row["predicted_speedup"]]
      lines.append("| " + " | ".join(
          [case["name"], str(case["num_modules"]), name,
           f"{1e3 * row['measured_step_s']:.2f}",
           f"{1e3 * row['model_step_s']:.2f}",
           f"{row['model_over_measured']:.2f}"] +
          ["-" if s is None else f"{s:.2f}x" for s in speeds]) + " |")
  lines += [""] + [f"Not run: {s['name']} ({s['reason']})."
                   for s in result["skipped"]]
  if result.get("error"):
    lines.append(f"**Stopped: {result['error']}**")
  return "\n".join(lines) + "\n"


def device_check(out_dir, time_limit_s, strategies):
  """Runs every case that fits; writes the JSON and the table.

  Raises:
    RuntimeError: a case failed or the time ran out (what finished before is
      written, with the error).
  """
  config_lib.check_positive("time_limit_s", time_limit_s)
  if not strategies:
    raise ValueError("--strategies must name at least one strategy. "
                     "Received: strategies=")
  num_cpus = len(os.sched_getaffinity(0))
  num_gpus = len(tf.config.list_physical_devices("GPU"))
  cases, skipped = plan_cases(num_cpus, num_gpus)
  result = {"machine": {"cores": num_cpus, "gpus": num_gpus,
                        "tensorflow": tf.__version__},
            "time_limit_s": time_limit_s, "cases": [], "skipped": skipped}
  start, error = time.monotonic(), None
  for case in cases:
    began = time.monotonic()
    try:
      report, args = run_case(case, strategies,
                              time_limit_s - (began - start))
    except RuntimeError as e:
      error = str(e)
      break
    result["cases"].append({
        "name": case["name"], "placement": case["placement"],
        "num_modules": case["num_modules"],
        "command": " ".join(["python", "-m"] + args[2:]),
        "seconds": time.monotonic() - began, "rows": rows(report),
        "benchmark": report})
  if error:
    result["error"] = error
  tf.io.gfile.makedirs(out_dir)
  user_files.write_output(os.path.join(out_dir, "device_check.json"),
                          json.dumps(result, indent=2), "--out_dir")
  text = table(result)
  user_files.write_output(os.path.join(out_dir, "device_check.md"), text,
                          "--out_dir")
  print(text)
  if error:
    raise RuntimeError(error)
  return result


@error_boundary.guard()
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  try:
    device_check(_OUT_DIR.value, _TIME_LIMIT_S.value, _STRATEGIES.value)
  except (ValueError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
