"""Research tooling: studies, benchmarks, schedule-model validation, probes.

The floor above the production binaries (`train/`): these tools run
`train.train`, read its runs and the step-time model (`step_model/`), and
write the reports under docs/results/. Nothing in `train/`, `step_model/`,
`tf_interlock/` or `layers/` imports them (tests/test_import_direction.py).
"""
