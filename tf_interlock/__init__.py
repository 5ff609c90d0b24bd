"""tf_interlock: depthwise model-parallel training with interlocking backprop.

The public front door (Gomez et al., 2022, arXiv:2010.04116)::

  import tf_interlock as ti
  ti.placement.configure_simulated_devices(3)   # before any tensor exists
  model = ti.InterlockModel(ti.from_keras(keras_model, 3), strategy="2wise",
                            placement="simulated")

* `InterlockModel`: K modules trained with Keras's `compile`/`fit`.
* `from_keras`: splits a Sequential or functional Keras model into modules.
* `SequenceAuxHead`, `ConvAuxHead`: aux heads for sequences (LayerNorm, then
  a projection at every position) and image features.
* `InterlockModule`: one module (body, optional aux head, input cut).
* `InterlockTrainer`: the same training as a plain loop (`train_loop`).
* `TrainingOptions`: every training setting (strategy, steps per call,
  microbatches, XLA, recompute, memory_lean, execution) as one frozen value,
  given to `InterlockTrainer(options=)` or `InterlockModel(options=)`.
* `ExecutionOptions`: how the training calls run their steps (loop kind,
  graph optimisation, per-module functions, tf.data autotuning): the
  `execution` field of `TrainingOptions`, or
  `InterlockModel.compile(execution_options=)`.
* `placement`: where module k lives (`make_placement`,
  `configure_simulated_devices`).

Importing the package registers every Keras class a saved `.keras` model of
this library can contain (the model, its modules, `from_keras`'s segments,
the aux heads and the ready-made ResNet and Transformer blocks), so
`keras.models.load_model` works after `import tf_interlock` alone.
"""

# Imports run one way: tf_interlock builds on layers (the modules, heads,
# blocks and the partition of a stack); nothing in layers imports
# tf_interlock. The ready-made networks are imported for their registered
# classes, so a saved model that holds them loads.
# pylint: disable=unused-import
import os as _os

import layers as _layers

# `layers` is a generic top-level name; ours is installed next to this
# package (pip and a checkout alike). Another project's `layers` earlier on
# sys.path would otherwise fail later, far from the cause.
if (_os.path.dirname(_os.path.dirname(_os.path.abspath(_layers.__file__)))
    != _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))):
  raise ImportError(
      "tf_interlock needs its own `layers` package, installed beside it; "
      "another one comes first on sys.path. Received: "
      f"layers={_os.path.dirname(_os.path.abspath(_layers.__file__))}")

import layers.aux_heads  # noqa: F401
import layers.resnet  # noqa: F401
import layers.transformer  # noqa: F401
from layers.aux_heads import ConvAuxHead
from layers.aux_heads import SequenceAuxHead
from layers.interlock_module import InterlockModule
from tf_interlock.keras import callbacks
from tf_interlock.keras import fit_checks
from tf_interlock import placement
from tf_interlock.execution_options import ExecutionOptions
from tf_interlock.keras.model import InterlockModel
from tf_interlock.keras.split import KerasSegment
from tf_interlock.keras.split import from_keras
from tf_interlock.trainer import InterlockTrainer
from tf_interlock.training_options import TrainingOptions

__all__ = ["ConvAuxHead", "ExecutionOptions", "InterlockModel",
           "InterlockModule", "InterlockTrainer", "KerasSegment",
           "SequenceAuxHead", "TrainingOptions", "from_keras", "placement"]
