"""Process-wide runtime settings of a run, and the device each module gets.

Everything here must be decided before the first TF op: the logical CPU
devices and thread pools of a simulated placement, joining a multi-worker
job, determinism, seeds and the mixed-precision policy.
"""

import keras
import tensorflow as tf

from tf_interlock import cluster as cluster_lib
from tf_interlock import strategy as strategy_lib
import step_model
from train import config as config_lib
from train import multi_worker


def simulated_plan(config):
  """The `ThreadingPlan` of a placement that splits the host CPU (its
  runtime's `splits_host_cpu`: "simulated"): logical devices, threads per
  op, and which device each module is on.

  A field set to 0 is chosen by the schedule model from nominal module costs
  for this host's cores (`step_model.plan_for`); the default, 1 and 1,
  is one device of one thread per module.
  """
  return step_model.plan_for(
      config.interlock.num_modules,
      strategy_lib.parse_strategy(config.interlock.strategy, config.interlock.variant),
      step_model.host_cores(),
      threads_per_device=config.devices.threads_per_device or None,
      modules_per_device=config.devices.modules_per_device or None)


def setup_runtime(config):
  """Process-wide settings; must run before the first TF op.

  A task of a multi-worker job (TF_CONFIG, see train/multi_worker.py) joins
  it first: collective ops must be configured before the runtime starts.
  """
  runtime = config_lib.runtime_of(config)
  plan = simulated_plan(config) if runtime.splits_host_cpu else None
  joined = multi_worker.join(config, plan.threads_per_device if plan else 1)
  if plan and not joined:
    # Each device a pool of its own: D x t threads, as the plan says.
    step_model.use_own_pools(plan)
    runtime.configure_devices(plan.num_devices,
                              intra_op_threads=plan.threads_per_device)
  if config.run.deterministic:
    tf.config.experimental.enable_op_determinism()
  seed(config)
  keras.mixed_precision.set_global_policy(
      "mixed_bfloat16" if config.devices.mixed_precision == "bfloat16" else "float32")


def seed(config):
  """Seeds Python's `random`, NumPy's, TF's global seed and Keras's seed
  generator with --seed.

  `setup_runtime` seeds first; the run seeds again just before it makes
  its layers (`train_lib.build`), so that the initial weights depend on
  --seed alone and not on what the data step drew before (see there).
  """
  keras.utils.set_random_seed(config.run.seed)


def module_devices(config):
  """Per module, the index of its device: the threading plan's logical CPU
  (a placement that splits the host CPU: simulated), its worker task t(k)
  (one that needs a cluster), else None (module k on device k)."""
  runtime = config_lib.runtime_of(config)
  if runtime.splits_host_cpu:
    return simulated_plan(config).module_devices
  if runtime.needs_cluster:
    spec = cluster_lib.cluster_spec(config.devices.cluster)
    return cluster_lib.module_workers(
        config.interlock.num_modules, spec.num_tasks(cluster_lib.JOB),
        config.devices.modules_per_worker)
  return None
