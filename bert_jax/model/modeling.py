"""BERT in Flax Linen: the bidirectional encoder and the pre-training heads.

Parameter names mirror the released checkpoints so that import is a mechanical rename:
`bert/encoder/layer_3/attention/self/query/kernel` here is
`bert/encoder/layer_3/attention/self/query/kernel` in a Google TF checkpoint and
`encoder.layer.3.attention.self.query.weight` (transposed) in a Hugging Face one.
With `config.scan_layers` the layers live stacked under `encoder/layer` (leading axis L);
`bert_jax.io.checkpoints` converts between the two layouts.

Parameters are float32; computation runs in `config.dtype` (float32 or bfloat16), with softmax
and LayerNorm statistics in float32. The building blocks (GELU, dropout, dense products, attention,
the word lookup, the MLM bias) come from `kernels.select(config.kernels)`: the hand-tuned forms of
`ops` or the textbook ones, per backend. Every parameter carries logical axis names
(`nn.with_logical_partitioning`) that `bert_jax.parallel.sharding` maps onto a device mesh.

Shape letters: B batch, S sequence, H hidden, N heads, D head dim, P predictions, V vocabulary.
"""
import functools
from typing import Any, Dict, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import kernels, splash
from bert_jax.model.config import BertConfig

Array = Any

# Added to the attention logits of masked keys. The original adds -10000; a larger magnitude
# makes padded keys contribute exactly zero even in bfloat16.
_MASK_VALUE = -1e9


def activation(config: BertConfig, name: Optional[str] = None):
  """The activation `name` (default `config.hidden_act`) as a function, in the form
  `config.kernels` picks."""
  name = name or config.hidden_act
  if name == "gelu":
    return _kernels(config).gelu
  if name in ("gelu_tanh", "gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
    return functools.partial(jax.nn.gelu, approximate=True)
  if name == "relu":
    return jax.nn.relu
  if name in ("silu", "swish"):
    return jax.nn.silu
  if name == "tanh":
    return jnp.tanh
  raise ValueError(f"Unknown hidden_act {name!r}")


def _dtype(config: BertConfig):
  return jnp.dtype(config.dtype)


def _kernels(config: BertConfig) -> kernels.Kernels:
  # Resolved while tracing, so "auto" picks the backend the model is compiled for.
  return kernels.select(config.kernels)


def _kernel_init(config: BertConfig, axes):
  # The original initialiser: truncated normal with stddev initializer_range.
  init = nn.initializers.truncated_normal(stddev=config.initializer_range)
  return nn.with_logical_partitioning(init, axes)


def _zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def _ones(axes):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), axes)


def _dense(config: BertConfig, features: int, axes, name: str) -> nn.Dense:
  return nn.Dense(features, dtype=_dtype(config), param_dtype=jnp.float32,
                  kernel_init=_kernel_init(config, axes), bias_init=_zeros(axes[1:]), name=name,
                  dot_general=_kernels(config).dense_dot_general)


def _layer_norm(config: BertConfig, name: str = "LayerNorm") -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=_dtype(config),
                      param_dtype=jnp.float32, scale_init=_ones(("embed",)),
                      bias_init=_zeros(("embed",)), name=name)


def check_inputs(config: BertConfig, input_ids, token_type_ids=None) -> None:
  """Host-side validation with a clear message, before anything is traced or compiled.

  Inside `jit` an out-of-range id would silently gather a clamped row; this catches it first.
  Tracers (values unknown until run time) are skipped: only concrete arrays are checked.
  """
  if isinstance(input_ids, jax.core.Tracer):
    return
  ids = np.asarray(input_ids)
  if ids.ndim != 2:
    raise ValueError(f"input_ids must have shape [batch, seq_len], got {ids.shape}")
  # Rotary positions (the ModernBERT family) have no table to run past.
  if not config.is_modern and ids.shape[1] > config.max_position_embeddings:
    raise ValueError(
        f"Sequence length {ids.shape[1]} exceeds the position table "
        f"(max_position_embeddings={config.max_position_embeddings}); shorten max_seq_length.")
  if ids.size and (ids.min() < 0 or ids.max() >= config.vocab_size):
    bad = ids[(ids < 0) | (ids >= config.vocab_size)]
    raise ValueError(
        f"Token id {int(bad.flat[0])} is outside the vocabulary (vocab_size={config.vocab_size}); "
        "the vocabulary file and the checkpoint probably do not match.")
  if token_type_ids is not None and not isinstance(token_type_ids, jax.core.Tracer):
    types = np.asarray(token_type_ids)
    if types.size and (types.min() < 0 or types.max() >= config.type_vocab_size):
      raise ValueError(f"Segment (token type) id {int(types.max())} is outside "
                       f"type_vocab_size={config.type_vocab_size}.")


def attention_bias(attention_mask: Array, causal: bool, dtype=jnp.float32) -> Array:
  """Additive attention bias [B, 1, S, S] from a padding mask [B, S] or a full mask [B, S, S].

  A full [B, S, S] mask expresses block-diagonal attention for packed sequences.
  """
  mask = attention_mask.astype(bool)
  if mask.ndim == 2:
    mask = mask[:, None, :]                                  # [B, 1, S] keys visible to all queries
  if causal:
    seq_len = mask.shape[-1]
    mask = mask & jnp.tril(jnp.ones((seq_len, seq_len), bool))[None]   # [B, S, S]
  return jnp.where(mask, 0.0, _MASK_VALUE).astype(dtype)[:, None]      # [B, 1, S or 1, S]


def batch_sharded(x: Array) -> Array:
  """`x` [B, ...] kept split along the mesh's `data` axis by its batch dimension, where a step is
  traced under a mesh (`parallel.strategies.UnderMesh`) with such an axis; unchanged otherwise.

  With the parameters also split along `data` (config.fsdp) the compiler could otherwise move the
  activations to match a weight's layout; pinned to the batch, it gathers the weights instead
  (what fully sharded data parallelism means). Without fsdp it is the layout the step has anyway.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or "data" not in mesh.axis_names or mesh.shape["data"] == 1:
    return x
  return jax.lax.with_sharding_constraint(
      x, jax.sharding.PartitionSpec("data", *([None] * (x.ndim - 1))))


class BertEmbeddings(nn.Module):
  """Token + segment + learned absolute position embeddings, then LayerNorm and dropout."""
  config: BertConfig

  def setup(self):
    c = self.config
    init = lambda axes: nn.with_logical_partitioning(
        nn.initializers.truncated_normal(stddev=c.initializer_range), axes)
    self.word_embeddings = nn.Embed(c.vocab_size, c.hidden_size, dtype=_dtype(c),
                                    param_dtype=jnp.float32, embedding_init=init(("vocab", "embed")))
    self.position_embeddings = nn.Embed(c.max_position_embeddings, c.hidden_size, dtype=_dtype(c),
                                        param_dtype=jnp.float32,
                                        embedding_init=init((None, "embed")))
    self.token_type_embeddings = nn.Embed(c.type_vocab_size, c.hidden_size, dtype=_dtype(c),
                                          param_dtype=jnp.float32,
                                          embedding_init=init((None, "embed")))
    self.LayerNorm = _layer_norm(c)
    self.dropout = _kernels(c).Dropout(c.hidden_dropout_prob)

  def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
    """position_ids None: positions 0..S-1 of every row (a slice of the table, no lookup)."""
    dtype = _dtype(self.config)
    seq_len = input_ids.shape[-1]
    if position_ids is None:
      positions = self.position_embeddings.embedding[:seq_len].astype(dtype)[None]  # [1, S, H]
    else:
      positions = _one_hot_lookup(self.position_embeddings.embedding, position_ids, dtype)
    lookup = _kernels(self.config).word_lookup
    x = (lookup(self.word_embeddings.embedding, input_ids, dtype) + positions +
         _one_hot_lookup(self.token_type_embeddings.embedding, token_type_ids, dtype))  # [B, S, H]
    return self.dropout(self.LayerNorm(x), deterministic=deterministic)

  def attend(self, hidden):
    """Logits against the (tied) token embedding matrix: [..., H] -> [..., V].

    `nn.Embed.attend`'s product, through `ops.dense_matmul` (tuned kernels): the table's
    gradient is taken as an [H, V] matmul and transposed. Autodiff of `hidden @ table.T` had XLA's
    CPU backend transpose the [rows, V] logit gradient first, a single-threaded 17 ms copy of a
    0.9 s BERT-mini step (step 1.02-1.05x faster this way, benchmarks/history/2026-11-23.md).
    """
    dtype = _dtype(self.config)
    hidden = hidden.astype(dtype)
    table = self.word_embeddings.embedding.astype(dtype)                       # [V, H]
    return _kernels(self.config).dense_matmul(hidden, table.T)                 # [..., V]


def _one_hot_lookup(table, ids, dtype):
  """table[ids] for the small tables (segments, positions): [K, H] at [B, S] -> [B, S, H].

  A gather's gradient is a scatter-add, and here every row adds into the same few table rows
  (segment 0/1, positions 0..S-1): on GPU those colliding atomic adds serialise (measured: a
  fifth of a BERT-base step on an H100, benchmarks/history/2026-11-23.md). A one-hot matmul
  computes the same values exactly (one non-zero term each; HIGHEST keeps float32 exact on TPU)
  and its gradient is a plain matmul.
  """
  one_hot = jax.nn.one_hot(ids, table.shape[0], dtype=dtype)                  # [B, S, K]
  return jnp.einsum("bsk,kh->bsh", one_hot, table.astype(dtype),
                    precision=jax.lax.Precision.HIGHEST)                      # [B, S, H]


def attention_kind(config: BertConfig, deterministic: bool, seq_len: Optional[int] = None) -> str:
  """How attention is computed: "xla", "splash" or "cudnn" (`BertConfig.attention`).

  "auto" takes the fused kernel of the backend the step is traced for where it computes the
  model's function: splash on TPU (sequences a multiple of 128), cuDNN on GPU (float16/bfloat16,
  head_dim a multiple of 8 up to 128), both only without dropout on the attention probabilities
  (their kernels have none); else the XLA path. Asked for by name where it cannot apply, a
  fused kernel is a clear error.
  """
  dropout = not deterministic and config.attention_probs_dropout_prob > 0
  choice = config.attention
  if choice == "splash":
    splash.check(config, deterministic, seq_len)
    return "splash"
  if choice == "cudnn":
    if dropout or config.dtype not in ("bfloat16", "float16") or config.head_dim % 8 or (
        config.head_dim > 128):
      raise ValueError(
          "config.model.attention='cudnn' needs dtype bfloat16 or float16, head_dim a multiple "
          f"of 8 up to 128 and no attention dropout in training (dtype={config.dtype}, "
          f"head_dim={config.head_dim}, attention_probs_dropout_prob="
          f"{config.attention_probs_dropout_prob}); use --config.model.attention=xla")
    return "cudnn"
  if choice == "xla" or dropout:
    return "xla"
  backend = kernels.target_backend()
  if backend == "tpu" and (seq_len is None or seq_len % 128 == 0):
    return "splash"
  if (backend == "gpu" and config.dtype in ("bfloat16", "float16") and not config.head_dim % 8
      and config.head_dim <= 128):
    return "cudnn"
  return "xla"


def attention_implementation(config: BertConfig, deterministic: bool) -> Optional[str]:
  """The `jax.nn.dot_product_attention` implementation the model calls ('cudnn'), or None for the
  other paths (XLA einsums or splash). Both paths compute the same function
  (tests/test_attention.py checks `jax.nn.dot_product_attention`'s argument plumbing on CPU)."""
  return "cudnn" if attention_kind(config, deterministic) == "cudnn" else None


def fused_attention(q, k, v, bias, implementation: str):
  """`jax.nn.dot_product_attention`: q, k, v [B, S, N, D], bias [B, 1, S or 1, S] -> [B, S, N, D]."""
  batch, seq_len, _, head_dim = q.shape
  bias = jnp.broadcast_to(bias, (batch, 1, seq_len, seq_len)).astype(q.dtype)  # [B, 1, S, S]
  return jax.nn.dot_product_attention(q, k, v, bias=bias, scale=1.0 / float(np.sqrt(head_dim)),
                                      implementation=implementation)


class BertSelfAttention(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x, bias, deterministic: bool):
    c = self.config
    batch, seq_len, _ = x.shape
    split = lambda t: t.reshape(batch, seq_len, c.num_attention_heads, c.head_dim)
    q = split(_dense(c, c.hidden_size, ("embed", "joined_kv"), "query")(x))   # [B, S, N, D]
    k = split(_dense(c, c.hidden_size, ("embed", "joined_kv"), "key")(x))     # [B, S, N, D]
    v = split(_dense(c, c.hidden_size, ("embed", "joined_kv"), "value")(x))   # [B, S, N, D]
    implementation = attention_implementation(c, deterministic)
    if bias.ndim == 2:  # [B, S] segment ids: BertModel chose the splash kernel
      context = splash.splash_attention(q, k, v, bias, c.causal_attention)    # [B, S, N, D]
    elif implementation is not None:
      context = fused_attention(q, k, v, bias, implementation)                # [B, S, N, D]
    else:
      blocks = _kernels(c)
      dropout = blocks.Dropout(c.attention_probs_dropout_prob)
      context = blocks.attention(q, k, v, bias,
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
    x = _dense(c, c.hidden_size, axes, "dense")(x)
    x = _kernels(c).Dropout(c.hidden_dropout_prob)(x, deterministic=deterministic)
    return _layer_norm(c)(x + residual)


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
    x = _dense(c, c.intermediate_size, ("embed", "mlp"), "dense")(x)   # [B, S, 4H]
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
    return jnp.tanh(_dense(c, c.hidden_size, ("embed", "embed_out"), "dense")(first))


class BertModel(nn.Module):
  """The encoder. Returns a dict:

    sequence_output  [B, S, H]  final hidden states
    pooled_output    [B, H]     pooler on [CLS]
    hidden_states    [L+1, B, S, H] embeddings then every layer (only if output_hidden_states)
  """
  config: BertConfig
  add_pooling_layer: bool = True

  def setup(self):
    self.embeddings = BertEmbeddings(self.config)
    self.encoder = BertEncoder(self.config)
    if self.add_pooling_layer:
      self.pooler = BertPooler(self.config)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
               deterministic: bool = True, output_hidden_states: bool = False,
               cls_positions=None) -> Dict[str, Array]:
    """attention_mask: [B, S] padding mask, or [B, S, S] (block-diagonal for packed rows).
    cls_positions: [B, K] positions of each packed pair's [CLS] (pooled output [B, K, H])."""
    c = self.config
    check_inputs(c, input_ids, token_type_ids)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
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
    sequence_output, layers = self.encoder(x, bias, deterministic, output_hidden_states)
    outputs = {"sequence_output": sequence_output}
    if self.add_pooling_layer:
      last = None
      if c.causal_attention and attention_mask.ndim == 2:
        last = jnp.sum(attention_mask, axis=-1).astype(jnp.int32) - 1     # [B]
      outputs["pooled_output"] = self.pooler(sequence_output, cls_positions, last)
    if output_hidden_states:
      outputs["hidden_states"] = jnp.concatenate([x[None], layers], axis=0)
    return outputs

  def attend(self, hidden):
    return self.embeddings.attend(hidden)


def gather_positions(sequence: Array, positions: Array) -> Array:
  """[B, S, H] gathered at [B, P] -> [B, P, H]."""
  return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


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
    output_bias = self.param("output_bias", _zeros(("vocab",)), (c.vocab_size,), jnp.float32)
    return _kernels(c).add_bias(logits.astype(jnp.float32), output_bias)    # [..., V]


class _TransformModule(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, hidden):
    c = self.config
    h = _dense(c, c.hidden_size, ("embed", "embed_out"), "dense")(hidden)
    return _layer_norm(c)(activation(c)(h))


class BertPreTrainingHeads(nn.Module):
  """`cls/predictions` (masked LM) and `cls/seq_relationship` (NSP), as in the original."""
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output, pooled_output, masked_lm_positions, embedding_attend):
    hidden = sequence_output
    if masked_lm_positions is not None:
      hidden = gather_positions(sequence_output, masked_lm_positions)   # [B, P, H]
    mlm_logits = BertPredictions(self.config, name="predictions")(hidden, embedding_attend)
    nsp_logits = None
    if pooled_output is not None:
      nsp_logits = nn.Dense(2, dtype=jnp.float32, param_dtype=jnp.float32,
                            kernel_init=_kernel_init(self.config, ("embed", None)),
                            bias_init=_zeros((None,)), name="seq_relationship",
                            dot_general=_kernels(self.config).dense_dot_general)(pooled_output)
    return mlm_logits, nsp_logits


class BertForPreTraining(nn.Module):
  """Encoder + masked LM + next-sentence prediction heads.

  With `masked_lm_positions` [B, P] the MLM head sees only those positions (logits [B, P, V]);
  without, every position (logits [B, S, V]; the left-to-right ablation predicts every next
  token). `use_nsp=False` drops the NSP head (the "No NSP" ablation). Packed rows (several
  pairs per row) pass a block-diagonal [B, S, S] `attention_mask`, per-pair `position_ids` and
  `cls_positions` [B, K]; NSP is then classified per pair.
  """
  config: BertConfig
  use_nsp: bool = True

  def setup(self):
    self.bert = BertModel(self.config, add_pooling_layer=True)
    self.cls = BertPreTrainingHeads(self.config)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
               masked_lm_positions=None, position_ids=None, deterministic: bool = True,
               output_hidden_states: bool = False, cls_positions=None) -> Dict[str, Array]:
    outputs = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                        deterministic=deterministic, output_hidden_states=output_hidden_states,
                        cls_positions=cls_positions)
    pooled = outputs["pooled_output"] if self.use_nsp else None
    mlm_logits, nsp_logits = self.cls(outputs["sequence_output"], pooled, masked_lm_positions,
                                      self.bert.attend)
    outputs["mlm_logits"] = mlm_logits                        # [B, P or S, V] float32
    if nsp_logits is not None:
      outputs["nsp_logits"] = nsp_logits                      # [B, 2] or [B, K, 2] float32
    return outputs


def init_params(model: nn.Module, rng, seq_len: int = 8, **call_kwargs) -> Dict[str, Any]:
  """Initialised float32 parameters (logical-axis boxes removed)."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  variables = model.init({"params": rng}, ids, **call_kwargs)
  return nn.unbox(variables["params"])
