"""Measures the cost of moving a tensor between two worker processes.

The schedule model (`schedule.simulate(..., transfers=...)`) charges every
crossing of an activation or a cotangent between modules on different
processes latency + bytes / bandwidth. Both terms are measured here on the
real link (TF's gRPC runtime; on this host, loopback):

One `tf.function` passes a tensor back and forth between two devices n
times: a chain of n multiplies by a scale read from a variable (grappler
can neither fold nor drop them, as it would identities), each placed on the
other device, so each hop is one Send/Recv pair. The same chain with every
multiply on the first device is timed too; their difference over n is the
crossing alone, without the multiplies and without the cost of calling the
function (dispatch to the workers, fetching the result), which a training
step pays once per steps_per_loop steps, not per crossing. A
one-element tensor gives the latency; a tensor of the activation's shape
gives latency + bytes / bandwidth, so

  per_byte = (t_activation - t_latency) / bytes.
"""

import time

import numpy as np
import tensorflow as tf

from step_model import schedule


def _chain(src, dst, shape, hops):
  """A tf.function: `hops` multiplies of a `shape` float32 tensor, the
  i-th on dst for even i and on src for odd i (dst == src: no crossing)."""
  with tf.device(src):
    seed = tf.Variable(tf.ones(shape, tf.float32))
    scale_src = tf.Variable(1.0)
  with tf.device(dst):
    scale_dst = tf.Variable(1.0)

  @tf.function(autograph=False)
  def run():
    h = seed.read_value()
    for hop in range(hops):
      on_dst = hop % 2 == 0
      with tf.device(dst if on_dst else src):
        h = h * (scale_dst if on_dst else scale_src)
    with tf.device(dst if hops % 2 else src):
      return tf.reduce_sum(tf.reshape(h, [-1])[:1])  # One element back.

  return run


def _median_call(fn, repeats):
  fn().numpy()  # trace and warm up
  fn().numpy()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn().numpy()
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def seconds_per_hop(src, dst, shape, hops=9, repeats=7):
  """Median seconds of one hop of a float32 `shape` tensor src -> dst.

  Args:
    src, dst: device names, e.g. "/job:worker/task:0/device:CPU:0".
    shape: the tensor's shape.
    hops: multiplies in each chain (>= 2).
    repeats: timed calls of each chain (>= 5); the median is kept.

  Returns:
    Seconds per hop (>= 0).
  """
  if hops < 2 or repeats < 5:
    raise ValueError(f"seconds_per_hop needs hops >= 2 and repeats >= 5. "
                     f"Received: hops={hops!r}, repeats={repeats!r}")
  crossing = _median_call(_chain(src, dst, shape, hops), repeats)
  staying = _median_call(_chain(src, src, shape, hops), repeats)
  return max(0.0, (crossing - staying) / hops)


def probe_crossing(src, dst, shape, hops=9, repeats=7):
  """The measured link: latency and seconds per byte between two devices.

  Returns:
    {"latency_s", "activation_s", "bytes", "s_per_byte"}: one hop of a
    1-element tensor, one hop of a float32 `shape` tensor, its size, and
    (activation_s - latency_s) / bytes (>= 0).
  """
  latency = seconds_per_hop(src, dst, (1,), hops, repeats)
  activation = seconds_per_hop(src, dst, tuple(shape), hops, repeats)
  size = 4 * int(np.prod(shape))
  return {"latency_s": latency, "activation_s": activation, "bytes": size,
          "s_per_byte": max(0.0, activation - latency) / size}


def transfer_costs(link, boundary_bytes):
  """`schedule.TransferCost` per module boundary from a probed `link`.

  Args:
    link: `probe_crossing`'s dict.
    boundary_bytes: per boundary k (modules k -> k + 1), the bytes of h_k
      for the full batch (its cotangent has the same size).

  Returns:
    A list of `schedule.TransferCost`, one per boundary.
  """
  return [schedule.TransferCost(latency=link["latency_s"],
                                transfer=link["s_per_byte"] * size)
          for size in boundary_bytes]
