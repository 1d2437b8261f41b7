"""Layers every family shares, owned by none: activations, dense and norm layers with logical
axes, the attention bias and which attention path runs (`attention_kind`: XLA, splash, cuDNN),
batch sharding, the one-hot lookup of small tables, gathering positions, and parameter init.

Parameters are float32; computation runs in `config.dtype`. The building blocks (GELU, dropout,
dense products, attention, the word lookup, the MLM bias) come from
`kernels.select(config.kernels)`: the hand-tuned forms of `ops` or the textbook ones, per backend. Every parameter carries logical
axis names (`nn.with_logical_partitioning`) that `bert_jax.parallel.sharding` maps onto a mesh.
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
    return blocks(config).gelu
  if name in ("gelu_tanh", "gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
    return functools.partial(jax.nn.gelu, approximate=True)
  if name == "relu":
    return jax.nn.relu
  if name in ("silu", "swish"):
    return jax.nn.silu
  if name == "tanh":
    return jnp.tanh
  raise ValueError(f"Unknown hidden_act {name!r}")


def dtype_of(config: BertConfig):
  return jnp.dtype(config.dtype)


def blocks(config: BertConfig) -> kernels.Kernels:
  # Resolved while tracing, so "auto" picks the backend the model is compiled for.
  return kernels.select(config.kernels)


def kernel_init(config: BertConfig, axes):
  # The original initialiser: truncated normal with stddev initializer_range.
  init = nn.initializers.truncated_normal(stddev=config.initializer_range)
  return nn.with_logical_partitioning(init, axes)


def zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def ones(axes):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), axes)


def dense(config: BertConfig, features: int, axes, name: str) -> nn.Dense:
  return nn.Dense(features, dtype=dtype_of(config), param_dtype=jnp.float32,
                  kernel_init=kernel_init(config, axes), bias_init=zeros(axes[1:]), name=name,
                  dot_general=blocks(config).dense_dot_general)


def layer_norm(config: BertConfig, name: str = "LayerNorm") -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=dtype_of(config),
                      param_dtype=jnp.float32, scale_init=ones(("embed",)),
                      bias_init=zeros(("embed",)), name=name)


def check_inputs(config: BertConfig, input_ids, token_type_ids=None,
                 max_positions: Optional[int] = None) -> None:
  """Host-side validation with a clear message, before anything is traced or compiled.

  Inside `jit` an out-of-range id would silently gather a clamped row; this catches it first.
  Tracers (values unknown until run time) are skipped: only concrete arrays are checked.
  """
  if isinstance(input_ids, jax.core.Tracer):
    return
  ids = np.asarray(input_ids)
  if ids.ndim != 2:
    raise ValueError(f"input_ids must have shape [batch, seq_len], got {ids.shape}")
  # `max_positions`: the family's position table (None: rotary positions, no table).
  if max_positions is not None and ids.shape[1] > max_positions:
    raise ValueError(
        f"Sequence length {ids.shape[1]} exceeds the position table ({max_positions} "
        f"positions, max_position_embeddings={config.max_position_embeddings}); shorten "
        "max_seq_length.")
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


def one_hot_lookup(table, ids, dtype):
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
  """`jax.nn.dot_product_attention`: q, k, v [B, S, N, D], bias [B, 1, S or 1, S] ->
  [B, S, N, D]."""
  batch, seq_len, _, head_dim = q.shape
  bias = jnp.broadcast_to(bias, (batch, 1, seq_len, seq_len)).astype(q.dtype)  # [B, 1, S, S]
  return jax.nn.dot_product_attention(q, k, v, bias=bias, scale=1.0 / float(np.sqrt(head_dim)),
                                      implementation=implementation)


def gather_positions(sequence: Array, positions: Array) -> Array:
  """[B, S, H] gathered at [B, P] -> [B, P, H]."""
  return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


def init_params(model: nn.Module, rng, seq_len: int = 8, **call_kwargs) -> Dict[str, Any]:
  """Initialised float32 parameters (logical-axis boxes removed)."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  variables = model.init({"params": rng}, ids, **call_kwargs)
  return nn.unbox(variables["params"])
