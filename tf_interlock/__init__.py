"""tf_interlock: depthwise model-parallel training with interlocking backprop.

The public front door (Gomez et al., 2022, arXiv:2010.04116)::

  import tf_interlock as ti
  ti.placement.configure_simulated_devices(3)   # before any tensor exists
  model = ti.InterlockModel(ti.from_keras(keras_model, 3), strategy="2wise",
                            placement="simulated")

* `InterlockModel`: K modules trained with Keras's `compile`/`fit`.
* `from_keras`: splits a Sequential or functional Keras model into modules.
* `InterlockModule`: one module (body, optional aux head, input cut).
* `InterlockTrainer`: the same training as a plain loop (`train_loop`).
* `placement`: where module k lives (`make_placement`,
  `configure_simulated_devices`).

Importing the package registers every Keras class a saved `.keras` model of
this library can contain (the model, its modules, `from_keras`'s segments,
the aux heads and the ready-made ResNet and Transformer blocks), so
`keras.models.load_model` works after `import tf_interlock` alone.
"""

import sys

from layers.interlock_module import InterlockModule
from tf_interlock import placement
from tf_interlock.keras_model import InterlockModel
from tf_interlock.keras_split import KerasSegment
from tf_interlock.keras_split import from_keras
from tf_interlock.trainer import InterlockTrainer


def _register_layer_classes():
  """Imports the layer modules whose classes a saved model may hold.

  `layers.common` imports `tf_interlock.partition`, so when a program's first
  import is a `layers` module, this package is initialised in the middle of
  that import and the layer modules cannot be imported yet (Python raises
  ImportError for the half-initialised module). They then register their
  classes themselves as the program's own import completes. Any other
  ImportError (a missing dependency, another project's `layers` package
  ahead of ours on sys.path) is raised: swallowing it would leave the
  classes unregistered and `load_model` failing far from the cause.
  """
  try:
    # pylint: disable=g-import-not-at-top,unused-import,import-outside-toplevel
    import layers.aux_heads  # noqa: F401
    import layers.resnet  # noqa: F401
    import layers.transformer  # noqa: F401
  except ImportError as error:
    # The circular case only: the module it names is still being imported
    # (importlib marks its spec `_initializing` until the import returns).
    module = sys.modules.get(error.name or "")
    if not getattr(getattr(module, "__spec__", None), "_initializing", False):
      raise


_register_layer_classes()

__all__ = ["InterlockModel", "InterlockModule", "InterlockTrainer",
           "KerasSegment", "from_keras", "placement"]
