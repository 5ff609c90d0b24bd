"""How fast this host runs a fixed piece of work right now.

On a shared machine the same op takes different times from one minute to
the next: on the 2-core VM of `docs/results/model_validation/`, the MLP's
profiled forward went from 30.3 to 24.9 ms within 7 minutes, with the same
code and nothing else running. A prediction made from op costs profiled at
one moment then meets a step timed at another.

`reference_time` times one fixed workload (a two-layer 1024-wide Dense
chain's forward and weight gradients at batch 256, on the process's thread
pools as they are) in the calling process. `research.model_validation` has
the profile and every timed cell measure it before and after their own
work (`research.benchmark --host_reference`), so its report can say how
much of a cell's miss is the host's drift between the profile and the cell
(`research.validation_report.drift`): a measurement, not a factor fitted
to the cells.
"""

import time

import numpy as np
import tensorflow as tf

WIDTH = 1024
BATCH = 256


def reference_time(repeats=9):
  """Median seconds of one call of the reference workload.

  Args:
    repeats: timed calls (after two warm-up calls).

  Returns:
    The median, in seconds.

  Raises:
    ValueError: for repeats < 1.
  """
  if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f"repeats must be an int >= 1. Received: "
                     f"repeats={repeats!r}")
  rng = np.random.default_rng(0)
  weights = [tf.Variable((rng.standard_normal((WIDTH, WIDTH)) /
                          np.sqrt(WIDTH)).astype(np.float32))
             for _ in range(2)]
  x = tf.constant(rng.standard_normal((BATCH, WIDTH)).astype(np.float32))

  @tf.function(autograph=False)
  def work():
    with tf.GradientTape() as tape:
      h = x
      for w in weights:
        h = tf.nn.relu(tf.matmul(h, w))
      loss = tf.reduce_mean(tf.square(h))
    return tape.gradient(loss, weights)

  work()
  work()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for g in work():
      g.numpy()
    times.append(time.perf_counter() - start)
  return float(np.median(times))

