"""What `from_keras(balance="flops")` counts (`tf_interlock.keras.flops`),
by hand, and the splits it gives a language model with and without aux
heads."""

import keras
import keras_hub
import pytest

from tests.keras_models import sequential_cnn
from tf_interlock.keras import flatten as keras_flatten
from tf_interlock.keras import flops as keras_flops
from tf_interlock.keras import split as keras_split

T, D, HEADS, FF = 6, 8, 2, 32


def _flops_of(model):
  """{layer name: FLOPs} as `from_keras` counts them: on the flattened
  model, where a layer called twice is a copy per call."""
  flat, _, _ = keras_flatten.flatten_with_sources(model, {})
  graph, layers, nodes = keras_split._graph(flat)  # pylint: disable=protected-access
  assert graph is not None
  return {layer.name: keras_flops.layer_flops(layer, node)
          for layer, node in zip(layers, nodes)}


def test_dense_and_conv_multiply_adds():
  model = sequential_cnn()
  flops = list(_flops_of(model).values())
  assert flops[0] == 2 * 28 * 28 * 4 * 9 * 1
  assert flops[3] == 2 * 14 * 14 * 4 * 9 * 4
  assert flops[-1] == 2 * 8 * 10
  assert flops[1] == flops[2] == 0


def test_a_transformer_layer_counts_its_projections_at_every_token():
  # Per token: query, key, value and output projections (4 d x d, as
  # heads x head size = d) and the feed-forward network (d x FF, FF x d);
  # 2 FLOPs per multiply-add. Attention's own T x T products: not counted.
  tokens = keras.Input((T, D))
  h = keras_hub.layers.TransformerDecoder(FF, HEADS, name="decoder")(tokens)
  attention = keras.layers.MultiHeadAttention(HEADS, D // HEADS,
                                              name="mha")(h, h)
  flops = _flops_of(keras.Model(tokens, attention))
  assert flops["decoder"] == 2 * T * (4 * D * D + 2 * D * FF)
  assert flops["mha"] == 2 * T * 4 * D * D


def test_a_tied_head_is_a_projection_and_the_lookup_is_free():
  embedding = keras_hub.layers.ReversibleEmbedding(50, D, name="emb")
  ids = keras.Input((T,), dtype="int32")
  logits = embedding(embedding(ids), reverse=True)
  flops = _flops_of(keras.Model(ids, logits))
  assert sorted(flops.values()) == [0, 2 * T * 50 * D], flops


def _gpt2(vocab):
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=vocab, num_layers=4, num_heads=HEADS, hidden_dim=D,
      intermediate_dim=FF, max_sequence_length=T, dropout=0.0)
  return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def _layers_per_module(modules):
  return [sum(n.startswith("transformer_layer") for n in m.layer_names)
          for m in modules]


@pytest.mark.parametrize("aux_head, want", [
    # Per token a layer is L = 2 (4 D^2 + 2 D FF) = 1536 FLOPs, the tied
    # head H = 2 x 256 x D = 4096. Without aux heads the last module's
    # head weighs: 3 layers | 1 + head (max 4608 against 5632 for 2 | 2 +
    # head). A full-vocabulary aux head on module 1 weighs as much: 2 | 2
    # (2L + H each).
    (None, [3, 1]),
    ("linear", [2, 2]),
])
def test_the_balance_counts_the_lm_head_and_the_aux_head(aux_head, want):
  modules = keras_split.from_keras(_gpt2(256), 2, aux_head=aux_head)
  assert _layers_per_module(modules) == want, [m.layer_names
                                                for m in modules]


def test_the_balance_counts_a_conv_aux_head_at_each_cut():
  # Three conv blocks on 28 x 28, 14 x 14 and 7 x 7 (about 56k, 56k and
  # 28k FLOPs). The authors' head (conv 128, conv 64) after block 1 reads
  # 28 x 28 features (~120M FLOPs), after block 2 14 x 14 (~30M): with it,
  # module 1 takes two blocks; with a pooled linear head, one.
  def conv_blocks(modules):
    return [sum(n.startswith("conv2d") for n in m.layer_names)
            for m in modules]
  assert conv_blocks(keras_split.from_keras(sequential_cnn(), 2,
                                            aux_head="authors")) == [2, 1]
  assert conv_blocks(keras_split.from_keras(sequential_cnn(), 2,
                                            aux_head="linear")) == [1, 2]
