r"""Measured vs predicted step times: one worker process per module.

  python -m research.cluster_benchmark --model=mlp --num_workers=2
  # -> docs/results/cluster/mlp_k2/{profile,predictions,results}.json,
  #    report.md

For the MLP benchmark network (`benchmark_lib.make_spec`: width 1024, batch
512) or the Fashion-MNIST ResNet-20 (the `fashion_mnist_resnet` network:
28x28x1, batch 128, "pool" aux heads) at K = --num_workers modules:

1. profile (a process of its own, before anything is timed): every op of
   every module on one intra-op thread (`profiling.measure_module_costs`),
   and the bytes of each module's output activation;
2. K `train.worker` processes on 127.0.0.1 (1 intra-op, 1 inter-op thread
   each) and one client (placement=cluster): the client first probes the
   link (`transfer.probe_crossing`, worker 0 <-> worker 1, a tensor of h_0's
   shape), then writes predictions.json (the schedule model's ms/step for
   every cell, cluster with the transfer ops, simulated without), and only
   then times each cell;
3. simulated: one process, K logical CPUs, 1 intra-op and K inter-op
   threads, times the same cells.

Timing is `benchmark_lib.run_strategy`'s: 2 warm-up calls, the median of
--steps calls of steps_per_loop steps. The workers are stopped in a finally,
also when one fails to start. The output folder must not hold files this
tool did not write (a `.written_by_cluster_benchmark` marker says it did).
"""

import json
import os
import socket
import subprocess
import sys

from train import runtime_env  # noqa: F401  (before TensorFlow)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from train import error_boundary  # noqa: E402
from train import owned_dir  # noqa: E402
from train import user_files  # noqa: E402

_ROLE = flags.DEFINE_enum("role", "parent", ["parent", "profile", "cluster",
                                             "simulated"],
                          "parent (the user's) runs profile, cluster and "
                          "simulated, each in a process of its own.")
_OUT = flags.DEFINE_string(
    "out_dir", None, "Folder of profile/predictions/results.json and "
    "report.md; default: docs/results/cluster/MODEL_kK.")
_MODEL = flags.DEFINE_string(
    "model", "mlp", "Network: mlp (width 1024, batch 512) or resnet "
    "(fashion_mnist_resnet's ResNet-20, batch 128).")
_K = flags.DEFINE_integer(
    "num_workers", 2, "K: modules, and worker processes on 127.0.0.1, one "
    "module each (2 or 4).")
_STRATEGIES = flags.DEFINE_list(
    "strategies", ["e2e", "local", "2wise", "e2e-m2", "e2e-m4", "e2e-m8"],
    "Strategies timed (cells), comma-separated; NAME-mM: NAME with M "
    "microbatches per step (e2e-m4: the GPipe-style pipeline).")
_STEPS = flags.DEFINE_integer(
    "steps", 5, "Timed calls (>= 1) per cell after 2 warm-up calls; their "
    "median is reported.")
_LOOP = flags.DEFINE_integer(
    "steps_per_loop", 16, "Training steps unrolled in each timed "
    "tf.function call (>= 1).")
_CLUSTER = flags.DEFINE_string(
    "cluster", None, "Internal, role=cluster: comma-separated host:port of "
    "the workers the parent started.")
_CONTENTION_FROM = flags.DEFINE_string(
    "contention_from", None, "A research.concurrency_probe report whose "
    "`contention` (how much two modules' ops at once slow each other) the "
    "predictions use; default: none (c = 1).")
_PROFILE = flags.DEFINE_string(
    "profile", None, "Internal, role=cluster: the profile.json the profile "
    "role wrote, for the predictions.")

_MARKER = ".written_by_cluster_benchmark"
_FILES = ("profile.json", "predictions.json", "results.json", "report.md")


def _spec():
  # pylint: disable=import-outside-toplevel
  from research import benchmark_lib
  if _MODEL.value == "resnet":
    return benchmark_lib.make_spec(
        model="resnet", preset="resnet20", image_size=28, channels=1,
        resnet_aux_head="pool", batch_size=128, num_modules=_K.value,
        steps=_STEPS.value, steps_per_loop=_LOOP.value)
  return benchmark_lib.make_spec(model="mlp", num_modules=_K.value,
                                 steps=_STEPS.value,
                                 steps_per_loop=_LOOP.value)


def _cores(k):
  return min(k, os.cpu_count() or 1)


def profile():
  """Op costs (one intra-op thread) and activation bytes: one JSON line."""
  # pylint: disable=import-outside-toplevel
  from tf_interlock import exits
  from tf_interlock import placement as placement_lib
  from step_model import profiling
  from research import benchmark_lib
  k, spec = _K.value, _spec()
  placement_lib.configure_simulated_devices(k, intra_op_threads=1,
                                            inter_op_threads=k)
  trainer = benchmark_lib.build_trainer(
      spec, "e2e", placement_lib.make_placement("simulated", k))
  x, y = benchmark_lib.make_batch(spec)
  costs = profiling.measure_module_costs(trainer, x, y)
  # One microbatch's ops (batch / M) for every M of the cells, timed M at a
  # time inside one graph.
  micro = {}
  for m in sorted({benchmark_lib.parse_cell(n)[1]
                   for n in _STRATEGIES.value} - {1}):
    micro[m] = benchmark_lib.costs_ms(
        profiling.measure_module_costs(trainer, x, y, microbatches=m))
  shapes = [[int(d) for d in found.outputs.shape]
            for found in exits.exits(trainer.modules[:-1], x, heads=())]
  print(json.dumps({"costs_ms": benchmark_lib.costs_ms(costs),
                    "microbatch_costs_ms": micro,
                    "boundary_shapes": shapes}), flush=True)


def _contention():
  """c of the schedule model, from --contention_from (1.0 without)."""
  # pylint: disable=import-outside-toplevel
  from research import benchmark_lib
  if _CONTENTION_FROM.value is None:
    return 1.0
  # The whole batch's (the report's first): the cells' microbatches differ.
  return next(iter(benchmark_lib.read_contention(
      _CONTENTION_FROM.value).values()))


def predictions(prof, link):
  """ms/step per cell: cluster (transfer ops) and simulated (none)."""
  # pylint: disable=import-outside-toplevel
  import numpy as np
  from step_model import schedule
  from step_model import transfer
  from research import benchmark_lib
  costs = benchmark_lib.costs_from_ms(prof["costs_ms"])
  sizes = [4 * int(np.prod(s)) for s in prof["boundary_shapes"]]
  transfers = transfer.transfer_costs(link, sizes)
  out = {}
  for name in _STRATEGIES.value:
    strategy, m = benchmark_lib.parse_cell(name)
    micro = prof.get("microbatch_costs_ms", {}).get(str(m))
    kwargs = dict(num_microbatches=m, num_cores=_cores(_K.value),
                  contention=_contention(),
                  microbatch_costs=micro and benchmark_lib.costs_from_ms(
                      micro))
    out[name] = {
        "cluster": 1e3 * schedule.simulate(costs, strategy, transfers=transfers,
                                           **kwargs).step_time,
        # One process of K logical CPUs and K inter-op threads, any of
        # which runs any device's op; a worker has one inter-op thread.
        "simulated": 1e3 * schedule.simulate(costs, strategy,
                                             ops_per_device=_K.value,
                                             **kwargs).step_time}
  return out


def child(role):
  """Times every cell on one placement; prints one JSON line each."""
  # pylint: disable=import-outside-toplevel
  from tf_interlock import cluster as cluster_lib
  from tf_interlock import placement as placement_lib
  from step_model import transfer
  from research import benchmark_lib
  k = _K.value
  if role == "simulated":
    placement_lib.configure_simulated_devices(k, intra_op_threads=1,
                                              inter_op_threads=k)
  else:
    spec = cluster_lib.cluster_spec(_CLUSTER.value)
    devices = cluster_lib.connect(spec, timeout_s=120)
    prof = user_files.read_json(_PROFILE.value, "--profile")
    link = transfer.probe_crossing(devices[0], devices[1],
                                   prof["boundary_shapes"][0])
    predicted = predictions(prof, link)
    # Written before the first timed cell: the prediction cannot peek.
    path = os.path.join(os.path.dirname(_PROFILE.value), "predictions.json")
    user_files.write_output(path, json.dumps(
        {"link": link, "num_cores": _cores(k), "contention": _contention(),
         "contention_from": _CONTENTION_FROM.value,
         "ms_per_step": predicted}, indent=2), "--out_dir")
  for name in _STRATEGIES.value:
    stats = {}
    benchmark_lib.run_strategy(_spec(), name,
                               placement_lib.make_placement(role, k),
                               stats=stats)
    print(json.dumps({"placement": role, "strategy": name,
                      "step_ms": {key: value * 1e3
                                  for key, value in stats.items()}}),
          flush=True)


def _run_child(role, *extra):
  proc = subprocess.run(
      [sys.executable, "-m", "research.cluster_benchmark", f"--role={role}",
       f"--model={_MODEL.value}", f"--num_workers={_K.value}",
       f"--steps={_STEPS.value}", f"--steps_per_loop={_LOOP.value}",
       f"--strategies={','.join(_STRATEGIES.value)}",
       *([f"--contention_from={_CONTENTION_FROM.value}"]
         if _CONTENTION_FROM.value else []), *extra],
      capture_output=True, text=True, check=False)
  if proc.returncode:
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    raise ChildProcessError(f"{role} child failed: {tail}")
  return [json.loads(line) for line in proc.stdout.splitlines()
          if line.startswith("{")]


def _free_addresses(k):
  socks = [socket.socket() for _ in range(k)]
  for s in socks:
    s.bind(("127.0.0.1", 0))
  cluster = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in socks)
  for s in socks:
    s.close()
  return cluster


def _stop(workers):
  for worker in workers:
    if worker.poll() is None:
      worker.terminate()
    try:
      worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
      worker.kill()
      worker.wait(timeout=30)


def _cluster_rows(k, profile_path):
  """Starts K workers, runs the cluster child, stops every started worker."""
  cluster, workers = _free_addresses(k), []
  try:
    for task in range(k):
      workers.append(subprocess.Popen(
          [sys.executable, "-m", "train.worker", f"--cluster={cluster}",
           f"--task={task}", "--intra_op_threads=1", "--inter_op_threads=1"],
          stdout=subprocess.PIPE, text=True))
      if "ready" not in workers[-1].stdout.readline():
        raise ConnectionError(f"worker {task} did not start "
                              f"(exit status {workers[-1].poll()})")
    return _run_child("cluster", f"--cluster={cluster}",
                      f"--profile={profile_path}")
  finally:
    _stop(workers)


def _check_out_dir(out):
  """Refuses a folder holding our file names that this tool did not write."""
  if os.path.isdir(out) and not os.path.exists(os.path.join(out, _MARKER)):
    clash = [n for n in _FILES if os.path.exists(os.path.join(out, n))]
    if clash:
      raise FileExistsError(
          f"{out} holds {clash[0]}, not written by research.cluster_benchmark; "
          f"pick another --out_dir. Received: out_dir={out}")
  os.makedirs(out, exist_ok=True)
  user_files.write_output(os.path.join(out, _MARKER), "", "--out_dir")


def report(rows, predicted, link, prof, contention=1.0):
  """report.md's text: measured, predicted and their ratio per cell."""
  k = _K.value
  by = {(r["placement"], r["strategy"]): r["step_ms"]["median"] for r in rows}
  name = ("Fashion-MNIST ResNet-20 (28x28x1, batch 128, pool aux heads)"
          if _MODEL.value == "resnet" else
          "MLP benchmark network (width 1024, batch 512)")
  cores = os.cpu_count()
  share = (f"K = {k} worker processes share the host's {cores} cores: NOT "
           "one core per module." if k > cores else
           f"K = {k} worker processes on {cores} cores: one core per module "
           "(the client process feeding worker 0 shares them too).")
  lines = [
      f"# {_MODEL.value}, K = {k}: measured vs predicted step time", "",
      f"{name}, {_LOOP.value} steps per call, median of {_STEPS.value} calls "
      "after 2 warm-ups, ms per step. `python -m research.cluster_benchmark "
      f"--model={_MODEL.value} --num_workers={k}`.", "",
      f"**The host has {cores} CPU cores**, shared with other work while "
      f"this ran. {share}", "",
      "Cluster: K `train.worker` processes on 127.0.0.1 (1 intra-op, 1 "
      "inter-op thread each) and one client. Simulated: one process, K "
      "logical CPUs, 1 intra-op and K inter-op threads.", "",
      "Predicted: `schedule.simulate` on "
      f"{_cores(k)} cores, from op costs profiled in a separate process on "
      "one thread (profile.json), written to predictions.json before any "
      "cell was timed. Cluster predictions add a transfer op on every "
      "activation and cotangent crossing between processes: latency "
      f"{1e3 * link['latency_s']:.3f} ms + bytes x "
      f"{1e9 * link['s_per_byte']:.3f} ms/MB (probe: one hop of h_0, "
      f"{link['bytes'] / 1e6:.2f} MB, took {1e3 * link['activation_s']:.3f} "
      "ms; worker 0 <-> worker 1, medians of 7). Contention between ops "
      f"that run at once: c = {contention:.3f} (`schedule.slowdown`; "
      f"{_CONTENTION_FROM.value or '1: none'}).", "",
      "| cell | cluster measured | cluster predicted | pred/meas | "
      "simulated measured | simulated predicted | pred/meas | "
      "cluster/simulated measured |", "|---|---|---|---|---|---|---|---|"]
  for cell in _STRATEGIES.value:
    c, s = by.get(("cluster", cell)), by.get(("simulated", cell))
    pc, ps = predicted[cell]["cluster"], predicted[cell]["simulated"]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines.append(
        f"| {cell} | {fmt(c)} | {pc:.2f} | {fmt(c and pc / c)} | {fmt(s)} | "
        f"{ps:.2f} | {fmt(s and ps / s)} | {fmt(c and s and c / s)} |")
  lines += ["", "Op costs per module, ms [forward, input VJP, weight VJP, "
            "aux, update, fused VJP, accumulate]: " +
            json.dumps(prof["costs_ms"])]
  return "\n".join(lines) + "\n"


def parent():
  """Profile, then cluster (probe, predictions.json, timing), simulated."""
  if _MODEL.value not in ("mlp", "resnet"):
    raise ValueError(f"model must be mlp or resnet. "
                     f"Received: model={_MODEL.value}")
  if _K.value not in (2, 4):
    raise ValueError(f"num_workers must be 2 or 4. "
                     f"Received: num_workers={_K.value}")
  out = _OUT.value or os.path.join("docs/results/cluster",
                                   f"{_MODEL.value}_k{_K.value}")
  if _CONTENTION_FROM.value is not None:
    _contention()  # A missing or old probe report: one line, first.
  _check_out_dir(out)
  prof = _run_child("profile")[0]
  profile_path = os.path.abspath(os.path.join(out, "profile.json"))
  user_files.write_output(profile_path, json.dumps(prof, indent=2),
                          "--out_dir")
  rows = _cluster_rows(_K.value, profile_path)
  pred = owned_dir.load_json(os.path.join(out, "predictions.json"),
                             received=f"out_dir={out!r}")
  rows += _run_child("simulated")
  user_files.write_output(os.path.join(out, "results.json"), json.dumps(
      {"model": _MODEL.value, "num_workers": _K.value,
       "steps": _STEPS.value, "steps_per_loop": _LOOP.value,
       "cpu_count": os.cpu_count(), "rows": rows}, indent=2), "--out_dir")
  text = report(rows, pred["ms_per_step"], pred["link"], prof,
                pred["contention"])
  user_files.write_output(os.path.join(out, "report.md"), text, "--out_dir")
  print(text)


@error_boundary.guard()
def main(argv):
  del argv
  if _ROLE.value == "parent":
    parent()
  elif _ROLE.value == "profile":
    profile()
  else:
    child(_ROLE.value)


if __name__ == "__main__":
  app.run(main)
