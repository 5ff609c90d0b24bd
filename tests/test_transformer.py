"""Tests for the decoder-only Transformer LM split into interlocking modules."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import transformer
from layers.aux_heads import SequenceAuxHead
from layers.interlock_module import InterlockModule
from tests import helpers

VOCAB, SEQ, LAYERS, D, HEADS, MLP = 37, 8, 4, 16, 2, 32


def _modules(num_modules=3, **kwargs):
  modules = transformer.transformer_lm_modules(
      VOCAB, SEQ, LAYERS, D, HEADS, MLP, num_modules, **kwargs)
  shape = (None, SEQ)
  for module in modules:  # Built in order, as an engine would.
    module.build(shape)
    shape = module.body.compute_output_shape(shape)
  assert shape == (None, SEQ, VOCAB)
  return modules



def _ids(batch=2, seed=0):
  return np.random.default_rng(seed).integers(0, VOCAB, size=(batch, SEQ))


def _unique_params(modules):
  seen = {id(w): w for m in modules for w in m.trainable_weights}
  return sum(int(np.prod(w.shape)) for w in seen.values())


def test_shapes_and_layout():
  modules = _modules(split=[1, 2, 1])
  logits, aux = helpers.stacked_forward(modules, _ids())
  assert logits.shape == (2, SEQ, VOCAB)
  assert [a.shape for a in aux] == [(2, SEQ, VOCAB)] * 2
  names = [[layer.name for layer in m.body.layers] for m in modules]
  assert names == [["token_ids", "token_embedding", "position_embedding",
                    "block1"],
                   ["block2", "block3"], ["block4", "output_head"]]
  assert [m.has_aux_head for m in modules] == [True, True, False]


def test_parameter_count_of_main_path():
  modules = _modules()
  body = sum(int(np.prod(w.shape))
             for m in modules for w in m.body.trainable_weights)
  block = (2 * D + 4 * D * D + 4 * D + 2 * D + D * MLP + MLP + MLP * D + D)
  expected = VOCAB * D + SEQ * D + LAYERS * block + 2 * D + D * VOCAB + VOCAB
  assert body == expected


@pytest.mark.parametrize("position", [1, 4, SEQ - 1])
def test_causality_through_stacked_modules(position):
  modules = _modules(split=[2, 1, 1])
  ids = _ids(batch=1)
  changed = ids.copy()
  changed[0, position] = (ids[0, position] + 1) % VOCAB
  before = [helpers.stacked_forward(modules, ids)[0]] + helpers.stacked_forward(modules, ids)[1]
  after = [helpers.stacked_forward(modules, changed)[0]] + helpers.stacked_forward(modules, changed)[1]
  for a, b in zip(before, after):
    # Earlier positions never see a later token, in any module or head.
    np.testing.assert_array_equal(a[:, :position], b[:, :position])
    assert not np.allclose(a[:, position], b[:, position])


def test_tied_embeddings_share_one_matrix():
  untied = _modules()
  modules = _modules(tie_embeddings=True, aux_tie_embeddings=True)
  embedding = modules[0].body.layers[1].embeddings
  output_head = modules[-1].body.layers[-1]
  assert output_head.tied_embeddings is embedding
  assert all(m.aux_head.tied_embeddings is embedding for m in modules[:-1])
  # Module K trains E too (through its output projection).
  assert any(w is embedding for w in modules[-1].trainable_weights)
  # Tying removes K projection matrices [d, V] (output head + K-1 aux heads).
  assert _unique_params(untied) - _unique_params(modules) == 3 * D * VOCAB
  with pytest.raises(ValueError, match=r"Received: tie_to='token_embedding'"):
    modules[-1].get_config()


def test_tied_model_checkpoint_roundtrip(tmp_path):
  def fresh():
    return _modules(tie_embeddings=True, aux_tie_embeddings=True)

  modules = fresh()
  ids = _ids()
  expected = helpers.stacked_forward(modules, ids)
  # Track each module as an attribute: layers only in a list are not saved.
  path = tf.train.Checkpoint(
      **{f"module{k}": m for k, m in enumerate(modules)}).write(
          str(tmp_path / "ckpt"))
  restored_modules = fresh()
  assert not np.allclose(helpers.stacked_forward(restored_modules, ids)[0], expected[0])
  tf.train.Checkpoint(**{f"module{k}": m for k, m in enumerate(
      restored_modules)}).read(path).assert_consumed()
  got = helpers.stacked_forward(restored_modules, ids)
  for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  head = restored_modules[-1].body.layers[-1]
  assert head.tied_embeddings is restored_modules[0].body.layers[1].embeddings


def test_interlock_module_and_layer_config_roundtrip():
  modules = _modules(dropout=0.1)
  x = _ids()
  for module in modules:
    clone = InterlockModule.from_config(module.get_config())
    clone.build((None,) + tuple(np.shape(x)[1:]))
    clone.set_weights(module.get_weights())
    for a, b in zip(tf.nest.flatten(clone(x)), tf.nest.flatten(module(x))):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    x = module.forward(x)
  for layer in [transformer.TransformerBlock(D, HEADS, MLP, dropout=0.2),
                transformer.PositionEmbedding(SEQ), SequenceAuxHead(VOCAB)]:
    clone = layer.__class__.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


def test_saved_keras_file_roundtrip(tmp_path):
  modules = _modules(num_modules=2)
  inputs = keras.Input((SEQ,), dtype="int32")
  model = keras.Model(inputs, modules[1](modules[0](inputs)))
  x = _ids()
  restored = helpers.assert_keras_round_trip(model, x,
                                             str(tmp_path / "lm.keras"))
  helpers.assert_aux_head_reloaded(restored, modules[0], x)


def test_balance_by_flops():
  kwargs = dict(vocab_size=1000, seq_len=SEQ, num_layers=6, d_model=D,
                num_heads=HEADS, mlp_dim=MLP, num_modules=3)
  def split(**extra):
    modules = transformer.transformer_lm_modules(**kwargs, **extra)
    blocks = [[layer for layer in m.body.layers
               if isinstance(layer, transformer.TransformerBlock)]
              for m in modules]
    return [len(b) for b in blocks]

  # Each module carries one [T, d] x [d, V] projection (aux or output head),
  # here worth ~5 blocks: counted, the split is even...
  assert split() == [2, 2, 2]
  assert split(balance="blocks") == [2, 2, 2]
  # ... while on the main path alone module K, with the output head, gets
  # the fewest blocks.
  assert split(balance="main_flops") == [2, 3, 1]


@pytest.mark.parametrize("kwargs, message", [
    (dict(split=[2, 2, 1]), r"sums to 5.*Received: split=\[2, 2, 1\]"),
    (dict(split=[4]), r"one block count per module.*Received: split=\[4\]"),
    (dict(balance="time"), r"Received: balance='time'"),
])
def test_bad_arguments_raise_clear_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    transformer.transformer_lm_modules(VOCAB, SEQ, LAYERS, D, HEADS, MLP, 3,
                                       **kwargs)


def test_bad_shapes_raise_clear_errors():
  with pytest.raises(ValueError, match=r"\(4\). Received: num_modules=5"):
    transformer.transformer_lm_modules(VOCAB, SEQ, LAYERS, D, HEADS, MLP, 5)
  with pytest.raises(ValueError, match=r"d_model=16. Received: num_heads=3"):
    transformer.TransformerBlock(D, 3, MLP)
  with pytest.raises(ValueError, match=r"max_length=8 .*Received: input_"):
    transformer.PositionEmbedding(SEQ).build((None, SEQ + 1, D))
  with pytest.raises(ValueError, match=r"Received: dropout=1.0"):
    transformer.TransformerBlock(D, HEADS, MLP, dropout=1.0)


def test_shorter_sequences_and_dropout():
  modules = _modules(dropout=0.5)
  ids = _ids()[:, :5]
  logits, _ = helpers.stacked_forward(modules, ids)
  assert logits.shape == (2, 5, VOCAB)
  # Dropout is active only in training.
  np.testing.assert_array_equal(logits, helpers.stacked_forward(modules, ids)[0])
  assert not np.allclose(logits, helpers.stacked_forward(modules, ids, training=True)[0])


def test_mixed_bfloat16_forward(mixed_bfloat16):
  del mixed_bfloat16
  modules = _modules(tie_embeddings=True)
  logits, aux = helpers.stacked_forward(modules, _ids(), training=True)
  assert logits.dtype == tf.bfloat16 and aux[0].dtype == tf.bfloat16
  assert modules[0].body.layers[1].embeddings.dtype == "float32"
  assert np.all(np.isfinite(tf.cast(logits, tf.float32).numpy()))


def test_token_ids_stay_exact_under_mixed_bfloat16(mixed_bfloat16):
  del mixed_bfloat16
  # bfloat16 holds integers exactly only up to 256: 257 would become 256 if
  # the ids went through a bfloat16 cast on their way to the embedding.
  (module,) = transformer.transformer_lm_modules(300, 2, 1, D, HEADS, MLP, 1)
  logits = tf.cast(module.forward(tf.constant([[257, 5], [256, 5]])),
                   tf.float32)
  assert module.body.inputs[0].dtype == "int32"
  assert not np.allclose(logits[0], logits[1])
