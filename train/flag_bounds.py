"""A numeric flag's help states its bounds, and the binary holds them.

A research tool's integer and float flags say in their help what they
take: "Timed calls per op cost (>= 1)", "Seconds (> 0)", "(in [0, 1])".
`error_boundary.guard` calls `out_of_bounds` before a binary's `main`, so
that a value outside them is one line naming the flag, before any work
(`--repeats=0` once ran silently for minutes). The help is the one place
the bound is written: the check reads it there, so the two cannot drift.

A bound is read from a parenthesis that opens with it, "(>= 1", "(> 0",
"(in [0, 1]" (what follows, "; at most its blocks)", is the help's
prose); a comparison elsewhere in the text ("> 1 overlaps them") is
prose, not a bound.
"""

import math
import re

from absl import flags

_NUMBER = r"(-?\d+(?:\.\d+)?)"
_AT_LEAST = re.compile(r"\((>=|>)\s*" + _NUMBER)
_RANGE = re.compile(r"\(in \[" + _NUMBER + r",\s*" + _NUMBER + r"\]")


def bounds(help_text):
  """(minimum, exclusive, maximum) that `help_text` states, or None.

  Args:
    help_text: a flag's help.

  Returns:
    None when the help states no bound; else the lower bound, whether it
    is exclusive ("> 0"), and the upper bound (None: unbounded above).
  """
  found = _RANGE.search(help_text or "")
  if found:
    return float(found.group(1)), False, float(found.group(2))
  found = _AT_LEAST.search(help_text or "")
  if found:
    return float(found.group(2)), found.group(1) == ">", None
  return None


def _numeric(flag):
  return isinstance(flag.parser, (flags.IntegerParser, flags.FloatParser))


def _allowed(minimum, exclusive, maximum):
  show = lambda x: f"{x:g}"  # 1.0 -> 1
  if maximum is not None:
    return f"in [{show(minimum)}, {show(maximum)}]"
  return f"{'>' if exclusive else '>='} {show(minimum)}"


def problem(name, flag):
  """The line refusing `flag`'s value (named `name`), or None."""
  if not _numeric(flag) or flag.value is None:
    return None
  found = bounds(flag.help)
  if found is None:
    return None
  minimum, exclusive, maximum = found
  value = flag.value
  bad = (not math.isfinite(value) or value < minimum or
         (exclusive and value == minimum) or
         (maximum is not None and value > maximum))
  if not bad:
    return None
  return (f"--{name}={value!r} is invalid: must be "
          f"{_allowed(minimum, exclusive, maximum)} (see --helpshort). "
          f"Received: {name}={value!r}")


def out_of_bounds(flag_values=None):
  """The line refusing the first numeric flag outside the bounds its help
  states, or None (all of `flag_values`, absl's global FLAGS by
  default)."""
  flag_values = flags.FLAGS if flag_values is None else flag_values
  for name in flag_values:
    line = problem(name, flag_values[name])
    if line:
      return line
  return None
