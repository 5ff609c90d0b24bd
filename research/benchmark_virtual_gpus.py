r"""research.benchmark on K virtual GPUs carved out of one physical GPU.

  python -m research.benchmark_virtual_gpus --virtual_gpus=4 \
      --placement=gpu --num_modules=4 --json

Before TensorFlow starts, GPU 0 is split into --virtual_gpus logical GPUs
(`tf.config.set_logical_device_configuration`, each with
--virtual_gpu_memory_mb of memory), so that placement=gpu puts module k on
logical GPU k; every other flag is research.benchmark's. Used by
`research.device_check`: device configuration is fixed per process.
"""

# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

from absl import app
from absl import flags
import tensorflow as tf

from research import benchmark
from train import error_boundary

_VIRTUAL_GPUS = flags.DEFINE_integer(
    "virtual_gpus", None, "Logical GPUs (>= 1) to carve out of physical "
    "GPU 0 before TensorFlow starts (required).")
_MEMORY_MB = flags.DEFINE_integer(
    "virtual_gpu_memory_mb", 4096, "Memory of each logical GPU, in MiB "
    "(>= 1); all of them must fit on GPU 0.")


def configure_virtual_gpus(count, memory_mb):
  """Splits GPU 0 into `count` logical GPUs; their names.

  Raises:
    ValueError: no GPU, or a count or memory below 1.
  """
  gpus = tf.config.list_physical_devices("GPU")
  if not gpus:
    raise ValueError(f"--virtual_gpus needs a GPU; this machine has none. "
                     f"Received: virtual_gpus={count}")
  for name, value in (("virtual_gpus", count),
                      ("virtual_gpu_memory_mb", memory_mb)):
    if value is None or value < 1:
      raise ValueError(f"--{name} must be an integer >= 1. "
                       f"Received: {name}={value}")
  tf.config.set_logical_device_configuration(
      gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)]
      * count)
  return [d.name for d in tf.config.list_logical_devices("GPU")]


@error_boundary.guard()
def main(argv):
  devices = configure_virtual_gpus(_VIRTUAL_GPUS.value, _MEMORY_MB.value)
  if len(devices) < _VIRTUAL_GPUS.value:
    raise ValueError(f"asked for {_VIRTUAL_GPUS.value} logical GPUs, got "
                     f"{devices}. Received: virtual_gpus={_VIRTUAL_GPUS.value}")
  benchmark.main(argv)


if __name__ == "__main__":
  app.run(main)
