"""Tests for the auxiliary heads (layers.aux_heads)."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import aux_heads
from layers import resnet
from layers.aux_heads import ConvAuxHead, SequenceAuxHead
from tests.keras_models import sequential_cnn
from tf_interlock.keras import split as keras_split


def _num_params(layer):
  return sum(int(np.prod(w.shape)) for w in layer.trainable_weights)


def _roundtrip(layer, inputs):
  """from_config(get_config()) gives the same config and, with the same
  weights, the same outputs."""
  clone = layer.__class__.from_config(layer.get_config())
  assert clone.get_config() == layer.get_config()
  clone.build(inputs.shape)
  clone.set_weights(layer.get_weights())
  np.testing.assert_allclose(clone(inputs), layer(inputs), rtol=1e-6)


def test_conv_aux_head_authors_shape_and_params():
  head = aux_heads.make_conv_aux_head("authors", 10)
  x = tf.random.normal([2, 8, 8, 16])
  assert head(x, training=True).shape == (2, 10)
  assert head.filters == aux_heads.AUTHORS_FILTERS == (128, 64)
  # conv 3x3 16->128 (no bias), BN gamma/beta, conv 3x3 128->64, BN, dense.
  expected = 9 * 16 * 128 + 2 * 128 + 9 * 128 * 64 + 2 * 64 + 64 * 10 + 10
  assert _num_params(head) == expected
  assert head.flops((8, 8, 16)) == 2 * (64 * 9 * 16 * 128 +
                                        64 * 9 * 128 * 64 + 64 * 10)


def test_conv_aux_head_pool_only():
  head = aux_heads.make_conv_aux_head("pool", 5)
  x = tf.random.normal([3, 4, 4, 7])
  logits = head(x)
  assert logits.shape == (3, 5)
  assert _num_params(head) == 7 * 5 + 5
  # Pool then dense: equal to a dense layer on the spatial mean.
  expected = head.classifier(tf.reduce_mean(x, axis=[1, 2]))
  np.testing.assert_allclose(logits, expected, rtol=1e-6)


def test_conv_aux_head_custom_widths_and_roundtrip():
  head = aux_heads.make_conv_aux_head([4], 3, synchronized_bn=False)
  x = tf.random.normal([2, 5, 5, 2])
  head(x, training=True)  # Moves the BN statistics away from their init.
  assert head.get_config()["filters"] == [4]
  assert head.get_config()["synchronized_bn"] is False
  _roundtrip(head, x)


def test_bad_conv_aux_head_arguments():
  with pytest.raises(ValueError, match=r"Received: aux_head='big'"):
    aux_heads.make_conv_aux_head("big", 10)
  with pytest.raises(ValueError, match=r"Received: filters="):
    ConvAuxHead(10, filters=(8, 0))
  with pytest.raises(ValueError, match=r"Received: num_classes=0"):
    ConvAuxHead(0)


def test_synchronized_bn_works_with_default_strategy_and_tf_function():
  head = ConvAuxHead(4, filters=(3,), synchronized_bn=True)
  x = tf.random.normal([4, 6, 6, 2]) + 3.0
  step = tf.function(lambda x: head(x, training=True))
  assert step(x).shape == (4, 4)
  assert head.norms[0].synchronized
  # One replica: the statistics are this batch's, as with plain BN.
  mean = tf.reduce_mean(head.convs[0](x), axis=[0, 1, 2])
  np.testing.assert_allclose(head.norms[0].moving_mean,
                             (1 - head.norms[0].momentum) * mean, rtol=1e-4)


def test_sequence_aux_head_untied():
  head = SequenceAuxHead(30)
  h = tf.random.normal([2, 5, 8])
  logits = head(h)
  assert logits.shape == (2, 5, 30)
  assert not head.tied and head.tied_embeddings is None
  assert _num_params(head) == 2 * 8 + 8 * 30 + 30
  _roundtrip(head, h)


def test_sequence_aux_head_tied_to_embedding_layer():
  embedding = keras.layers.Embedding(30, 8)
  head = SequenceAuxHead(30, tie_to=embedding)
  h = tf.random.normal([2, 5, 8])
  with tf.GradientTape() as tape:
    logits = head(h)
    loss = tf.reduce_sum(logits**2)
  # logits = LN(h) @ E^T + bias, E the embedding layer's own matrix.
  expected = tf.einsum("btd,vd->btv", head.norm(h), embedding.embeddings)
  np.testing.assert_allclose(logits, expected + head.bias, rtol=1e-5,
                             atol=1e-6)
  assert head.tied_embeddings is embedding.embeddings
  assert any(w is embedding.embeddings for w in head.trainable_weights)
  grad = tape.gradient(loss, embedding.embeddings)
  assert grad is not None and float(tf.reduce_max(tf.abs(grad))) > 0
  # No projection of its own: E (30x8), LN (2x8) and the bias (30).
  assert _num_params(head) == 30 * 8 + 2 * 8 + 30


def test_sequence_aux_head_tied_to_variable_without_bias():
  table = keras.Variable(np.random.default_rng(0).normal(size=(6, 4)),
                         dtype="float32")
  head = SequenceAuxHead(6, tie_to=table, use_bias=False)
  h = tf.random.normal([3, 4])
  logits = head(h)
  expected = tf.matmul(head.norm(h), table, transpose_b=True)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
  assert head.bias is None
  assert any(w is table for w in head.trainable_weights)


def test_tied_head_errors():
  head = SequenceAuxHead(30, tie_to=keras.layers.Embedding(31, 8))
  with pytest.raises(ValueError, match=r"Received: tie_to.shape=\(31, 8\)"):
    head.build((2, 5, 8))
  with pytest.raises(TypeError, match=r"Received: tie_to="):
    SequenceAuxHead(30, tie_to=np.zeros((30, 8)))
  with pytest.raises(TypeError, match=r"`embeddings` variable"):
    SequenceAuxHead(30, tie_to=keras.layers.Dense(3)).build((2, 8))
  tied = SequenceAuxHead(30, tie_to=keras.layers.Embedding(30, 8, name="emb"))
  with pytest.raises(ValueError, match=r"Received: tie_to='emb'"):
    tied.get_config()


def test_heads_under_mixed_bfloat16(mixed_bfloat16):
  del mixed_bfloat16
  conv = ConvAuxHead(10)
  logits = conv(tf.random.normal([2, 8, 8, 4]), training=True)
  assert logits.dtype == tf.bfloat16
  assert conv.classifier.kernel.dtype == "float32"
  embedding = keras.layers.Embedding(30, 8)
  seq = SequenceAuxHead(30, tie_to=embedding)
  out = seq(tf.random.normal([2, 5, 8]))
  assert out.dtype == tf.bfloat16
  assert np.all(np.isfinite(tf.cast(out, tf.float32).numpy()))


def test_the_registry_names_every_kind_and_errors_list_them():
  # Each entry's behaviour, not the registry's contents: a kind added in
  # layers/aux_heads.py needs no edit here.
  for name, kind in aux_heads.KINDS.items():
    assert kind.name == name and name in aux_heads.names()
    assert f"{name} ({kind.description})" in aux_heads.describe()
    assert (name in aux_heads.names(conv_only=True)) is kind.conv
  assert set(aux_heads.names(conv_only=True)) <= set(aux_heads.names())
  with pytest.raises(ValueError, match=(
      re.escape(f"one of {aux_heads.names()}. Received: aux_head='big'"))):
    aux_heads.make_aux_head("big", 3, (None, 4))
  with pytest.raises(ValueError, match="Received: kind.name='pool'"):
    aux_heads.register(aux_heads.KINDS["pool"])


def _dense_kind():
  return aux_heads.AuxHeadKind(
      "dense", "one dense layer",
      lambda num_classes, shape, name=None, **unused: keras.layers.Dense(
          num_classes, name=name))


@pytest.mark.parametrize("kind", aux_heads.names() + ["dense"])
def test_resnet_and_from_keras_build_every_registered_kind(kind, monkeypatch):
  # "dense" is registered here: a new kind reaches both without a change.
  monkeypatch.setitem(aux_heads.KINDS, "dense", _dense_kind())
  x = tf.random.normal([2, 8, 8, 4])
  for modules in (resnet.resnet_modules("resnet20", 10, 2, aux_head=kind),
                  keras_split.from_keras(sequential_cnn(), 2, split=[3, 8],
                                         aux_head=kind)):
    head = modules[0].aux_head
    if kind == "none":
      assert head is None
      continue
    assert head.name == "aux_head1"
    if kind == "dense":
      assert isinstance(head, keras.layers.Dense)
      continue
    assert head(x).shape == (2, 10)
    if kind not in ("linear", "authors", "pool"):
      continue  # a kind registered later: its head ran on the features
    if kind == "linear":
      assert [type(layer) for layer in head.layers] == [
          keras.layers.GlobalAveragePooling2D, keras.layers.Dense]
    else:
      assert head.filters == {"authors": (128, 64), "pool": ()}[kind]
