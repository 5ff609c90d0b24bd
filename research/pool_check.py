r"""Which threads each simulated device's ops run on, and how many at once.

  python -m research.pool_check --num_devices=4 --threads_per_device=4

A threading plan (`step_model.threading_plan`) claims D devices x t threads.
TF's local CPU devices share one intra-op pool of t threads unless
TF_OVERRIDE_GLOBAL_THREADPOOL=1 is set before the runtime starts
(`threading_plan.use_own_pools`, which this binary calls as the training
binaries do; --shared_pool leaves TF's default). This check sets the plan
up, then for each device in turn runs a chain of --chain matmuls of
--width x --width on it and lists the threads whose CPU time grew meanwhile
(/proc/self/task/TID/stat, the calling thread left out): the device's pool.
It then times the chain on device 0 alone and on all D devices at once (one
tf.function), medians of --repeats calls: `overlap` = D * alone / together
is how many devices' chains ran at once (min(D, cores / t) when each device
has its own pool of t on free cores; about 1 when one pool is shared).

Prints one JSON object: plan, threads per device (thread ids), whether the
devices' threads are disjoint, alone_s, together_s and overlap.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import json
import os
import statistics
import time

from absl import app
from absl import flags
import tensorflow as tf

from tf_interlock import placement
from step_model import threading_plan
from train import config as config_lib
from train import error_boundary

_DEVICES = flags.DEFINE_integer(
    "num_devices", 2, "Logical CPU devices D of the plan (>= 1).")
_THREADS = flags.DEFINE_integer(
    "threads_per_device", 2, "Intra-op threads t of each device (>= 1).")
_SHARED = flags.DEFINE_bool(
    "shared_pool", False, "Leave TF's default: all devices share one "
    "intra-op pool of t threads (no TF_OVERRIDE_GLOBAL_THREADPOOL).")
_WIDTH = flags.DEFINE_integer(
    "width", 768, "Rows and columns of each matmul of the chain (>= 1).")
_CHAIN = flags.DEFINE_integer(
    "chain", 24, "Matmuls in each device's chain (>= 1).")
_REPEATS = flags.DEFINE_integer(
    "repeats", 3, "Timed calls of each case, after one warm-up; their "
    "median is reported (>= 1).")


def cpu_ticks():
  """{thread id: CPU ticks (user + system)} of this process's threads but
  the calling one (it runs the calls and waits)."""
  ticks = {}
  for tid in os.listdir("/proc/self/task"):
    if int(tid) == os.getpid():
      continue
    try:
      with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # The thread ended.
      continue
    ticks[int(tid)] = int(fields[11]) + int(fields[12])
  return ticks


def make_chain(num_matmuls):
  """A tf.function: `num_matmuls` matmuls in a row on each of its inputs
  (scaled so the values stay finite)."""

  @tf.function
  def chain(*inputs):
    outputs = []
    for x in inputs:
      for _ in range(num_matmuls):
        x = tf.matmul(x, x) * 1e-3
      outputs.append(x)
    return outputs
  return chain


def device_threads(devices, width=768, num_matmuls=24):
  """Per device, the sorted ids of the threads that ran its matmul chain."""
  chain = make_chain(num_matmuls)
  used = []
  for device in devices:
    with tf.device(device):
      x = tf.random.normal([width, width])
      [out] = chain(x)  # Traced and warm: the next call is the ops alone.
      out.numpy()
      before = cpu_ticks()
      [out] = chain(x)
      out.numpy()
      after = cpu_ticks()
    used.append(sorted(t for t in after if after[t] > before.get(t, after[t])))
  return used


def _median_s(fn, repeats):
  fn()  # Warm-up (and tracing).
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def overlap_times(devices, width, num_matmuls, repeats):
  """(alone_s, together_s): the chain on devices[0], and on every device
  at once in one call."""
  chain = make_chain(num_matmuls)
  inputs = []
  for device in devices:
    with tf.device(device):
      inputs.append(tf.random.normal([width, width]))
  alone = _median_s(lambda: [t.numpy() for t in chain(inputs[0])], repeats)
  together = _median_s(lambda: [t.numpy() for t in chain(*inputs)], repeats)
  return alone, together


def check(num_devices, threads, shared_pool, width, num_matmuls, repeats):
  """Sets this process up as the plan and measures it (see the module doc).
  Must run before the TF runtime starts."""
  plan = threading_plan.make_plan(num_devices, num_devices, threads,
                                  num_cores=threading_plan.host_cores(),
                                  shared_pool=shared_pool)
  threading_plan.use_own_pools(plan)
  names = placement.configure_simulated_devices(num_devices,
                                                intra_op_threads=threads)
  used = device_threads(names, width, num_matmuls)
  every = [t for threads_of in used for t in threads_of]
  alone, together = overlap_times(names, width, num_matmuls, repeats)
  return {"plan": plan.describe(), "cores_in_use": plan.cores_in_use(),
          "host_cores": plan.num_cores,
          "own_pools_env": os.environ.get(threading_plan.OWN_POOLS_ENV),
          "device_threads": used,
          "threads_per_device_used": [len(t) for t in used],
          "disjoint": len(every) == len(set(every)),
          "alone_s": alone, "together_s": together,
          "overlap": num_devices * alone / together}


@error_boundary.guard()
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  for flag in (_DEVICES, _THREADS, _WIDTH, _CHAIN, _REPEATS):
    config_lib.check_number(flag.name, flag.value, minimum=1, integer=True)
  print(json.dumps(check(_DEVICES.value, _THREADS.value, _SHARED.value,
                         _WIDTH.value, _CHAIN.value, _REPEATS.value)))


if __name__ == "__main__":
  app.run(main)
