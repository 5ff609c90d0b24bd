"""TF's private names live in tf_interlock/tf_private.py and do what its
docstrings say on the installed TF; no file of our packages but the adapters
touches another library's private name (a scan of every file's syntax tree).
"""

import ast
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from tests import ast_scan
from tests import helpers
from tests.binaries import ROOT
from tf_interlock import placement as placement_lib
from tf_interlock import tf_private
from tf_interlock.execution_options import ExecutionOptions
from tf_interlock.trainer import InterlockTrainer


def test_checked_tf_version():
  assert tf.__version__ in tf_private.CHECKED_TF_VERSIONS, (
      f"tf_interlock/tf_private.py was checked against TF "
      f"{tf_private.CHECKED_TF_VERSIONS}; installed: {tf.__version__}. "
      f"Re-read the private names it uses and update the list.")


def _call_config(light):
  """The ConfigProto a call op gets when made inside (or outside) the
  block."""
  inner = tf.function(lambda x: x * 2.0)

  def outer(x):
    if light:
      with tf_private.light_graph_optimization():
        return inner(x)
    return inner(x)

  graph = tf.function(outer).get_concrete_function(
      tf.TensorSpec([], tf.float32)).graph
  calls = [op for op in graph.get_operations()
           if op.type.endswith("PartitionedCall")]
  assert len(calls) == 1
  config = config_pb2.ConfigProto()
  config.ParseFromString(calls[0].get_attr("config_proto"))
  return config.graph_options.rewrite_options


def test_light_settings_reach_the_calls_in_the_block_only():
  light = _call_config(True)
  assert light.disable_tfg_optimizer
  assert light.meta_optimizer_iterations == light.ONE
  assert light.layout_optimizer == light.OFF
  assert light.memory_optimization == light.NO_MEM_OPT
  # After the block, and without it, calls keep the process's settings.
  for rewrites in (_call_config(False), _call_config(False)):
    assert not rewrites.disable_tfg_optimizer
    assert rewrites.meta_optimizer_iterations == rewrites.DEFAULT_NUM_ITERS


def test_light_trainer_trains_like_the_default(monkeypatch):
  used = []
  light = tf_private.light_rewrites
  monkeypatch.setattr(tf_private, "light_rewrites",
                      lambda r: (used.append(1), light(r)))
  x, y = helpers.batch(size=8)
  runs = []
  for optimization in ("default", "light"):
    trainer = InterlockTrainer(
        helpers.mlp_modules(2, batch_norm=True),
        lambda k: keras.optimizers.Adam(0.01), "2wise",
        loss_fn=helpers.cross_entropy,
        placement=placement_lib.make_placement("simulated", 2),
        steps_per_loop=4,
        options=ExecutionOptions(graph_optimization=optimization))
    trainer.build(x)
    iterator = iter(trainer.distribute_dataset(helpers.repeat_dataset(x, y)))
    runs.append(([trainer.train_loop(iterator) for _ in range(2)],
                 helpers.weights(trainer.modules)))
  assert used  # the light run went through the adapter
  for a, b in zip(runs[1][1], runs[0][1]):  # the weights: bit for bit
    np.testing.assert_array_equal(a, b)
  # The means reported may differ in the last bit (seen: one float32 ulp):
  # the passes left on round a sum differently in the two graphs.
  for a, b in zip(runs[1][0], runs[0][0]):
    assert a.keys() == b.keys()
    np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a],
                               rtol=3e-7)


# The adapters: the only files that may touch another library's private
# names (TF's, Keras's, the Python runtime's).
ADAPTERS = (os.path.join("tf_interlock", "tf_private.py"),
            os.path.join("tf_interlock", "keras_private.py"),
            os.path.join("train", "python_private.py"))
SCANNED = ("tf_interlock", "layers", "step_model", "train", "research")
# Underscore names Python documents as public: `os._exit` and the methods
# and fields of a `collections.namedtuple`.
DOCUMENTED = {("os", "_exit")} | {
    (None, name) for name in ("_asdict", "_replace", "_fields", "_make",
                              "_field_defaults")}
# What a library keeps private under a public module: TF's implementation
# (`tensorflow.python`, its protocol buffers in `tensorflow.core`, ...) and
# Keras's (`keras.src`); tf.* and keras.* are the public API.
PRIVATE_MODULES = {"tensorflow": ("python", "core", "tsl", "compiler",
                                  "__internal__"),
                   "keras": ("src",)}


def _private_module(name):
  """Whether a dotted module name lies in a library's private part."""
  top, _, rest = name.partition(".")
  return rest.split(".")[0] in PRIVATE_MODULES.get(top, ())


def _imports(tree):
  """{local name: module} bound by the file's imports (`import x as y`,
  `from x import y`), and 'line: module' for each private module imported."""
  bound, private = {}, []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        bound[alias.asname or alias.name.split(".")[0]] = (
            alias.name if alias.asname else alias.name.split(".")[0])
        if _private_module(alias.name):
          private.append(f"{node.lineno}: imports {alias.name}")
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        bound[alias.asname or alias.name] = full
        if _private_module(node.module) or _private_module(full):
          private.append(f"{node.lineno}: imports {full}")
  return bound, private


def _stamped(tree):
  """Private names the file itself sets on another object
  (`setattr(x, "_n", v)`, `object.__setattr__(x, "_n", v)`): its own."""
  return {name for node in ast.walk(tree)
          if (name := ast_scan.set_name(node)) is not None}


def _named(node):
  """(object, private name) of `x._name` or `getattr(x, "_name")` (also
  hasattr, setattr, delattr), else (None, None)."""
  if isinstance(node, ast.Attribute):
    return node.value, node.attr
  if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
      node.func.id in ("getattr", "hasattr", "setattr", "delattr") and
      len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and
      isinstance(node.args[1].value, str)):
    return node.args[0], node.args[1].value
  return None, None


def private_uses(path, source):
  """'path:line: what' for each private name of another library that a
  file's source touches.

  Flagged: an import of `tensorflow.python`, `tensorflow.core`,
  `tensorflow.tsl`, `keras.src` (...); `tf.__internal__`, `keras.src` as
  attributes; and `x._name` or `getattr(x, "_name")` (a leading underscore,
  not a dunder) unless x is `self` or `cls`, a module or name imported from
  our own packages, or a class or function the file defines, or the file
  sets `_name` on objects itself. Python's documented underscore names
  (`os._exit`, a namedtuple's `_asdict`) are public.
  """
  tree = ast.parse(source, path)
  bound, found = _imports(tree)
  found = [f"{path}:{line}" for line in found]
  ours = {name for name, module in bound.items()
          if module.split(".")[0] in SCANNED}
  ours |= {node.name for node in tree.body
           if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
  ours |= {"self", "cls"}
  stamped = _stamped(tree)
  for node in ast.walk(tree):
    obj, name = _named(node)
    if obj is None:
      continue
    root = obj
    while isinstance(root, ast.Attribute):
      root = root.value
    root = root.id if isinstance(root, ast.Name) else None
    library = bound.get(root, "").split(".")[0]
    if isinstance(obj, ast.Name) and library in PRIVATE_MODULES and (
        name in PRIVATE_MODULES[library]):
      found.append(f"{path}:{node.lineno}: {root}.{name}")
    elif not ast_scan.is_private(name) or root in ours or (
        name in stamped):
      continue
    elif (root, name) not in DOCUMENTED and (None, name) not in DOCUMENTED:
      found.append(f"{path}:{node.lineno}: {root or '(...)'}.{name}")
  return found


def test_no_file_but_the_adapters_touches_a_private_name():
  found = []
  for path, _ in ast_scan.parsed_files(ROOT, SCANNED):
    if path not in ADAPTERS:
      with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        found += private_uses(path, f.read())
  assert found == [], (
      f"Private names of TF, Keras or Python outside the adapters "
      f"{ADAPTERS}: wrap each in a function there. Received: {found}")


@pytest.mark.parametrize("source,expected", [
    ("from tensorflow.python.eager import context\n",
     "1: imports tensorflow.python.eager.context"),
    ("import tensorflow.python.framework.config as c\n",
     "1: imports tensorflow.python.framework.config"),
    ("from tensorflow.core.protobuf import config_pb2\n",
     "1: imports tensorflow.core.protobuf.config_pb2"),
    ("from tensorflow import python\n", "1: imports tensorflow.python"),
    ("from keras.src.saving import saving_lib\n",
     "1: imports keras.src.saving.saving_lib"),
    ("import tensorflow as tf\nx = tf.__internal__.nest\n",
     "2: tf.__internal__"),
    ("import keras\nx = keras.src.saving\n", "2: keras.src"),
    ("def f(model):\n  return model._loss_fn\n", "2: model._loss_fn"),
    ("def f(model):\n  return model.trainer._step\n", "2: model._step"),
    ("def f(f):\n  return f()._function\n", "2: (...)._function"),
    ("def f(t):\n  return getattr(t, '_keras_history', None)\n",
     "2: t._keras_history"),
    ("import atexit\natexit._run_exitfuncs()\n",
     "2: atexit._run_exitfuncs"),
])
def test_the_scan_sees_a_planted_private_name(source, expected):
  assert private_uses("train/bad.py", source) == [f"train/bad.py:{expected}"]


def test_the_scan_allows_public_and_our_own_names():
  source = (
      "import os\nimport collections\nimport tensorflow as tf\n"
      "from tf_interlock import engine\nfrom layers.common import Block\n\n"
      "class Mine:\n  def __init__(self):\n    self._x = 1\n"
      "  @classmethod\n  def make(cls):\n    return cls._x\n\n"
      "def f(model, band):\n"
      "  object.__setattr__(model, '_interlock_owner', 1)\n"
      "  os._exit(0)\n"
      "  return (engine._scaled, Block._helper, Mine._x, band._asdict(),\n"
      "          getattr(model, '_interlock_owner'), tf.compat.v1, model.x,\n"
      "          model.__class__, tf.config.experimental)\n")
  assert private_uses("train/ok.py", source) == []
