"""Routing plans and strategy parsing: which loss trains which module."""

import pytest

from tf_interlock import routing
from tf_interlock import strategy as strategy_lib


@pytest.mark.parametrize("spec,window,variant", [
    ("e2e", None, "only"), ("local", 1, "only"), ("pairwise", 2, "only"),
    ("2wise", 2, "only"), ("3wise", 3, "only"), ("10wise", 10, "only"),
    ("2wise-sum", 2, "sum"), ("3WISE:sum", 3, "sum"), (4, 4, "only"),
])
def test_parse(spec, window, variant):
  parsed = strategy_lib.parse_strategy(spec)
  assert (parsed.window, parsed.variant) == (window, variant)


@pytest.mark.parametrize("spec", [
    "", "0wise", "wise", "-1wise", "2wise-mean", "end", "1.5wise", None, 2.0])
def test_parse_rejects(spec):
  with pytest.raises(ValueError, match="Received: strategy="):
    strategy_lib.parse_strategy(spec)


def test_bad_window_and_variant():
  with pytest.raises(ValueError, match="Received: window=0"):
    strategy_lib.InterlockStrategy(0)
  with pytest.raises(ValueError, match="Received: variant='max'"):
    strategy_lib.parse_strategy("2wise", variant="max")


def test_suffix_and_variant_must_agree():
  assert strategy_lib.parse_strategy("2wise-sum", "sum").variant == "sum"
  assert strategy_lib.parse_strategy("2wise-sum", None).variant == "sum"
  assert strategy_lib.parse_strategy("2wise", "sum").variant == "sum"
  # A variant that contradicts the suffix was once silently preferred.
  with pytest.raises(ValueError, match="names variant 'sum' but "
                     "variant='only'.*Received: strategy='2wise-sum'"):
    strategy_lib.parse_strategy("2wise-sum", "only")


def test_names_round_trip():
  for spec in ("e2e", "local", "2wise", "3wise", "2wise-sum"):
    assert strategy_lib.parse_strategy(spec).name == spec
    assert strategy_lib.parse_strategy(str(
        strategy_lib.parse_strategy(spec))) == strategy_lib.parse_strategy(spec)


def _trainers(plan):
  """{k: losses training theta_k}, from the plan."""
  return {k: tuple(j for j in range(plan.num_modules) if plan.trains(j, k))
          for k in range(plan.num_modules)}


def _expected(num_modules, window, variant):
  """The shared doc's rule, written out directly."""
  last = num_modules - 1
  target = lambda k: min(k + window - 1, last)  # noqa: E731
  if window >= num_modules:
    return {k: (last,) for k in range(num_modules)}
  if variant == "only":
    return {k: (target(k),) for k in range(num_modules)}
  return {k: tuple(range(k, target(k) + 1)) for k in range(num_modules)}


@pytest.mark.parametrize("num_modules", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("window", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("variant", ["only", "sum"])
def test_plan_matches_rule(num_modules, window, variant):
  plan = routing.make_plan(strategy_lib.InterlockStrategy(window, variant),
                           num_modules)
  assert _trainers(plan) == _expected(num_modules, window, variant)
  # A stream crosses module k only while it still has to reach lower modules.
  for k in range(num_modules):
    for key in plan.vjp_keys[k]:
      assert key < k


def _input_vjps(strategy, num_modules):
  """Input VJPs per step, summed over modules."""
  return sum(len(keys) for keys in routing.make_plan(
      strategy, num_modules).vjp_keys)


def test_vjp_counts():
  # K = 4: e2e carries only the final loss (3 crossings); local none; 2-wise
  # "only": L_1, L_2 and L_3 each cross one boundary (3).
  assert _input_vjps("e2e", 4) == 3
  assert _input_vjps("local", 4) == 0
  assert _input_vjps("2wise", 4) == 3
  # 3-wise: L_2 -> 0 crosses 2, L_3 (final) -> 1 crosses 2.
  assert _input_vjps("3wise", 4) == 4


def test_e2e_heads_are_probes():
  plan = routing.make_plan("e2e", 4)
  assert plan.loss_low[:3] == (None, None, None)
  assert routing.make_plan(strategy_lib.InterlockStrategy(9, "sum"),
                           4).variant == "only"


def test_missing_aux_head_rejected():
  with pytest.raises(ValueError, match=(
      r"loss of module 2 to train module 1 \(modules counted from 1\), but "
      r"module 2 has no aux head")):
    routing.make_plan("2wise", 3, has_aux=[True, False, False])
  # e2e needs no aux heads at all.
  routing.make_plan("e2e", 3, has_aux=[False, False, False])


@pytest.mark.parametrize("num_modules", [1, 2, 3])
@pytest.mark.parametrize("strategy", ["3wise", "3wise-sum", "4wise"])
def test_a_window_of_at_least_k_routes_as_e2e(strategy, num_modules):
  # n >= K: every module trains on the true loss alone, exactly e2e's plan
  # (so the engine traces the same step and the schedule model predicts the
  # same time; 3-wise at K = 2 measured 102.0 vs e2e 102.3 ms, see
  # docs/results/model_validation/mlp_model_v5_2x1_hostref).
  assert routing.make_plan(strategy, num_modules) == routing.make_plan(
      "e2e", num_modules)
  # A window below K differs from e2e.
  if num_modules >= 2:
    assert routing.make_plan("local", num_modules) != routing.make_plan(
        "e2e", num_modules)
