"""Fixed-budget outcomes from learning curves and step times (pure Python).

Accuracy per step does not depend on the hardware; the time a step takes
does. A study therefore measures, per strategy and seed, the metric at evenly
spaced training steps, and separately each strategy's step time: measured on
this machine, and predicted by the schedule model (`step_model.schedule`)
with one device per module. Putting a step curve on a time axis,
seconds(step) = step * step_time, answers the two questions of Gomez et al.
(2022, arXiv:2010.04116, Sec. 5): which metric does a strategy reach within a
wall-clock budget, and how long does it need to reach a target metric.

Curves are lists of points (step, seconds, value). Seeds are aggregated per
step: the mean seconds and the mean, min and max of the metric (the band).
Between two evaluations the metric is interpolated linearly.
"""

import math
from typing import List, NamedTuple, Optional, Sequence, Tuple

# Agreement of floating-point times that should be equal (a budget that is
# the last point of a curve, summed in another order).
_REL_TOL = 1e-9


class Band(NamedTuple):
  """Mean and min-max range of one quantity over seeds."""
  mean: float
  min: float
  max: float


class CurvePoint(NamedTuple):
  """One evaluation step aggregated over seeds."""
  step: int
  seconds: float  # mean over seeds
  value: Band


def band(values: Sequence[float]) -> Band:
  """Mean, min and max of `values` (one per seed).

  Raises:
    ValueError: for no values or a non-finite one.
  """
  values = [float(v) for v in values]
  if not values or not all(math.isfinite(v) for v in values):
    raise ValueError(f"band needs finite values, one per seed. "
                     f"Received: values={values!r}")
  return Band(sum(values) / len(values), min(values), max(values))


def aggregate(curves: Sequence[Sequence[Tuple[int, float, float]]]
              ) -> List[CurvePoint]:
  """Aggregates per-seed curves that were evaluated at the same steps.

  Args:
    curves: one curve per seed, each a list of (step, seconds, value) in
      step order.

  Returns:
    One `CurvePoint` per step: mean seconds and the band of the values.

  Raises:
    ValueError: no curves, or curves evaluated at different steps.
  """
  if not curves:
    raise ValueError("aggregate needs one curve per seed. Received: curves=[]")
  steps = [p[0] for p in curves[0]]
  for i, curve in enumerate(curves):
    if [p[0] for p in curve] != steps:
      raise ValueError(
          f"every seed must be evaluated at the same steps; seed 0 at "
          f"{steps}. Received: curves[{i}] steps={[p[0] for p in curve]}")
  return [CurvePoint(step, band([c[j][1] for c in curves]).mean,
                     band([c[j][2] for c in curves]))
          for j, step in enumerate(steps)]


def interpolate(xs: Sequence[float], ys: Sequence[float],
                x: float) -> Optional[float]:
  """ys at x, linear between neighbouring points; None outside [x0, xn].

  Nothing is known about the metric before the first evaluation or after
  the last one, so those are None, not extrapolated.
  """
  if not xs:
    return None
  tolerance = _REL_TOL * max(1.0, abs(xs[-1]))
  if x < xs[0] - tolerance or x > xs[-1] + tolerance:
    return None
  for j in range(len(xs)):
    if abs(x - xs[j]) <= tolerance:
      return ys[j]
    if x < xs[j]:
      fraction = (x - xs[j - 1]) / (xs[j] - xs[j - 1])
      return ys[j - 1] + fraction * (ys[j] - ys[j - 1])
  return ys[-1]


def time_to_target(xs: Sequence[float], ys: Sequence[float], target: float,
                   higher_is_better: bool) -> Optional[float]:
  """The first x at which the curve reaches `target`; None if it never does.

  Between the last point short of the target and the first point that
  reaches it the crossing is linear; a curve whose first evaluation already
  reaches the target gives that evaluation's x (earlier is unknown).
  """
  sign = 1.0 if higher_is_better else -1.0
  for j, (x, y) in enumerate(zip(xs, ys)):
    if sign * (y - target) >= 0:
      if j == 0:
        return x
      fraction = (target - ys[j - 1]) / (y - ys[j - 1])
      return xs[j - 1] + fraction * (x - xs[j - 1])
  return None


def outcome(points: Sequence[CurvePoint], seconds: Sequence[float],
            budget_s: float, target: Optional[float],
            higher_is_better: bool) -> dict:
  """What a strategy reaches within `budget_s`, and when it reaches target.

  Args:
    points: the aggregated curve (`aggregate`).
    seconds: the time axis of the points: the measured mean seconds, or
      step * predicted step time.
    budget_s: the wall-clock budget.
    target: the metric to reach, or None.
    higher_is_better: True for accuracy, False for perplexity.

  Returns:
    {"metric_at_budget": Band or None (budget outside the curve),
     "time_to_target_s": float or None (not reached, or no target)}.
  """
  at_budget = [interpolate(seconds, [p.value[i] for p in points], budget_s)
               for i in range(3)]
  return {
      "metric_at_budget": None if at_budget[0] is None else Band(*at_budget),
      "time_to_target_s": None if target is None else time_to_target(
          seconds, [p.value.mean for p in points], target, higher_is_better),
  }


def predicted_seconds(points: Sequence[CurvePoint],
                      step_time_s: float) -> List[float]:
  """The time axis of a curve whose steps each take `step_time_s`."""
  if not step_time_s > 0:
    raise ValueError(f"step_time_s must be > 0. "
                     f"Received: step_time_s={step_time_s!r}")
  return [p.step * step_time_s for p in points]
