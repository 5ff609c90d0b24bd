"""What every registered placement must answer, checked entry by entry.

`tests/test_placement.py` and `tests/test_extensions.py` apply these rules
to each registered entry,
so a placement added later is checked without any list here being edited;
the built-in placements' own answers are spot checks beside them.
"""

# What only the binaries set up before the runtime starts (their strategy,
# devices, cluster or TPU): train/placement_runtime.py, not the library.
RUNTIME_ONLY = ("prepare_runtime", "configure_devices", "missing_devices",
                "strategy", "splits_host_cpu", "needs_cluster", "needs_tpu",
                "loop_on_host", "data_parallel", "traced",
                "one_device_per_module")


# What the built-in placements answer (a placement registered later is
# checked by the same rules below, not listed here).
BUILT_IN_ANSWERS = {"single": (True, "replica_step", None),
                    "simulated": (True, "module", "CPU"),
                    "gpu": (True, "module", "GPU"),
                    "tpu": (False, None, None),
                    "cluster": (False, "module", None)}


def check_trainer_questions(cls):
  """The rules every registered placement class keeps: it answers the
  trainer's questions with values the trainer knows, and carries nothing
  that only the binaries set up."""
  assert [a for a in RUNTIME_ONLY if hasattr(cls, a)] == [], cls.kind
  assert isinstance(cls.one_process, bool), cls.kind
  assert cls.xla_unit in ("module", "replica_step", None), cls.kind
  assert cls.replica_device_type in ("CPU", "GPU", None), cls.kind
  # A replica pinned to local device k needs module k in this process.
  assert cls.replica_device_type is None or cls.one_process, cls.kind
