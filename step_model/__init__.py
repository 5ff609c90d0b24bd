"""step_model: the step-time model of interlocking training and its profiling.

This package models the training library (`tf_interlock`); it is not part
of it. It predicts how long one training step of each strategy takes from
measured per-module op costs, and holds the measurements that feed and check
that prediction:

* `schedule`: the list-scheduling model (`simulate`, `ModuleCost`).
* `profiling`: times each module's forward, VJPs, aux head and update on its
  device (through `module_ops`, one module's loss and VJPs on the engine's
  public methods).
* `threading_plan`: how many logical devices, threads and modules per device
  a simulated placement runs on a host's cores.
* `transfer`: the link probe (seconds per byte between two devices).
* `projection`: step times with one core per module from a study's costs.
* `representation`: feature statistics that tell a collapsed module.

Floors (tests/test_import_direction.py): this package sits above
`tf_interlock` and `layers`, and uses only their public names
(tests/test_private_access.py); `research/` imports its modules; `train/`
imports the package alone, for the one choice a binary makes before it can
measure: its CPU threading plan (`plan_for`, `host_cores`, `use_own_pools`). It is not
installed by `pip install .` (pyproject.toml): it runs from a checkout.
"""

from step_model.threading_plan import ThreadingPlan
from step_model.threading_plan import host_cores
from step_model.threading_plan import plan_for
from step_model.threading_plan import use_own_pools

__all__ = ["ThreadingPlan", "host_cores", "plan_for", "use_own_pools"]
