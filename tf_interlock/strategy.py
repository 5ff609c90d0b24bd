"""The training strategy as one value: the interlocking window n.

Interlocking backpropagation (Gomez et al., 2022, arXiv:2010.04116, Sec. 3)
is a family indexed by one integer, the window n >= 1, over K modules:

* n = 1: local learning; module k is trained by its own auxiliary loss.
* n = 2: pairwise interlocking; module k is trained by the loss of module
  k + 1 (carried back through module k + 1).
* 1 < n < K: n-wise interlocking; module k is trained by the loss n - 1
  modules ahead.
* n >= K: end-to-end backpropagation; every module is trained by the final
  loss.

The variant picks which losses of the window train module k: "only" (the
released implementation's rule) uses L_target(k) alone, "sum" uses
L_k + ... + L_target(k). With n >= K both variants are end-to-end: auxiliary
heads are then probes that never touch the main weights.
"""

import dataclasses
import re
from typing import Optional

from tf_interlock import int_args

VARIANTS = ("only", "sum")
_NWISE = re.compile(r"^(\d+)wise$")
_ALLOWED = "'e2e', 'local', 'pairwise' or 'Nwise' (N >= 1, e.g. '2wise')"


@dataclasses.dataclass(frozen=True)
class InterlockStrategy:
  """An interlocking window and variant.

  Attributes:
    window: n >= 1, or None for end-to-end whatever the number of modules.
    variant: "only" (default) or "sum".
  """
  window: Optional[int] = None
  variant: str = "only"

  def __post_init__(self):
    if self.window is not None:
      if not int_args.is_int(self.window):
        raise TypeError(
            f"window must be an int >= 1 or None (end-to-end). "
            f"Received: window={self.window!r}")
      # Frozen: a numpy window is kept as the Python int it equals.
      object.__setattr__(self, "window", int(self.window))
      if self.window < 1:
        raise ValueError(
            f"window must be >= 1 (1 = local, 2 = pairwise, None = "
            f"end-to-end). Received: window={self.window}")
    if self.variant not in VARIANTS:
      raise ValueError(
          f"variant must be one of {VARIANTS}. "
          f"Received: variant={self.variant!r}")

  def effective_window(self, num_modules):
    """min(n, K): the window actually used with `num_modules` modules."""
    if num_modules < 1:
      raise ValueError(
          f"num_modules must be >= 1. Received: num_modules={num_modules}")
    if self.window is None:
      return num_modules
    return min(self.window, num_modules)

  def target(self, k, num_modules):
    """target(k) = min(k + n - 1, K - 1), with 0-based module index k."""
    return min(k + self.effective_window(num_modules) - 1, num_modules - 1)

  def routing_plan(self, num_modules, has_aux):
    """A plan of this strategy's own, or None for the window rule.

    `routing.make_plan` builds every plan from `target(k)` and the
    variant; a subclass with another rule (e.g. a window n_k per module)
    returns its own `routing.RoutingPlan` here, and everything that trains
    reads only that plan.

    Args:
      num_modules: K.
      has_aux: per module, whether it has an aux head.
    """
    del num_modules, has_aux
    return None

  @property
  def name(self):
    if self.window is None:
      return "e2e"
    base = {1: "local", 2: "2wise"}.get(self.window, f"{self.window}wise")
    return base if self.variant == "only" or self.window == 1 else (
        f"{base}-{self.variant}")

  def __str__(self):
    return self.name


def parse_strategy(spec, variant=None):
  """Parses 'e2e', 'local', 'pairwise' or 'Nwise', with an optional variant.

  A variant may also be given as a suffix: '2wise-sum', '3wise:only'.

  Args:
    spec: the strategy string, an int window, or an `InterlockStrategy`.
    variant: "only" or "sum", or None (the suffix's, else "only"). Given
      with a different suffix it is refused, not silently preferred.

  Returns:
    An `InterlockStrategy`.

  Raises:
    ValueError: for an unknown strategy string or variant, or a suffix and
      a variant that disagree.
  """
  if isinstance(spec, InterlockStrategy):
    if variant is None:
      return spec
    return InterlockStrategy(spec.window, variant)
  if int_args.is_int(spec):
    return InterlockStrategy(int(spec), variant or "only")
  if not isinstance(spec, str):
    raise ValueError(
        f"strategy must be {_ALLOWED}. Received: strategy={spec!r}")
  text = spec.strip().lower()
  window = _parse_window(text)
  suffix = None
  if window is None:
    for sep in ("-", ":"):
      if sep in text:
        base, suffix = text.split(sep, 1)
        window = _parse_window(base)
        break
  if window is None:
    # The name itself is misspelled (e.g. '2-wise'): say how to spell it.
    hint = "" if _parse_window(re.sub(r"[-_: ]", "", text)) is None else (
        f" (did you mean {re.sub(r'[-_: ]', '', text)!r}?)")
    raise ValueError(
        f"strategy must be {_ALLOWED}, optionally followed by a variant "
        f"'-only' or '-sum' (e.g. '2wise-sum'){hint}. "
        f"Received: strategy={spec!r}")
  if suffix is not None and suffix not in VARIANTS:
    raise ValueError(
        f"strategy variant must be one of {VARIANTS}. "
        f"Received: strategy={spec!r}")
  if suffix is not None and variant is not None and variant != suffix:
    raise ValueError(
        f"strategy {spec!r} names variant {suffix!r} but variant={variant!r} "
        f"was also given; give one of them, or the same. "
        f"Received: strategy={spec!r}, variant={variant!r}")
  return InterlockStrategy(window.window, variant or suffix or "only")


def _parse_window(text):
  """'e2e', 'local', 'pairwise', 'Nwise' -> an `InterlockStrategy`, or None.

  The variant of the result is a placeholder; `parse_strategy` sets it.
  """
  named = {"e2e": None, "local": 1, "pairwise": 2}
  if text in named:
    return InterlockStrategy(named[text])
  match = _NWISE.match(text)
  if match and int(match.group(1)) >= 1:
    return InterlockStrategy(int(match.group(1)))
  return None
