r"""What a graph loop over blocks of U steps costs, predicted per strategy.

  python -m research.predict_blocks \
      --profile=docs/results/balance/fashion_mnist_resnet.json \
      --split=2,2,2,3 --steps_per_loop=10 --blocks=1,2,5,10

Reads per-block op costs measured by `research.benchmark --role=profile`
(its `module_costs_ms`, one row per block), sums them into the K modules
of --split, and asks the schedule model (`schedule.simulate`, one device
per module) for each strategy's step time when a call of --steps_per_loop
steps loops blocks of U steps (`ExecutionOptions.loop_block`), over its
time with the call's steps written out (which wait at each call's end, as
one block of steps_per_loop steps does). Prints JSON.
"""

# First: checks the environment and quiets TF before TensorFlow loads.
from train import runtime_env  # pylint: disable=unused-import,g-bad-import-order

import json

from absl import app
from absl import flags

from research import benchmark_lib
from step_model import schedule
from train import error_boundary
from train import user_files

_PROFILE = flags.DEFINE_string(
    "profile", None, "A research.benchmark --role=profile JSON report.")
_SPLIT = flags.DEFINE_list(
    "split", None, "Blocks of the profile per module, e.g. 2,2,2,3.")
_STEPS_PER_LOOP = flags.DEFINE_integer(
    "steps_per_loop", 10, "Steps of one training call (>= 1; the unrolled "
    "call).")
_BLOCKS = flags.DEFINE_list(
    "blocks", ["1", "2", "5", "10"], "The block sizes U to predict, "
    "comma-separated ints >= 1.")
_STRATEGIES = flags.DEFINE_list(
    "strategies", ["local", "2wise", "3wise", "e2e"],
    "Strategies to predict, comma-separated (local, Nwise, e2e).")


def module_costs(block_costs, split):
  """The K `ModuleCost`s of blocks grouped by `split`: a module's forward,
  VJPs and update are its blocks' sums; its aux head is its last block's."""
  costs, start = [], 0
  for count in split:
    blocks = block_costs[start:start + count]
    start += count
    total = lambda name: sum(getattr(b, name) for b in blocks)  # noqa
    costs.append(schedule.ModuleCost(
        forward=total("forward"), input_vjp=total("input_vjp"),
        weight_vjp=total("weight_vjp"), aux=blocks[-1].aux,
        update=total("update")))
  return costs


def predict(costs, strategies, steps_per_loop, blocks):
  """{strategy: {U: step time over a call's written-out steps}}."""
  out = {}
  for name in strategies:
    unrolled = schedule.simulate(costs, name, loop="while",
                                 loop_block=steps_per_loop).step_time
    out[name] = {u: round(schedule.simulate(
        costs, name, loop="while", loop_block=u).step_time / unrolled, 3)
                 for u in blocks}
  return out


@error_boundary.guard()
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  report = user_files.read_json(_PROFILE.value, "--profile",
                                {"module_costs_ms": list})
  blocks = benchmark_lib.costs_from_ms(report["module_costs_ms"])
  split = [int(v) for v in _SPLIT.value if v.isdigit()]
  if (len(split) != len(_SPLIT.value) or not all(split) or
      sum(split) != len(blocks)):
    raise ValueError(f"--split must be positive counts summing to the "
                     f"profile's {len(blocks)} blocks. "
                     f"Received: split={','.join(_SPLIT.value)!r}")
  costs = module_costs(blocks, split)
  print(json.dumps({
      "profile": _PROFILE.value, "split": split,
      "steps_per_loop": _STEPS_PER_LOOP.value,
      "step_time_over_unrolled": predict(
          costs, _STRATEGIES.value, _STEPS_PER_LOOP.value,
          [int(u) for u in _BLOCKS.value])}, indent=1))


if __name__ == "__main__":
  flags.mark_flags_as_required(["profile", "split"])
  app.run(main)
