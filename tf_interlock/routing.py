"""Which loss trains which module: the routing plan of one strategy.

With 0-based modules 0..K-1 and window n, target(k) = min(k + n - 1, K - 1)
(Gomez et al., 2022, arXiv:2010.04116, Sec. 3.2). Loss L_j (the aux loss of
module j, or the true loss for j = K - 1) sends a gradient stream back from
h_j down to the lowest module it trains, lo_j:

* variant "only": theta_k is trained by L_target(k) alone, so L_j trains
  {k : target(k) = j}. For j < K - 1 that is the single module j - n + 1
  (none if negative); the final loss trains modules max(0, K - n)..K - 1.
  Modules between lo_j and j only carry the stream back (input VJPs).
* variant "sum": theta_k is trained by L_k + ... + L_target(k), so L_j
  trains every module it crosses, max(0, j - n + 1)..j.

Streams with the same lo_j behave identically below the module where they
meet (they update the same modules and stop at the same place), and VJPs are
linear, so the engine sums them and computes one input VJP per distinct lo.
The plan is therefore keyed by lo. A stream with lo = None does not exist:
that aux loss trains its head phi_j only (e.g. every aux head in end-to-end
training, where the heads are probes).
"""

import dataclasses
from typing import Optional, Sequence, Tuple

from tf_interlock import strategy as strategy_lib


@dataclasses.dataclass(frozen=True)
class RoutingPlan:
  """Per-module routing of the gradient streams for one step.

  Attributes:
    num_modules: K.
    window: the effective window min(n, K).
    variant: "only" or "sum" ("only" whenever the window is end-to-end).
    loss_low: per loss j, lo_j: the lowest module that L_j trains, or None
      when L_j trains no main weights.
    weight_keys: per module k, the stream keys (lo values) whose cotangent at
      h_k trains theta_k.
    vjp_keys: per module k, the stream keys that must cross into module
      k - 1: one input VJP each.
  """
  num_modules: int
  window: int
  variant: str
  loss_low: Tuple[Optional[int], ...]
  weight_keys: Tuple[Tuple[int, ...], ...]
  vjp_keys: Tuple[Tuple[int, ...], ...]

  @property
  def end_to_end(self):
    """Whether the final loss alone trains every module (no aux loss
    trains a main weight): no module's update may run before the whole
    backward, so the steps have no slack to overlap (`step_loop`)."""
    return self.loss_low[-1] == 0 and all(
        lo is None for lo in self.loss_low[:-1])

  @property
  def routes(self):
    """Which loss trains which module and what crosses each boundary,
    without the strategy's labels (window, variant): two strategies whose
    plans have equal routes train the same way (e.g. "local" and
    "local-sum")."""
    return self.loss_low, self.weight_keys, self.vjp_keys

  def losses_training(self, k):
    """The losses j that train theta_k (`trains(j, k)`), in order."""
    return [j for j in range(self.num_modules) if self.trains(j, k)]

  def trains(self, j, k):
    """True when loss L_j contributes to the update of theta_k."""
    lo = self.loss_low[j]
    return lo is not None and lo <= k <= j and lo in self.weight_keys[k]


def _updates(variant, lo, final_lo, k):
  """Whether the stream keyed `lo` trains module k (lo <= k)."""
  if variant == "sum":
    return True
  # "only": a stream trains just its lowest module, except the final loss,
  # which trains every module whose window ends at K - 1.
  return k == lo or lo == final_lo


def make_plan(strategy, num_modules, has_aux: Optional[Sequence[bool]] = None):
  """Builds the routing plan of `strategy` over `num_modules` modules.

  Args:
    strategy: an `InterlockStrategy`, or anything `parse_strategy` accepts.
    num_modules: K >= 1.
    has_aux: per module, whether it has an auxiliary head (the last one's is
      ignored: its loss is the true loss). Defaults to all True.

  Returns:
    A `RoutingPlan`.

  Raises:
    ValueError: when the strategy needs the aux loss of a module without an
      aux head.
  """
  strategy = strategy_lib.parse_strategy(strategy)
  if has_aux is None:
    has_aux = [True] * num_modules
  if len(has_aux) != num_modules:
    raise ValueError(
        f"has_aux needs one entry per module ({num_modules}). "
        f"Received: has_aux={list(has_aux)}")
  own = strategy.routing_plan(num_modules, tuple(has_aux))
  if own is not None:
    for j, lo in enumerate(own.loss_low):
      _check_aux(strategy, j, lo, num_modules, has_aux)
    return own
  window = strategy.effective_window(num_modules)
  variant = "only" if window >= num_modules else strategy.variant
  last = num_modules - 1
  loss_low = []
  for j in range(num_modules):
    if variant == "sum" or j == last:
      lo = max(0, j - window + 1)
    else:
      lo = j - window + 1 if j - window + 1 >= 0 else None
    _check_aux(strategy, j, lo, num_modules, has_aux)
    loss_low.append(lo)
  final_lo = loss_low[last]
  weight_keys, vjp_keys = [], []
  for k in range(num_modules):
    keys = sorted({loss_low[j] for j in range(k, num_modules)
                   if loss_low[j] is not None and loss_low[j] <= k})
    weight_keys.append(tuple(
        lo for lo in keys if _updates(variant, lo, final_lo, k)))
    vjp_keys.append(tuple(lo for lo in keys if lo < k))
  return RoutingPlan(num_modules, window, variant, tuple(loss_low),
                     tuple(weight_keys), tuple(vjp_keys))


def _check_aux(strategy, j, lo, num_modules, has_aux):
  """Refuses a plan where L_j (j < K - 1) trains a module but module j has
  no aux head to compute it."""
  if lo is not None and j < num_modules - 1 and not has_aux[j]:
    raise ValueError(
        f"Strategy {strategy} needs the auxiliary loss of module {j + 1} "
        f"to train module {lo + 1} (modules counted from 1), but module "
        f"{j + 1} has no aux head. "
        f"Received: has_aux={list(has_aux)}")
