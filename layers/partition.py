"""Balanced contiguous partition of a layer stack into depthwise modules.

With one module per device, every training step waits for the slowest
module (Gomez et al., 2022, arXiv:2010.04116: the speed-up of local
and n-wise training over end-to-end comes from modules working in parallel,
so the step time is set by the largest per-module cost). Splitting a stack of
blocks with costs c_1..c_n into K contiguous groups therefore minimises

    max_k cost(module k),

the classic linear partition problem, solved here exactly by dynamic
programming in O(K n^2) time (n is at most a few hundred blocks).

Among the partitions that reach the optimal maximum there are usually many
(one large block fixes the maximum, the others can move freely). Ties are
broken deterministically: first by the smallest sum of squared module costs
(the most even spread of the remaining work), then by the smallest sum of
squared block counts (even counts when costs tie, e.g. all zero), then by
the lexicographically smallest tuple of block counts.
"""

import math
import numbers


def _check_costs(name, values, length=None):
  """Returns `values` as a list; each must be a finite number >= 0."""
  values = list(values)
  if length is not None and len(values) != length:
    raise ValueError(
        f"{name} must have one entry per block ({length}). "
        f"Received: {name}={values!r}")
  for v in values:
    if (isinstance(v, bool) or not isinstance(v, numbers.Real) or
        not math.isfinite(v) or v < 0):
      raise ValueError(
          f"{name} must hold non-negative finite numbers. "
          f"Received: {name}={values!r}")
  return values


def balanced_split(costs, num_modules, *, cut_costs=None):
  """Splits blocks into contiguous modules minimising the largest module cost.

  Module k takes a contiguous run of blocks; its cost is the sum of their
  costs plus, for every module but the last, `cut_costs[j]` where j is the
  index of its last block. The cut cost models work that depends on where a
  module ends, e.g. the auxiliary head A_k evaluated on that block's output.

  Args:
    costs: sequence of non-negative numbers, the cost of each block in order.
    num_modules: number of modules K, with 1 <= K <= len(costs).
    cut_costs: optional sequence, same length as `costs`: the extra cost of a
      module (other than the last) that ends after block j.

  Returns:
    A list of K positive ints, the number of blocks in each module, summing to
    len(costs).

  Raises:
    ValueError: if `num_modules` is out of range or the costs are invalid.
  """
  costs = _check_costs("costs", costs)
  n = len(costs)
  if not n:
    raise ValueError(f"costs must name at least one block. Received: "
                     f"costs={costs!r}")
  check_num_modules(num_modules, n)
  cuts = [0.0] * n if cut_costs is None else _check_costs(
      "cut_costs", cut_costs, n)

  prefix = [0.0]
  for c in costs:
    prefix.append(prefix[-1] + c)

  def segment(i, j, last):
    # Cost of a module holding blocks i..j-1. Every cost goes through this one
    # expression, so the two passes below compare identical float values.
    return prefix[j] - prefix[i] + (0.0 if last else cuts[j - 1])

  k_max = int(num_modules)

  def transitions():
    # (k, i, j, last): module k may hold blocks i..j-1. The first k-1 modules
    # need at least k-1 blocks and the remaining K-k at least K-k; only the
    # K-th module is the network's last one, and it must end at block n.
    for k in range(1, k_max + 1):
      last = k == k_max
      for j in ([n] if last else range(k, n - (k_max - k) + 1)):
        for i in range(k - 1, j):
          yield k, i, j, last

  # Pass 1: best[k][j] = the smallest achievable maximum module cost when
  # the first j blocks form k modules.
  best = [[math.inf] * (n + 1) for _ in range(k_max + 1)]
  best[0][0] = 0.0
  for k, i, j, last in transitions():
    cand = max(best[k - 1][i], segment(i, j, last))
    best[k][j] = min(best[k][j], cand)
  optimum = best[k_max][n]

  # Pass 2: among partitions whose every module costs <= optimum, minimise
  # (sum of squared costs, sum of squared counts, counts) lexicographically.
  # Both sums are additive over modules, so the best prefix for each (k, j)
  # extends to the best partition: the DP stays exact.
  even = [[None] * (n + 1) for _ in range(k_max + 1)]
  even[0][0] = (0.0, 0, ())
  for k, i, j, last in transitions():
    prev, seg = even[k - 1][i], segment(i, j, last)
    if prev is None or seg > optimum:
      continue
    cand = (prev[0] + seg * seg, prev[1] + (j - i)**2, prev[2] + (j - i,))
    if even[k][j] is None or cand < even[k][j]:
      even[k][j] = cand
  return list(even[k_max][n][2])


def take(items, split):
  """Deals `items` out into consecutive groups of `split[k]` items.

  Args:
    items: a sequence, e.g. the blocks of a network.
    split: group sizes, summing to len(items).

  Returns:
    A list of len(split) lists.
  """
  counts = check_split(split, len(items))
  groups, start = [], 0
  for count in counts:
    groups.append(list(items[start:start + count]))
    start += count
  return groups


def module_costs(costs, split, *, cut_costs=None):
  """Per-module costs of a given split, with the same cut-cost rule.

  Args:
    costs: sequence of per-block costs.
    split: block counts per module, summing to len(costs).
    cut_costs: optional per-block cut costs, as in `balanced_split`.

  Returns:
    A list with the cost of each module.
  """
  costs = _check_costs("costs", costs)
  cuts = [0.0] * len(costs) if cut_costs is None else _check_costs(
      "cut_costs", cut_costs, len(costs))
  groups = take(list(zip(costs, cuts)), split)
  out = []
  for k, group in enumerate(groups):
    # Every module but the last pays the cut cost of its last block.
    cut = group[-1][1] if k < len(groups) - 1 else 0
    out.append(sum(c for c, _ in group) + cut)
  return out


def check_num_modules(num_modules, num_blocks):
  """Checks 1 <= num_modules <= num_blocks (every module needs a block).

  Args:
    num_modules: the requested number of modules K.
    num_blocks: the number of blocks to split.

  Raises:
    ValueError: naming `num_modules` and the allowed range.
  """
  if (isinstance(num_modules, bool) or
      not isinstance(num_modules, numbers.Integral) or
      not 1 <= num_modules <= num_blocks):
    raise ValueError(
        f"num_modules must be an int between 1 and the number of blocks "
        f"({num_blocks}). Received: num_modules={num_modules!r}")


def check_split(split, num_blocks, num_modules=None):
  """Validates a user-given split and returns it as a list of ints.

  Args:
    split: sequence of block counts per module.
    num_blocks: total number of blocks the counts must add up to.
    num_modules: if given, the number of modules the split must have.

  Returns:
    The split as a list of ints.

  Raises:
    ValueError: naming the bad split and what is allowed.
  """
  counts = list(split)
  if num_modules is not None and len(counts) != num_modules:
    raise ValueError(
        f"split must have one block count per module ({num_modules} "
        f"modules). Received: split={split!r}")
  if not counts or any(
      isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1
      for c in counts):
    raise ValueError(
        f"split must be a non-empty list of positive ints (blocks per "
        f"module). Received: split={split!r}")
  if sum(counts) != num_blocks:
    raise ValueError(
        f"split must sum to the number of blocks ({num_blocks}), but sums to "
        f"{sum(counts)}. Received: split={split!r}")
  return [int(c) for c in counts]
