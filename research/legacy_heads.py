"""Results of older studies read in today's names (`metric_names`).

Results written before the "module_{k}" scheme named the exits "exit_{k}"
and the network's head "final"; the study tools read such files with
`canonical_heads`.
"""

import re

from tf_interlock import metric_names

_LEGACY_EXIT = re.compile(r"^exit_([1-9]\d*)$")
LEGACY_FINAL = "final"


def canonical_heads(results, num_modules=None):
  """`results` ({head: value}) with every head named "module_{k}".

  Reads results of either scheme: an older file's "exit_{k}" is module k's
  exit and its "final" the network's, module K.

  Args:
    results: {head: value}, heads "module_k", or "exit_k" and "final".
    num_modules: K, when known; else an older "final" is taken to follow
      the deepest head listed (its module K - 1 had an exit).

  Returns:
    A new dict in depth order, module 1 first.

  Raises:
    ValueError: for a head name of neither scheme.
  """
  named = {}
  for head, value in results.items():
    legacy = _LEGACY_EXIT.match(head)
    if legacy is not None:
      head = metric_names.module_name(int(legacy.group(1)) - 1)
    elif head != LEGACY_FINAL:
      metric_names.head_index(head)  # raises for a name of neither scheme
    named[head] = value
  if LEGACY_FINAL in named:
    depths = [metric_names.head_index(h) + 1
              for h in named if h != LEGACY_FINAL]
    last = num_modules or 1 + max(depths, default=0)
    named[metric_names.module_name(last - 1)] = named.pop(LEGACY_FINAL)
  return dict(sorted(named.items(),
                     key=lambda kv: metric_names.head_index(kv[0])))
