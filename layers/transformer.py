"""Decoder-only Transformer language models split into interlocking modules.

Gomez et al. (2022, arXiv:2010.04116) also train Transformer language models
with interlocking backpropagation: the layers are split into K modules and
every module k < K gets an auxiliary head A_k that predicts the next token at
every position from h_k. Here the network is

    ids [B, T] -> token + learned position embeddings -> N pre-LN blocks
               -> final LayerNorm -> projection to vocabulary logits [B, T, V]

with pre-LN blocks (Xiong et al., 2020) x + Attn(LN(x)), x + MLP(LN(x)):
the residual stream is never normalised, so any module boundary sees the same
kind of activations. `transformer_lm_modules` gives the embeddings to module
1, the final norm + projection (a `SequenceAuxHead`, which has exactly that
form) to module K, and a contiguous run of blocks to each module.

Attention is causal (`use_causal_mask=True`), so position t's logits depend
on tokens 0..t only, in every module and every aux head.
"""

import keras
from keras import ops

from layers import aux_heads
from layers import common
from layers.aux_heads import SequenceAuxHead

BALANCE_MODES = common.BALANCE_MODES


def _init():
  # N(0, 0.02^2), the usual GPT initialisation for embeddings and weights.
  return keras.initializers.RandomNormal(stddev=0.02)


@keras.saving.register_keras_serializable(package="tf_interlock")
class PositionEmbedding(keras.layers.Layer):
  """Adds a learned embedding of each position to a sequence [B, T, d].

  Args:
    max_length: the longest sequence the layer accepts (T <= max_length).
    **kwargs: base `keras.layers.Layer` arguments.

  Call arguments:
    inputs: [B, T, d]; position t gets row t of the [max_length, d] table.

  Returns:
    [B, T, d], inputs plus position embeddings.
  """

  def __init__(self, max_length, **kwargs):
    super().__init__(**kwargs)
    if int(max_length) < 1:
      raise ValueError(
          f"max_length must be a positive int. Received: "
          f"max_length={max_length!r}")
    self.max_length = int(max_length)

  def build(self, input_shape):
    if input_shape[-2] is not None and input_shape[-2] > self.max_length:
      raise ValueError(
          f"Sequences must have at most max_length={self.max_length} "
          f"positions. Received: input_shape={tuple(input_shape)}")
    self.embeddings = self.add_weight(
        shape=(self.max_length, input_shape[-1]), initializer=_init(),
        name="embeddings")

  def call(self, inputs):
    length = ops.shape(inputs)[-2]
    positions = ops.cast(self.embeddings[:length], self.compute_dtype)
    return inputs + positions

  def get_config(self):
    config = super().get_config()
    config.update(max_length=self.max_length)
    return config


@keras.saving.register_keras_serializable(package="tf_interlock")
class TransformerBlock(keras.layers.Layer):
  """Pre-LN decoder block: causal self-attention then an MLP, both residual.

  Args:
    d_model: width of the residual stream.
    num_heads: attention heads; must divide d_model.
    mlp_dim: hidden width of the MLP (GELU).
    dropout: dropout rate on attention weights and on both residual branches.
    epsilon: LayerNormalization epsilon.
    **kwargs: base `keras.layers.Layer` arguments.

  Call arguments:
    inputs: [B, T, d_model]; training: Python bool for dropout.

  Returns:
    [B, T, d_model].
  """

  def __init__(self, d_model, num_heads, mlp_dim, dropout=0.0, epsilon=1e-5,
               **kwargs):
    super().__init__(**kwargs)
    if int(num_heads) < 1 or int(d_model) % int(num_heads):
      raise ValueError(
          f"num_heads must be a positive divisor of d_model={d_model}. "
          f"Received: num_heads={num_heads!r}")
    if not 0.0 <= dropout < 1.0:
      raise ValueError(
          f"dropout must be in [0, 1). Received: dropout={dropout!r}")
    self.d_model = int(d_model)
    self.num_heads = int(num_heads)
    self.mlp_dim = int(mlp_dim)
    self.dropout = float(dropout)
    self.epsilon = float(epsilon)
    policy = self.dtype_policy
    self.norm1 = keras.layers.LayerNormalization(
        epsilon=self.epsilon, dtype=policy, name="norm1")
    self.attention = keras.layers.MultiHeadAttention(
        self.num_heads, self.d_model // self.num_heads, dropout=self.dropout,
        kernel_initializer=_init(), dtype=policy, name="attention")
    self.norm2 = keras.layers.LayerNormalization(
        epsilon=self.epsilon, dtype=policy, name="norm2")
    self.mlp_in = keras.layers.Dense(
        self.mlp_dim, activation="gelu", kernel_initializer=_init(),
        dtype=policy, name="mlp_in")
    self.mlp_out = keras.layers.Dense(
        self.d_model, kernel_initializer=_init(), dtype=policy,
        name="mlp_out")
    self.residual_dropout = keras.layers.Dropout(
        self.dropout, dtype=policy, name="residual_dropout")

  def build(self, input_shape):
    if input_shape[-1] != self.d_model:
      raise ValueError(
          f"The input's last axis must equal d_model={self.d_model}. "
          f"Received: input_shape={tuple(input_shape)}")
    self.norm1.build(input_shape)
    self.attention.build(input_shape, input_shape)
    self.norm2.build(input_shape)
    self.mlp_in.build(input_shape)
    self.mlp_out.build(tuple(input_shape[:-1]) + (self.mlp_dim,))

  def call(self, inputs, training=False):
    h = self.norm1(inputs)
    # use_causal_mask: query t attends to keys 0..t only.
    h = self.attention(h, h, use_causal_mask=True, training=training)
    x = inputs + self.residual_dropout(h, training=training)
    h = self.mlp_out(self.mlp_in(self.norm2(x)))
    return x + self.residual_dropout(h, training=training)

  def compute_output_shape(self, input_shape):
    return tuple(input_shape)

  def flops(self, input_shape):
    """FLOPs (2 x multiply-adds) of one sequence with input shape (T, d).

    Multiply-adds: Q, K, V and output projections 4 T d^2; scores Q K^T and
    the weighted sum of V 2 T^2 d (computed in full, then masked); MLP
    2 T d m. LayerNorm, softmax and GELU are linear in T d and left out.
    """
    t, d = input_shape[-2], self.d_model
    return 2 * (4 * t * d * d + 2 * t * t * d + 2 * t * d * self.mlp_dim)

  def get_config(self):
    config = super().get_config()
    config.update(d_model=self.d_model, num_heads=self.num_heads,
                  mlp_dim=self.mlp_dim, dropout=self.dropout,
                  epsilon=self.epsilon)
    return config


def transformer_lm_modules(vocab_size, seq_len, num_layers, d_model,
                           num_heads, mlp_dim, num_modules, *, split=None,
                           balance="flops", dropout=0.0, tie_embeddings=False,
                           aux_tie_embeddings=False, aux_head="linear",
                           name="transformer_lm"):
  """Splits a decoder-only Transformer LM depthwise into K modules.

  Module 1 gets the token and position embeddings, module K the final
  LayerNorm + vocabulary projection (and no aux head); each module k < K gets
  a `SequenceAuxHead` (LayerNorm + projection) on its output. The modules are
  returned unbuilt (build each under its own device or strategy scope).

  Tying (`tie_embeddings`, `aux_tie_embeddings`) makes heads reuse the token
  embedding matrix E of module 1: E is then a weight of those modules as well
  and is updated by each of their optimizers, and a tied module has no config
  (save with `tf.train.Checkpoint`, see `SequenceAuxHead`).

  With `split=None` the blocks are partitioned to minimise the slowest
  module's estimated FLOPs: balance="flops" counts each module's blocks, its
  aux head or (module K) its output head; "main_flops" leaves the aux heads
  out; "blocks" gives every block cost 1.

  Args:
    vocab_size: vocabulary size V.
    seq_len: longest input length T (size of the position table).
    num_layers: number of Transformer blocks N.
    d_model: width of the residual stream.
    num_heads: attention heads per block.
    mlp_dim: MLP hidden width.
    num_modules: number of modules K, 1 <= K <= N.
    split: optional list of K positive block counts summing to N.
    balance: "flops", "main_flops" or "blocks", used when `split` is None.
    dropout: dropout rate for embeddings, attention and residual branches.
    tie_embeddings: the output projection of module K reuses E.
    aux_tie_embeddings: the aux heads reuse E ("linear" heads only).
    aux_head: the kind of modules 1..K-1's aux heads, any registered kind
      that takes [B, T, d] features (`aux_heads.make_aux_head`; "linear":
      a `SequenceAuxHead`, "none": no aux heads).
    name: prefix of the module names (`{name}_module{k}`).

  Returns:
    A list of K `InterlockModule`s mapping int ids [B, T] to logits
    [B, T, V] when stacked.
  """
  token_embedding = keras.layers.Embedding(
      vocab_size, d_model, embeddings_initializer=_init(),
      name="token_embedding")
  # A Sequential body casts its input to the first layer's compute dtype,
  # which for an Embedding is float32 or bfloat16: bfloat16 rounds ids above
  # 256. An int32 no-op first layer keeps the token ids exact.
  embed = [keras.layers.Identity(dtype="int32", name="token_ids"),
           token_embedding,
           PositionEmbedding(seq_len, name="position_embedding")]
  if dropout:
    embed.append(keras.layers.Dropout(dropout, name="embedding_dropout"))
  blocks = [TransformerBlock(d_model, num_heads, mlp_dim, dropout=dropout,
                             name=f"block{i + 1}") for i in range(num_layers)]
  output_head = SequenceAuxHead(
      vocab_size, tie_to=token_embedding if tie_embeddings else None,
      name="output_head")

  def costs(balance):
    shape = (seq_len, d_model)
    block_costs = [block.flops(shape) for block in blocks]
    head_cost = output_head.flops(shape)
    block_costs[-1] += head_cost
    # Every aux head is a [T, d] x [d, V] projection, like the output head.
    cuts = [head_cost] * num_layers if balance == "flops" else None
    return block_costs, cuts

  def new_aux_head(k):
    if aux_head == "linear" and aux_tie_embeddings:
      return SequenceAuxHead(vocab_size, tie_to=token_embedding,
                             name=f"aux_head{k}")
    return aux_heads.make_aux_head(
        aux_head, vocab_size, (None, seq_len, d_model),
        output_shape=(None, seq_len, vocab_size), name=f"aux_head{k}")

  return common.split_modules(
      embed, blocks, [output_head], num_modules, split=split,
      balance=balance, costs=costs, new_aux_head=new_aux_head, name=name)
