"""What a study (`research.compare`) stores, and reading it back checked.

A finished run leaves out_dir/<strategy>/seed_<seed>/result.json (its
clocks, final evaluation and curve, see `study_lib.summarize_run`) and the
study leaves out_dir/module_costs.json; both record the settings they were
made with. A rerun reuses them only when those settings agree and every
field the report needs is there with the right type, so a hand-edited or
truncated file is one line naming it, not a KeyError deep in the report.
"""

import json
import numbers

import tensorflow as tf

from train import owned_dir
from train import paths

_NUMBER = numbers.Real
# What a stored result.json / module_costs.json must hold to be reused.
RESULT_FIELDS = {"settings": dict, "seed": int, "steps": int,
                 "median_step_s": _NUMBER, "compile_s": _NUMBER,
                 "training_s": _NUMBER, "eval_s": _NUMBER, "wall_s": _NUMBER,
                 "eval": dict, "curve": list}
CURVE_FIELDS = ("step", "seconds", "value", "eval_s")
COSTS_FIELDS = {"settings": dict, "costs": list, "has_aux": list,
                "num_microbatches": int, "placement": str}


def write_json(path, value):
  """Writes `value` to `path` atomically (a reader sees old or new)."""
  paths.write_atomic(path, json.dumps(value, indent=2))


def _bad_fields(value, fields):
  """The names in `fields` ({name: type}) that `value` lacks or mistypes."""
  return [name for name, kind in fields.items()
          if not isinstance(value.get(name), kind) or
          (kind is not bool and isinstance(value.get(name), bool))]


def result_problem(result):
  """What makes a run result with `RESULT_FIELDS` unusable, or None."""
  if not result["curve"] or not all(
      isinstance(p, dict) and not _bad_fields(
          p, dict.fromkeys(CURVE_FIELDS, _NUMBER)) for p in result["curve"]):
    return f"its curve needs points with {', '.join(CURVE_FIELDS)}"
  if not result["eval"] or not all(
      isinstance(m, dict) and all(isinstance(v, _NUMBER) for v in m.values())
      for m in result["eval"].values()):
    return "its eval needs {head: {metric: number}}"
  return None


def read(path, settings, fields, check=None):
  """The stored JSON at `path` if it was made with `settings`, else None.

  Reads only.

  Args:
    path: result.json or module_costs.json.
    settings: what the stored value must have been made with.
    fields: {name: type} it must hold.
    check: optional function of the value: a problem's text, or None.

  Raises:
    ValueError: in one line naming `path`, when it is unreadable,
      incomplete or made with other settings.
  """
  if not tf.io.gfile.exists(path):
    return None
  try:  # the shared reader: FIFOs unread, nesting and shape checked
    value, problem = owned_dir.load_json(path), None
  except ValueError as e:
    value, problem = None, str(e)
  if problem is None:
    bad = _bad_fields(value, fields)
    if bad:
      problem = "lacks " + ", ".join(bad)
    else:
      problem = check(value) if check else None
  if problem:
    raise ValueError(f"{path} {problem}: not something compare can reuse; "
                     "nothing was changed: delete it to redo that part. "
                     f"Received: file={path!r}")
  if value["settings"] != settings:
    raise ValueError(f"{path} comes from other settings "
                     f"{value['settings']}; use a new --out_dir. "
                     f"Received: {settings}")
  return value
