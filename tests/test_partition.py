"""Tests for the balanced contiguous partition (layers.partition)."""

import itertools
import random

import numpy as np
import pytest

from layers import partition


def _all_splits(n, k):
  """Every way to cut n blocks into k non-empty contiguous modules."""
  for cuts in itertools.combinations(range(1, n), k - 1):
    bounds = (0,) + cuts + (n,)
    yield [b - a for a, b in zip(bounds, bounds[1:])]


def _module_costs(costs, split, cuts):
  out, start = [], 0
  for k, count in enumerate(split):
    end = start + count
    extra = 0 if k == len(split) - 1 else cuts[end - 1]
    out.append(sum(costs[start:end]) + extra)
    start = end
  return out


@pytest.mark.parametrize("with_cuts", [False, True])
def test_balanced_split_is_optimal_against_brute_force(with_cuts):
  rng = random.Random(1234 + with_cuts)
  for _ in range(300):
    n = rng.randint(1, 8)
    k = rng.randint(1, n)
    # Small integer costs: exact sums, and many ties to exercise tie-breaks.
    costs = [rng.randint(0, 6) for _ in range(n)]
    cuts = [rng.randint(0, 6) for _ in range(n)] if with_cuts else [0] * n
    split = partition.balanced_split(
        costs, k, cut_costs=cuts if with_cuts else None)
    assert len(split) == k and sum(split) == n and min(split) >= 1
    chosen = _module_costs(costs, split, cuts)
    others = [_module_costs(costs, s, cuts) for s in _all_splits(n, k)]
    best_max = min(max(o) for o in others)
    assert max(chosen) == best_max
    assert all(max(chosen) <= max(o) for o in others)
    # Tie-breaks among optima: least sum of squared costs, then of squared
    # block counts, then the first split in lexicographic order.
    def key(s):
      c = _module_costs(costs, s, cuts)
      return (sum(x * x for x in c), sum(x * x for x in s), s)
    optimal = [s for s in _all_splits(n, k)
               if max(_module_costs(costs, s, cuts)) == best_max]
    assert split == min(optimal, key=key)
    assert partition.balanced_split(
        costs, k, cut_costs=cuts if with_cuts else None) == split


def test_module_costs_matches_the_cut_rule():
  costs, cuts = [3, 1, 4, 1, 5], [10, 20, 30, 40, 50]
  assert partition.module_costs(costs, [2, 3]) == [4, 10]
  assert partition.module_costs(costs, [2, 3], cut_costs=cuts) == [24, 10]


def test_ties_are_broken_deterministically():
  # Equal blocks: several splits reach the max of 4; the most even one that
  # comes first lexicographically is chosen.
  assert partition.balanced_split([1] * 10, 3) == [3, 3, 4]
  # One dominant block fixes the max; the rest is spread evenly.
  assert partition.balanced_split([5, 1, 1, 1, 1, 1], 3) == [1, 2, 3]


def test_edge_cases():
  assert partition.balanced_split([7], 1) == [1]
  assert partition.balanced_split([1, 2, 3], 3) == [1, 1, 1]
  assert partition.balanced_split([1, 2, 3], 1) == [3]
  assert partition.balanced_split([0, 0, 0, 0], 2) == [2, 2]
  # numpy inputs work and give Python ints.
  split = partition.balanced_split(np.array([1.5, 2.5, 3.0]), np.int64(2))
  assert split == [2, 1] and all(type(c) is int for c in split)
  # An expensive aux head after block 0 pushes the cut later.
  assert partition.balanced_split([1, 1, 1, 1], 2,
                                  cut_costs=[5, 0, 0, 0]) == [2, 2]
  assert partition.balanced_split([1, 1, 1, 1], 2,
                                  cut_costs=[5, 5, 0, 0]) == [3, 1]


@pytest.mark.parametrize("num_modules", [0, -1, 4, 2.0, True, None])
def test_bad_num_modules(num_modules):
  with pytest.raises(ValueError, match=r"Received: num_modules="):
    partition.balanced_split([1, 1, 1], num_modules)


@pytest.mark.parametrize("costs", [[1, -1], [1, float("nan")],
                                   [1, float("inf")], ["a"], [True]])
def test_bad_costs(costs):
  with pytest.raises(ValueError, match=r"Received: costs="):
    partition.balanced_split(costs, 1)


def test_empty_costs_and_bad_cut_costs():
  with pytest.raises(ValueError, match=r"Received: costs=\[\]"):
    partition.balanced_split([], 1)
  with pytest.raises(ValueError, match=r"Received: cut_costs="):
    partition.balanced_split([1, 1], 1, cut_costs=[1])
  with pytest.raises(ValueError, match=r"Received: cut_costs="):
    partition.balanced_split([1, 1], 1, cut_costs=[1, -2])


@pytest.mark.parametrize("split, message", [
    ([2, 2], r"sums to 4.*Received: split=\[2, 2\]"),
    ([5, 0], r"positive ints.*Received: split=\[5, 0\]"),
    ([2.5, 2.5], r"positive ints.*Received: split="),
    ([5], r"one block count per module \(2 modules\).*Received: split="),
    ([], r"one block count per module"),
])
def test_check_split_errors(split, message):
  with pytest.raises(ValueError, match=message):
    partition.check_split(split, num_blocks=5, num_modules=2)


def test_check_split_accepts_valid():
  assert partition.check_split((1, np.int64(4)), 5, 2) == [1, 4]
  assert partition.check_split([5], 5) == [5]
