r"""Step times with one worker process per module vs one simulated process.

  python -m train.cluster_benchmark --out_dir=docs/results/cluster

The MLP benchmark network (`train.benchmark_lib.Spec`: width 1024, batch
512, 16 steps per tf.function call) at K modules, each strategy timed twice,
each time in processes of its own:

* cluster: K `train.worker` processes on 127.0.0.1, each with one intra-op
  and one inter-op thread (one core per module, for real: separate
  processes, separate thread pools, activations and cotangents crossing
  between them through TF's gRPC runtime), driven by one client process
  (placement=cluster) that also feeds the batches to worker 0;
* simulated: one process with K logical CPU devices, one intra-op thread and
  K inter-op threads (placement=simulated, the project's usual setting).

Both use `benchmark_lib.run_strategy`: 2 warm-up calls, then the median of
--steps calls, divided by steps per call. The ratio cluster / simulated is
the price of real processes and transfers. One command writes report.md and
results.json; the workers it starts are stopped on the way out.
"""

import json
import os
import subprocess
import sys

from train import runtime_env  # noqa: F401  (before TensorFlow)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

_ROLE = flags.DEFINE_enum("role", "parent", ["parent", "cluster",
                                             "simulated"],
                          "parent starts the workers and both children.")
_OUT = flags.DEFINE_string("out_dir", "docs/results/cluster",
                           "Where report.md and results.json go.")
_K = flags.DEFINE_integer("num_modules", 2, "K: modules and workers.")
_STRATEGIES = flags.DEFINE_list(
    "strategies", ["e2e", "local", "2wise", "e2e-m2", "e2e-m4", "e2e-m8"],
    "Strategies; NAME-mM: NAME with M microbatches per step.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed calls per strategy.")
_CLUSTER = flags.DEFINE_string("cluster", None, "role=cluster: workers.")


def _spec():
  from train import benchmark_lib  # pylint: disable=import-outside-toplevel
  return benchmark_lib.Spec(model="mlp", num_modules=_K.value,
                            steps=_STEPS.value)


def child(role):
  """Times every strategy on one placement; prints one JSON line each."""
  # pylint: disable=import-outside-toplevel
  from tf_interlock import cluster as cluster_lib
  from tf_interlock import placement as placement_lib
  from train import benchmark_lib
  k = _K.value
  if role == "simulated":
    placement_lib.configure_simulated_devices(k, intra_op_threads=1,
                                              inter_op_threads=k)
  else:
    cluster_lib.connect(cluster_lib.cluster_spec(_CLUSTER.value), 120)
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
      [sys.executable, "-m", "train.cluster_benchmark", f"--role={role}",
       f"--num_modules={_K.value}", f"--steps={_STEPS.value}",
       f"--strategies={','.join(_STRATEGIES.value)}", *extra],
      capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(f"{role} child failed: {proc.stderr[-2000:]}")
  return [json.loads(line) for line in proc.stdout.splitlines()
          if line.startswith("{")]


def _start_workers(k):
  # pylint: disable=import-outside-toplevel
  import socket
  socks = [socket.socket() for _ in range(k)]
  for s in socks:
    s.bind(("127.0.0.1", 0))
  cluster = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in socks)
  for s in socks:
    s.close()
  workers = []
  for task in range(k):
    workers.append(subprocess.Popen(
        [sys.executable, "-m", "train.worker", f"--cluster={cluster}",
         f"--task={task}", "--intra_op_threads=1", "--inter_op_threads=1"],
        stdout=subprocess.PIPE, text=True))
    if "ready" not in workers[-1].stdout.readline():
      raise RuntimeError(f"worker {task} did not start")
  return cluster, workers


def report(rows, k):
  """report.md's text: per strategy, both medians and their ratio."""
  by = {(r["placement"], r["strategy"]): r["step_ms"] for r in rows}
  lines = [
      f"# K = {k}: one worker process per module vs one simulated process",
      "", "MLP benchmark network (width 1024, batch 512, 16 steps per call), "
      f"median of {_STEPS.value} calls after 2 warm-ups, ms per step. "
      "`python -m train.cluster_benchmark` (one command, this file and "
      "results.json). Cluster: "
      f"{k} `train.worker` processes on 127.0.0.1, 1 intra-op and 1 inter-op "
      "thread each, driven by one client process. Simulated: one process, "
      f"{k} logical CPUs, 1 intra-op and {k} inter-op threads.",
      "", f"Host: {os.cpu_count()} cores, shared with other work while this "
      "ran: treat single figures as noisy (min..max in results.json).", "",
      "| strategy | cluster ms/step | simulated ms/step | cluster / "
      "simulated |", "|---|---|---|---|"]
  for name in _STRATEGIES.value:
    c, s = by.get(("cluster", name)), by.get(("simulated", name))
    if c and s:
      lines.append(f"| {name} | {c['median']:.2f} | {s['median']:.2f} | "
                   f"{c['median'] / s['median']:.2f} |")
  e2e = by.get(("cluster", "e2e"))
  if e2e:
    lines += ["", "Speedup over e2e on the same placement (e2e / strategy):",
              "", "| strategy | cluster | simulated |", "|---|---|---|"]
    for name in _STRATEGIES.value:
      c, s = by.get(("cluster", name)), by.get(("simulated", name))
      se = by.get(("simulated", "e2e"))
      if c and s and se:
        lines.append(f"| {name} | {e2e['median'] / c['median']:.2f} | "
                     f"{se['median'] / s['median']:.2f} |")
  return "\n".join(lines) + "\n"


def parent():
  cluster, workers = _start_workers(_K.value)
  try:
    rows = _run_child("cluster", f"--cluster={cluster}")
  finally:
    for worker in workers:
      worker.terminate()
      try:
        worker.wait(timeout=30)
      except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(timeout=30)
  rows += _run_child("simulated")
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "results.json"), "w") as f:
    json.dump({"num_modules": _K.value, "steps": _STEPS.value,
               "cpu_count": os.cpu_count(), "rows": rows}, f, indent=2)
  text = report(rows, _K.value)
  with open(os.path.join(_OUT.value, "report.md"), "w") as f:
    f.write(text)
  print(text)


def main(argv):
  del argv
  if _ROLE.value == "parent":
    parent()
  else:
    child(_ROLE.value)


if __name__ == "__main__":
  app.run(main)
