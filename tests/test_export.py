"""The plain SavedModel export of interlocking modules and its exits.

Owned exports (a marker, the safe replace of an earlier one) are the
binaries' and are tested in tests/test_export_dir.py.
"""

import collections
import json
import os
import shutil
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import resnet
from layers import transformer
from layers.interlock_module import InterlockModule
from tests import helpers
from tf_interlock import exits
from tf_interlock import export

Exported = collections.namedtuple(
    "Exported", ["modules", "path", "inputs", "expected"])
IMAGE_SHAPE = (16, 16, 3)
VOCAB, SEQ = 37, 8


def _build_placed(modules, input_shape):
  """Builds module k's variables on logical CPU k, as depthwise training."""
  for k, module in enumerate(modules):
    with tf.device(f"/cpu:{k}"):
      module.build(input_shape)
    input_shape = module.body.compute_output_shape(input_shape)


def _reference(modules, inputs):
  """In-memory logits of every head: {"serving_default": ..., "exit_k": ...}."""
  h, logits = inputs, {}
  for k, module in enumerate(modules, start=1):
    h = module.forward(h, training=False)
    if module.has_aux_head:
      logits[f"exit_{k}"] = module.aux_logits(h, training=False).numpy()
  logits["serving_default"] = h.numpy()
  return logits


def _export(modules, spec, inputs, path):
  # Under a device scope: the export must not record it.
  with tf.device("/cpu:3"):
    export.export_saved_model(modules, spec, path)
  return Exported(modules, str(path), inputs, _reference(modules, inputs))


@pytest.fixture(scope="module")
def resnet_export(tmp_path_factory):
  modules = resnet.resnet_modules(
      "resnet20", 10, 3, width=0.25, aux_head=[8], input_shape=IMAGE_SHAPE)
  _build_placed(modules, (None,) + IMAGE_SHAPE)
  inputs = np.random.default_rng(0).normal(
      size=(4,) + IMAGE_SHAPE).astype("float32")
  spec = tf.TensorSpec((None,) + IMAGE_SHAPE, tf.float32)
  return _export(modules, spec, inputs,
                 tmp_path_factory.mktemp("resnet") / "export")


@pytest.fixture(scope="module")
def lm_export(tmp_path_factory):
  modules = transformer.transformer_lm_modules(VOCAB, SEQ, 2, 16, 2, 32, 2)
  _build_placed(modules, (None, SEQ))
  inputs = np.random.default_rng(1).integers(
      0, VOCAB, size=(3, SEQ)).astype("int32")
  spec = tf.TensorSpec((None, SEQ), tf.int32)
  return _export(modules, spec, inputs,
                 tmp_path_factory.mktemp("lm") / "export")


def _mlp_export(path, seed=0):
  """A fast two-module MLP export, for the file-handling tests."""
  modules = helpers.mlp_modules(2, seed=seed)
  x, _ = helpers.batch()
  exits.build(modules, x)
  return export.export_saved_model(
      modules, tf.TensorSpec((None, 6), tf.float32), path)


def _nodes(signature):
  """(name, type, device) of a signature's ops and of the functions called."""
  graph = signature.graph
  nodes = [(op.name, op.type, op.device) for op in graph.get_operations()]
  for function in graph.as_graph_def().library.function:
    nodes.extend((n.name, n.op, n.device) for n in function.node_def)
  return nodes


@pytest.mark.parametrize("name", ["resnet_export", "lm_export"])
def test_reloaded_heads_match_in_memory_modules(request, name):
  exported = request.getfixturevalue(name)
  loaded = export.load_exported(exported.path)
  assert sorted(loaded.signatures) == sorted(exported.expected)
  assert export.exit_names(loaded) == [
      f"exit_{k}" for k in range(1, len(exported.modules))]
  for head, expected in exported.expected.items():
    logits = loaded.signatures[head](inputs=tf.constant(exported.inputs))
    assert set(logits) == {"logits"}
    assert logits["logits"].dtype == tf.float32
    np.testing.assert_allclose(logits["logits"], expected, atol=1e-5,
                               err_msg=head)


@pytest.mark.parametrize("name", ["resnet_export", "lm_export"])
def test_no_device_annotations_or_stop_gradients(request, name):
  loaded = export.load_exported(request.getfixturevalue(name).path)
  for head, signature in loaded.signatures.items():
    nodes = _nodes(signature)
    # The model itself sits in a called function: make sure it was seen.
    assert {"MatMul", "BatchMatMulV2", "Conv2D"} & {t for _, t, _ in nodes}
    assert [n for n in nodes if n[2]] == [], head
    assert [n for n in nodes if n[1] == "StopGradient"] == [], head


class PinnedDense(keras.layers.Dense):
  """A Dense layer that pins its ops to a device, as placement code might."""

  def call(self, inputs):
    with tf.device("/cpu:1"):
      return super().call(inputs)


def test_device_scopes_inside_layers_are_cleared(tmp_path):
  modules = [InterlockModule([PinnedDense(4)], aux_head=PinnedDense(3)),
             InterlockModule([PinnedDense(3)])]
  _build_placed(modules, (None, 6))
  export.export_saved_model(modules, tf.TensorSpec((None, 6), tf.float32),
                            tmp_path / "export")
  loaded = export.load_exported(tmp_path / "export")
  for head, signature in loaded.signatures.items():
    nodes = _nodes(signature)
    assert "MatMul" in {t for _, t, _ in nodes}
    assert [n for n in nodes if n[2]] == [], head


def test_mixed_precision_export_returns_float32(tmp_path):
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    modules = helpers.mlp_modules(2)
    x, _ = helpers.batch()
    h = modules[0](x)
    final = modules[1](h)
    assert final.dtype == tf.bfloat16
  finally:
    keras.mixed_precision.set_global_policy(previous)
  export.export_saved_model(modules, tf.TensorSpec((None, 6), tf.float32),
                            tmp_path / "export")
  loaded = export.load_exported(tmp_path / "export")
  logits = loaded.signatures["serving_default"](inputs=x)["logits"]
  assert logits.dtype == tf.float32
  np.testing.assert_allclose(logits, tf.cast(final, tf.float32), atol=1e-2)


_ONE_CPU_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    assert len(tf.config.list_logical_devices("CPU")) == 1
    assert not tf.config.list_logical_devices("GPU")
    outputs = {}
    for tag, (path, inputs) in json.loads(sys.argv[1]).items():
      loaded = tf.saved_model.load(path)
      x = tf.constant(np.load(inputs))
      for name, signature in loaded.signatures.items():
        outputs[f"{tag}.{name}"] = signature(inputs=x)["logits"].numpy()
    assert not {"tf_interlock", "layers"} & set(sys.modules)
    np.savez(sys.argv[2], **outputs)
""")


def test_loads_and_runs_in_a_one_cpu_process(resnet_export, lm_export,
                                             tmp_path):
  jobs = {}
  for tag, exported in (("resnet", resnet_export), ("lm", lm_export)):
    np.save(tmp_path / f"{tag}.npy", exported.inputs)
    jobs[tag] = (exported.path, str(tmp_path / f"{tag}.npy"))
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
  # cwd=tmp_path and no PYTHONPATH: tf_interlock is not importable there.
  result = subprocess.run(
      [sys.executable, "-c", _ONE_CPU_SCRIPT, json.dumps(jobs),
       str(tmp_path / "out.npz")],
      cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  outputs = np.load(tmp_path / "out.npz")
  for tag, exported in (("resnet", resnet_export), ("lm", lm_export)):
    for head, expected in exported.expected.items():
      np.testing.assert_allclose(outputs[f"{tag}.{head}"], expected,
                                 atol=1e-5, err_msg=f"{tag}.{head}")


def test_refuses_to_overwrite_a_non_empty_dir(tmp_path):
  path = tmp_path / "export"
  path.mkdir()
  (path / "notes.txt").write_text("keep me")
  with pytest.raises(ValueError, match="Received: export_dir=") as info:
    _mlp_export(path)
  assert "\n" not in str(info.value)
  assert os.listdir(path) == ["notes.txt"]
  assert os.listdir(tmp_path) == ["export"]


def test_exports_into_an_existing_empty_dir(tmp_path):
  (tmp_path / "export").mkdir()
  _mlp_export(tmp_path / "export")
  export.load_exported(tmp_path / "export")
  assert os.listdir(tmp_path) == ["export"]


def test_the_export_is_a_plain_saved_model_never_replaced(tmp_path):
  path = tmp_path / "export"
  assert _mlp_export(path) == str(path)
  # What tf.saved_model.save writes, and nothing of ours: no marker.
  assert sorted(os.listdir(path)) == ["assets", "fingerprint.pb",
                                      "saved_model.pb", "variables"]
  before = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
  with pytest.raises(ValueError, match="is not empty") as info:
    _mlp_export(path, seed=1)  # an earlier export is the user's to remove
  assert str(info.value).endswith(f"Received: export_dir={str(path)!r}")
  assert {p: p.read_bytes() for p in path.rglob("*") if p.is_file()} == before
  assert os.listdir(tmp_path) == ["export"]


@pytest.mark.parametrize("make, words", [
    (lambda p: p.write_text("x"), "is a file"),
    (lambda p: (p.parent / "blocker").write_text("x"), "under the file")])
def test_a_file_in_the_way_is_one_line(tmp_path, make, words):
  path = tmp_path / "export"
  make(path)
  target = tmp_path / "blocker" / "export" if words == "under the file" else (
      path)
  with pytest.raises(ValueError, match=words) as info:
    _mlp_export(target)
  assert "\n" not in str(info.value)


def test_export_and_load_on_the_ram_filesystem(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  path = "ram://export_test/a/export"
  _mlp_export(path)
  with pytest.raises(ValueError, match="is not empty"):
    _mlp_export(path, seed=1)
  loaded = export.load_exported(path)
  assert "interlock_export.json" not in tf.io.gfile.listdir(path)
  x, _ = helpers.batch()
  reference = helpers.mlp_modules(2, seed=0)
  np.testing.assert_allclose(
      loaded.signatures["serving_default"](inputs=x)["logits"],
      reference[1](reference[0](x)), atol=1e-5)
  assert os.listdir(tmp_path) == []


def test_truncated_variables_give_a_one_line_error(tmp_path):
  _mlp_export(tmp_path / "export")
  data = next((tmp_path / "export" / "variables").glob("variables.data-*"))
  data.write_bytes(data.read_bytes()[:20])
  with pytest.raises(ValueError, match="damaged or truncated") as info:
    export.load_exported(tmp_path / "export")
  assert "\n" not in str(info.value)


@pytest.mark.parametrize("remove, missing", [
    ("variables", "variables/variables.index"),
    ("variables/variables.data-00000-of-00001", "variables.data-*"),
    ("saved_model.pb", "saved_model.pb")])
def test_incomplete_export_gives_a_one_line_error(tmp_path, remove, missing):
  _mlp_export(tmp_path / "export")
  broken = tmp_path / "broken"
  shutil.copytree(tmp_path / "export", broken)
  target = broken / remove
  shutil.rmtree(target) if target.is_dir() else target.unlink()
  with pytest.raises(ValueError, match="Received: export_dir=") as info:
    export.load_exported(broken)
  message = str(info.value)
  assert "\n" not in message
  assert str(broken) in message and missing in message


def test_missing_dir_gives_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match="No SavedModel directory"):
    export.load_exported(tmp_path / "nowhere")


def test_rejects_a_non_spec_input(tmp_path):
  with pytest.raises(TypeError, match="Received: input_spec="):
    export.export_saved_model(helpers.mlp_modules(2), (None, 6),
                              tmp_path / "export")
