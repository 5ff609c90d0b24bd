r"""What each per-call check of `InterlockModel.fit` costs, timed on its own.

  python -m research.check_costs --json_out=/tmp/check_costs.json

`fit` guards every call: `call_guard` (one call at a time per model, a
lock), the argument checks before any data is read (`fit_checks.check_fit`,
`check_labels` over array labels, `sample_weights.check_arrays`), and the
default `NonFiniteGuard` (the logs after every `steps_per_execution` call;
every module's weights at each epoch's end). Each is timed here as `fit`
runs it, median of --repeats calls after the benchmark's warm-ups, for --examples
examples and for a split MLP of K = 4 modules of width --width; the
weights check is also timed on --large_weights weights (GPT-2's 124M by
default) held as 8 variables. Prints one JSON object: seconds per check,
and per step at steps_per_execution 1 and 16 for those that run per call.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import json
import types

from absl import app
from absl import flags
import keras
import numpy as np
import tensorflow as tf

from research import benchmark_lib
from tf_interlock import call_guard
from tf_interlock.keras import fit_checks
from tf_interlock.keras import sample_weights
from tf_interlock.keras import split as keras_split
from train import error_boundary
from train import user_files

_EXAMPLES = flags.DEFINE_integer(
    "examples", 60000, "Examples of the array labels and sample weights "
    "checked (>= 1).")
_WIDTH = flags.DEFINE_integer(
    "width", 1024, "Units of each hidden Dense layer of the MLP (>= 1).")
_LARGE = flags.DEFINE_integer(
    "large_weights", 124_000_000, "Weights of the large weights check "
    "(>= 8; GPT-2 small: 124M).")
_REPEATS = flags.DEFINE_integer(
    "repeats", 9, "Timed calls of each check after two warm-ups (>= 1); "
    "their median is reported.")
_JSON_OUT = flags.DEFINE_string(
    "json_out", None, "Also write the JSON report to this file.")


def median_seconds(fn, repeats):
  """The median seconds of `fn()` over `repeats` calls, after the
  benchmark's warm-ups."""
  return benchmark_lib.time_call_stats(fn, repeats)["median"]


def split_mlp(width, num_modules=4):
  """An InterlockModel of 2 hidden Dense layers per module, compiled."""
  from tf_interlock.keras.model import InterlockModel  # pylint: disable=g-import-not-at-top
  layers = [keras.Input((width,))]
  layers += [keras.layers.Dense(width, activation="relu")
             for _ in range(2 * num_modules)]
  layers.append(keras.layers.Dense(10))
  model = InterlockModel(
      keras_split.from_keras(keras.Sequential(layers), num_modules), "2wise")
  model.compile("adam")
  model.build((None, width))
  return model


def large_weights(count):
  """A stand-in with the attribute the weights check reads: one module of
  `count` float weights in 8 variables."""
  module = types.SimpleNamespace(weights=[
      tf.Variable(tf.zeros([count // 8])) for _ in range(8)])
  return _Holder([module])


class _Holder:
  """A weak-referenceable stand-in for the model (the check caches its
  traced function per model)."""

  def __init__(self, modules):
    self.interlock_modules = modules


def report(examples, width, large, repeats):
  """{check: seconds per call} and the per-step shares of the call checks."""
  rng = np.random.default_rng(0)
  x = rng.random((examples, 4), dtype=np.float32)
  y = rng.integers(0, 10, examples)
  weights = np.ones(examples, np.float32)
  model = split_mlp(width)
  logs = {f"module_{k}/{name}": 1.0 for k in range(1, 5)
          for name in ("loss", "grad_norm")}
  logs["loss"] = 1.0
  guard = call_guard.CallGuard("InterlockModel")

  def hold_guard():
    with guard.call("fit"):
      pass

  big = large_weights(large)
  per_call = {
      "call_guard": median_seconds(hold_guard, repeats),
      "check_fit": median_seconds(
          lambda: fit_checks.check_fit(x, y, 32, {}), repeats),
      "check_labels": median_seconds(
          lambda: fit_checks.check_labels(y, lambda: 10), repeats),
      "sample_weights.check_arrays": median_seconds(
          lambda: sample_weights.check_arrays(weights, y), repeats),
      "nonfinite_logs": median_seconds(
          lambda: fit_checks.nonfinite_problem(model, logs, weights=False),
          repeats),
      "nonfinite_weights_mlp": median_seconds(
          lambda: fit_checks.nonfinite_problem(model, {}, weights=True),
          repeats),
      "nonfinite_weights_large": median_seconds(
          lambda: fit_checks.nonfinite_problem(big, {}, weights=True),
          repeats),
  }
  mlp_weights = sum(int(np.prod(v.shape)) for v in model.weights)
  return {"examples": examples, "width": width, "mlp_weights": mlp_weights,
          "large_weights": large, "repeats": repeats,
          "seconds": per_call,
          # The logs check runs after every call of steps_per_execution
          # steps; the others once per fit call or epoch.
          "logs_check_per_step_s": {
              "steps_per_execution_1": per_call["nonfinite_logs"],
              "steps_per_execution_16": per_call["nonfinite_logs"] / 16}}


@error_boundary.guard()
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  # The numeric flags' bounds (in their help) are checked by the guard.
  if _JSON_OUT.value:
    user_files.check_output(_JSON_OUT.value, "--json_out")
  text = json.dumps(report(_EXAMPLES.value, _WIDTH.value, _LARGE.value,
                           _REPEATS.value), indent=1)
  print(text)
  if _JSON_OUT.value:
    user_files.write_output(_JSON_OUT.value, text + "\n", "--json_out")


if __name__ == "__main__":
  app.run(main)
