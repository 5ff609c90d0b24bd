"""One class per placement: where module k's variables and ops live.

`base.Placement` is what every placement answers (its device scopes, its
checks, its tracing and XLA choices); `devices` holds the kinds that
name one device per module ("single", "simulated", "gpu", "cluster") and
`tpu` the TPU's logical cores. `tf_interlock.placement` is the public face.
"""
