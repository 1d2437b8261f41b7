"""The 2018 post-LN Transformer encoder in Flax Linen, shared by the families built on it (BERT,
RoBERTa): learned absolute positions, token types, post-LN blocks, the pooler and the masked-LM
head's transform. What a family adds (its pre-training heads, how it numbers positions) lives in
its folder under `bert_jax/families/`.

Parameter names mirror the released BERT checkpoints so that import is a mechanical rename:
`bert/encoder/layer_3/attention/self/query/kernel` here is the same name in a Google TF checkpoint
and `encoder.layer.3.attention.self.query.weight` (transposed) in a Hugging Face one.
With `config.scan_layers` the layers live stacked under `encoder/layer` (leading axis L);
`bert_jax.io.checkpoints` converts between the two layouts.

Shape letters: B batch, S sequence, H hidden, N heads, D head dim, P predictions, V vocabulary.
"""
import functools
from typing import Any, Dict

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import splash
from bert_jax.model.config import BertConfig
from bert_jax.model.layers import (activation, attention_bias, attention_implementation,
                                   attention_kind, batch_sharded, blocks, check_inputs, dense,
                                   dtype_of, fused_attention, gather_positions, layer_norm,
                                   one_hot_lookup, zeros)

Array = Any

class BertEmbeddings(nn.Module):
  """Token + segment + learned absolute position embeddings, then LayerNorm and dropout."""
  config: BertConfig

  def setup(self):
    c = self.config
    init = lambda axes: nn.with_logical_partitioning(
        nn.initializers.truncated_normal(stddev=c.initializer_range), axes)
    self.word_embeddings = nn.Embed(c.vocab_size, c.hidden_size, dtype=dtype_of(c),
                                    param_dtype=jnp.float32,
                                    embedding_init=init(("vocab", "embed")))
    self.position_embeddings = nn.Embed(c.max_position_embeddings, c.hidden_size, dtype=dtype_of(c),
                                        param_dtype=jnp.float32,
                                        embedding_init=init((None, "embed")))
    self.token_type_embeddings = nn.Embed(c.type_vocab_size, c.hidden_size, dtype=dtype_of(c),
                                          param_dtype=jnp.float32,
                                          embedding_init=init((None, "embed")))
    self.LayerNorm = layer_norm(c)
    self.dropout = blocks(c).Dropout(c.hidden_dropout_prob)

  def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
    """position_ids None: positions 0..S-1 of every row (a slice of the table, no lookup)."""
    dtype = dtype_of(self.config)
    seq_len = input_ids.shape[-1]
    if position_ids is None:
      positions = self.position_embeddings.embedding[:seq_len].astype(dtype)[None]  # [1, S, H]
    else:
      positions = one_hot_lookup(self.position_embeddings.embedding, position_ids, dtype)
    lookup = blocks(self.config).word_lookup
    x = (lookup(self.word_embeddings.embedding, input_ids, dtype) + positions +
         one_hot_lookup(self.token_type_embeddings.embedding, token_type_ids, dtype))  # [B, S, H]
    return self.dropout(self.LayerNorm(x), deterministic=deterministic)

  def attend(self, hidden):
    """Logits against the (tied) token embedding matrix: [..., H] -> [..., V].

    `nn.Embed.attend`'s product, through `ops.dense_matmul` (tuned kernels): the table's
    gradient is taken as an [H, V] matmul and transposed. Autodiff of `hidden @ table.T` had XLA's
    CPU backend transpose the [rows, V] logit gradient first, a single-threaded 17 ms copy of a
    0.9 s BERT-mini step (step 1.02-1.05x faster this way, benchmarks/history/2026-11-23.md).
    """
    dtype = dtype_of(self.config)
    hidden = hidden.astype(dtype)
    table = self.word_embeddings.embedding.astype(dtype)                       # [V, H]
    return blocks(self.config).dense_matmul(hidden, table.T)                 # [..., V]


class BertSelfAttention(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x, bias, deterministic: bool):
    c = self.config
    batch, seq_len, _ = x.shape
    split = lambda t: t.reshape(batch, seq_len, c.num_attention_heads, c.head_dim)
    q = split(dense(c, c.hidden_size, ("embed", "joined_kv"), "query")(x))   # [B, S, N, D]
    k = split(dense(c, c.hidden_size, ("embed", "joined_kv"), "key")(x))     # [B, S, N, D]
    v = split(dense(c, c.hidden_size, ("embed", "joined_kv"), "value")(x))   # [B, S, N, D]
    implementation = attention_implementation(c, deterministic)
    if bias.ndim == 2:  # [B, S] segment ids: BertModel chose the splash kernel
      context = splash.splash_attention(q, k, v, bias, c.causal_attention)    # [B, S, N, D]
    elif implementation is not None:
      context = fused_attention(q, k, v, bias, implementation)                # [B, S, N, D]
    else:
      kernels = blocks(c)
      dropout = kernels.Dropout(c.attention_probs_dropout_prob)
      context = kernels.attention(q, k, v, bias,
                                 lambda p: dropout(p, deterministic=deterministic),
                                 c.float32_attention_logits)                  # [B, S, N, D]
    return context.reshape(batch, seq_len, c.hidden_size)                     # [B, S, H]


class BertResidualOutput(nn.Module):
  """dense -> dropout -> LayerNorm(x + residual): the post-LN step after attention and FFN."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, residual, deterministic: bool):
    c = self.config
    axes = ("joined_kv", "embed") if x.shape[-1] == c.hidden_size else ("mlp", "embed")
    x = dense(c, c.hidden_size, axes, "dense")(x)
    x = blocks(c).Dropout(c.hidden_dropout_prob)(x, deterministic=deterministic)
    return layer_norm(c)(x + residual)


class BertAttention(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x, bias, deterministic: bool):
    context = BertSelfAttention(self.config, name="self")(x, bias, deterministic)
    return BertResidualOutput(self.config, name="output")(context, x, deterministic)


class BertIntermediate(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    x = dense(c, c.intermediate_size, ("embed", "mlp"), "dense")(x)   # [B, S, 4H]
    return activation(c)(x)


class BertLayer(nn.Module):
  """One post-LN Transformer block."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, bias, deterministic: bool):
    x = BertAttention(self.config, name="attention")(x, bias, deterministic)
    h = BertIntermediate(self.config, name="intermediate")(x)
    return BertResidualOutput(self.config, name="output")(h, x, deterministic)


class _ScannedLayer(nn.Module):
  """Adapter giving BertLayer the (carry, x) -> (carry, y) signature of `nn.scan`."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, bias, deterministic: bool):
    # `deterministic` is static (scan broadcasts it); the layer output is both the carry and the
    # per-layer output that becomes the stacked hidden states.
    x = batch_sharded(BertLayer(self.config, name="layer")(x, bias, deterministic))
    return x, x


class BertEncoder(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x, bias, deterministic: bool, output_hidden_states: bool = False):
    """Returns (last hidden [B, S, H], all layer outputs [L, B, S, H] or None)."""
    c = self.config
    # nn.remat's own default (policy None) is "nothing saveable": kept as it was.
    policy = (None if c.remat_policy == "nothing_saveable"
              else getattr(jax.checkpoint_policies, c.remat_policy))
    remat = functools.partial(nn.remat, static_argnums=(3,), policy=policy)
    if c.scan_layers:
      body = _ScannedLayer
      if c.remat:
        body = remat(body)
      scanned = nn.scan(
          body, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, nn.broadcast), length=c.num_hidden_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})
      x, stacked = scanned(c, name="layer")(x, bias, deterministic)
      return x, (stacked if output_hidden_states else None)
    layer_cls = remat(BertLayer) if c.remat else BertLayer
    outputs = []
    for i in range(c.num_hidden_layers):
      x = batch_sharded(layer_cls(c, name=f"layer_{i}")(x, bias, deterministic))
      outputs.append(x)
    return x, (jnp.stack(outputs) if output_hidden_states else None)


class BertPooler(nn.Module):
  """dense + tanh on the final hidden state of [CLS].

  Under causal attention (the left-to-right ablation) [CLS] sees only itself, so the pooler
  reads the last real token instead (the final [SEP], the one position that has seen the whole
  input, as left-to-right models classify from their last token)."""
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output, cls_positions=None, last_positions=None):
    """[B, S, H] -> [B, H] at position 0 (or `last_positions` [B] under causal attention), or
    [B, K, H] at `cls_positions` [B, K] (packed rows)."""
    c = self.config
    if cls_positions is not None:
      first = gather_positions(sequence_output, cls_positions)  # [B, K, H]
    elif last_positions is not None:
      first = gather_positions(sequence_output, last_positions[:, None])[:, 0]   # [B, H]
    else:
      first = sequence_output[:, 0]                           # [B, H]
    return jnp.tanh(dense(c, c.hidden_size, ("embed", "embed_out"), "dense")(first))


class BertModel(nn.Module):
  """The encoder. Returns a dict:

    sequence_output  [B, S, H]  final hidden states
    pooled_output    [B, H]     pooler on [CLS]
    hidden_states    [L+1, B, S, H] embeddings then every layer (only if output_hidden_states)
  """
  config: BertConfig
  add_pooling_layer: bool = True
  # Positions: 0..S-1 (BERT), or RoBERTa's numbering from `padding_idx + 1` over the non-padding
  # tokens (`position_offset` = padding_idx + 1; padding at padding_idx), from the input ids as
  # transformers counts them; given `position_ids` (packed rows) are shifted by it.
  position_offset: int = 0
  # False: one token type (RoBERTa): a pair's segment ids are not read.
  token_types: bool = True

  def setup(self):
    self.embeddings = BertEmbeddings(self.config)
    self.encoder = BertEncoder(self.config)
    if self.add_pooling_layer:
      self.pooler = BertPooler(self.config)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
               deterministic: bool = True, output_hidden_states: bool = False,
               cls_positions=None, token_head: bool = False) -> Dict[str, Array]:
    """attention_mask: [B, S] padding mask, or [B, S, S] (block-diagonal for packed rows).
    cls_positions: [B, K] positions of each packed pair's [CLS] (pooled output [B, K, H]).
    token_head: this encoder's token-level heads read its last layer (no `token_output`)."""
    del token_head
    c = self.config
    if not self.token_types:
      token_type_ids = None
    check_inputs(c, input_ids, token_type_ids,
                 max_positions=c.max_position_embeddings - self.position_offset)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    if self.position_offset and position_ids is not None:
      position_ids = position_ids + self.position_offset
    elif self.position_offset:
      padding_idx = self.position_offset - 1
      real = (input_ids != padding_idx).astype(jnp.int32)                        # [B, S]
      position_ids = jnp.cumsum(real, axis=-1) * real + padding_idx              # [B, S]
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    x = batch_sharded(self.embeddings(input_ids, token_type_ids, position_ids,
                                      deterministic))                         # [B, S, H]
    # Initialisation traces the model on a short dummy sequence; the parameters are the same
    # whichever way attention is computed.
    if (not self.is_initializing()
        and attention_kind(c, deterministic, input_ids.shape[-1]) == "splash"):
      bias = splash.segment_ids(attention_mask)               # [B, S]: what the kernel masks by
    else:
      bias = attention_bias(attention_mask, c.causal_attention)   # [B, 1, S or 1, S]
    sequence_output, per_layer = self.encoder(x, bias, deterministic, output_hidden_states)
    outputs = {"sequence_output": sequence_output}
    if self.add_pooling_layer:
      last = None
      if c.causal_attention and attention_mask.ndim == 2:
        last = jnp.sum(attention_mask, axis=-1).astype(jnp.int32) - 1     # [B]
      outputs["pooled_output"] = self.pooler(sequence_output, cls_positions, last)
    if output_hidden_states:
      outputs["hidden_states"] = jnp.concatenate([x[None], per_layer], axis=0)
    return outputs

  def attend(self, hidden):
    return self.embeddings.attend(hidden)


class BertPredictions(nn.Module):
  """Masked-LM head: transform (dense + act + LayerNorm), then logits against the tied embedding.

  Only the gathered positions go through the transform and the vocabulary matmul, so the cost is
  P rows per sequence rather than S (the sparse MLM head).
  """
  config: BertConfig

  @nn.compact
  def __call__(self, hidden, embedding_attend):
    c = self.config
    h = _TransformModule(c, name="transform")(hidden)         # [..., H]
    logits = embedding_attend(h)                              # [..., V]
    output_bias = self.param("output_bias", zeros(("vocab",)), (c.vocab_size,), jnp.float32)
    return blocks(c).add_bias(logits.astype(jnp.float32), output_bias)    # [..., V]


class _TransformModule(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, hidden):
    c = self.config
    h = dense(c, c.hidden_size, ("embed", "embed_out"), "dense")(hidden)
    return layer_norm(c)(activation(c)(h))


