"""Every check a run can make before it writes anything.

`config.validate` reads the `Config` alone; `validate_for_run` adds what
needs this machine: its replicas and GPUs, the TPU's name, the prepared
data and the sizes of its splits.
"""

from train.data import images
from train import config as config_lib
from train import datasets
from train import distribution
from train import optimization
from train import runtime_setup


def validate_for_run(config):
  """Every check a run can make before it writes anything.

  `config.validate` with the replica count of this machine, then (after
  `runtime_setup.setup_runtime`, which it calls) the checks that need the
  data or the TPU's name: --tpu resolves, prepared image files are whole,
  the evaluation split holds at least one full batch, the training split
  too (text: a packed batch of batch_size x (seq_len + 1) tokens), and
  --epochs gives at least one step, and --profile_steps lies in the run.

  Args:
    config: the `Config` of the run.

  Raises:
    ValueError: one line naming the flag, its value and what is allowed.
  """
  config_lib.validate(config, distribution.num_replicas(config) or 1)
  check_profile_steps(config, config.run.train_steps)
  # Counting a corpus's tokens runs TF ops, which start the runtime: the
  # process-wide settings come first (setup_runtime may run again later).
  runtime_setup.setup_runtime(config)
  runtime = config_lib.runtime_of(config)
  if runtime.needs_tpu:
    distribution.resolve_tpu(config)
  missing = runtime.missing_devices(config.interlock.num_modules)
  if missing:
    config_lib.fail("placement", config.devices.placement, missing)
  if config.data.dataset in config_lib.IMAGE_DATASETS:
    images.check_prepared_dataset(config.data.dataset, data_dir=config.data.data_dir,
                                  source_dir=config.data.source_dir)
  train_size, eval_size = datasets.split_sizes(config)
  unit = "sequences of seq_len + 1 tokens" if config.is_text else "examples"
  for split, size in (("training", train_size), ("evaluation", eval_size)):
    if size < config.run.batch_size:
      flag = "seq_len" if config.is_text and size else "batch_size"
      config_lib.fail(flag, config.get(flag),
                      f"the {split} split of {config.data.dataset} holds {size} "
                      f"{unit}, fewer than one batch of {config.run.batch_size}")
  steps = optimization.total_steps(config, train_size)
  check_profile_steps(config, steps)
  if steps is not None and config.optim.warmup_steps >= steps:
    config_lib.fail("warmup_steps", config.optim.warmup_steps,
                    f"must be < the run's {steps} steps")


def check_profile_steps(config, total_steps):
  """Refuses a --profile_steps that is not FIRST,LAST with 1 <= FIRST <=
  LAST <= total_steps (None: the run's length is not known yet)."""
  steps = config.run.profile_steps
  if steps is None:
    return
  text = ",".join(map(str, steps))
  if len(steps) != 2:
    config_lib.fail("profile_steps", text, "must be two steps FIRST,LAST")
  first, last = steps
  if first < 1 or last < first:
    config_lib.fail("profile_steps", text,
                    "must be FIRST,LAST with 1 <= FIRST <= LAST")
  if total_steps is not None and last > total_steps:
    config_lib.fail("profile_steps", text,
                    f"LAST must be at most {total_steps}, the run's last step")
