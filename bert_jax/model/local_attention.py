"""Sliding-window (local) attention as XLA ops: a band of the [S, S] logits, or blocks.

A local layer's query at position i sees the keys j with |i - j| <= window (transformers'
ModernBERT: window = local_attention // 2), among the keys the padding or packing mask allows.

- `banded_bias`: the band added to the full mask. Simple, and what short sequences use: the
  [S, S] logits exist anyway for the global layers.
- `blocked_attention`: the queries in blocks of C >= window positions; block b attends to key
  blocks b-1, b, b+1 only, so the logits are [S, 3C] instead of [S, S]. At 8,192 tokens with a
  128-token window that is 384 keys a query instead of 8,192 (21x less memory and work on the
  local layers); used from `use_blocks` on (`BLOCKS_FROM`).

Both compute the same function as the band of the full matrix (tests/test_modern_model.py).

Shape letters: B batch, S sequence, N heads, D head dim, K blocks (S / C), C block length.
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

Array = Any
_MASK_VALUE = -1e9       # as layers': masked keys contribute exactly zero, also in bfloat16
_BLOCK_MULTIPLE = 128    # block lengths are multiples of a TPU lane width


def block_length(window: int) -> int:
  """C: the smallest multiple of 128 that holds a window's one side."""
  return _BLOCK_MULTIPLE * max(1, -(-window // _BLOCK_MULTIPLE))


# cuDNN's fused kernel takes the band as a dense [S, S] bias (through jax it has no two-sided
# window) and is still the faster local layer at 1,024 tokens on an H200 (ModernBERT-base, 9.2
# steps/s against 6.4 for XLA); at 8,192 it computes 64x the band's work, so from here on the
# local layers take the blocks and only the global layers cuDNN
# (benchmarks/history/2026-11-26-gpu-modern.md).
CUDNN_BAND_MAX_TOKENS = 2048

# XLA: the local layers go by blocks from this many blocks per row on. Below it the full [S, S]
# band computes under 2.7x the blocks' logits, in fewer and larger products and without the
# blocks' copies and masks: on a 2-core Xeon the CPU step (`benchmarks/pretrain_step_throughput.py
# --family=modernbert`) ran 1.10x faster banded at 4 blocks (512 tokens), 1.05x slower at 8
# (1,024) and 1.22x slower at 16 (benchmarks/history/2026-11-25-modern-cpu-step.md).
BLOCKS_FROM = 8


def use_blocks(seq_len, window: int, kind: str = "xla") -> bool:
  """Whether local layers attend by blocks under attention `kind` ("xla" or "cudnn"). XLA:
  from `BLOCKS_FROM` blocks per row on (1,024 tokens for windows up to 128); cuDNN: past
  `CUDNN_BAND_MAX_TOKENS`. A symbolic length (an export for any length) takes the band: blocks
  need a static one."""
  if not isinstance(seq_len, int) or seq_len < BLOCKS_FROM * block_length(window):
    return False
  return kind == "xla" or (kind == "cudnn" and seq_len > CUDNN_BAND_MAX_TOKENS)


def banded_bias(bias: Array, seq_len: int, window: int) -> Array:
  """The additive mask `bias` [B, 1, S or 1, S] restricted to |i - j| <= window: [B, 1, S, S]."""
  # iota rather than numpy: `seq_len` may be symbolic (a serving export for any length).
  rows = jax.lax.broadcasted_iota(jnp.int32, (seq_len, seq_len), 0)
  cols = jax.lax.broadcasted_iota(jnp.int32, (seq_len, seq_len), 1)
  band = jnp.abs(rows - cols) <= window                                         # [S, S]
  return jnp.where(band[None, None], bias, _MASK_VALUE).astype(bias.dtype)


def _blocks_with_neighbours(x: Array, blocks: int, length: int) -> Array:
  """x [B, K*C, ...] -> [B, K, 3C, ...]: each block with its left and right neighbour (zeros
  beyond the ends)."""
  x = x.reshape((x.shape[0], blocks, length) + x.shape[2:])                     # [B, K, C, ...]
  pad = [(0, 0), (1, 1)] + [(0, 0)] * (x.ndim - 2)
  x = jnp.pad(x, pad)                                                           # [B, K+2, C, ...]
  return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)            # [B, K, 3C, ...]


def blocked_attention(q, k, v, segments, window: int, dropout: Callable,
                      float32_logits: bool = True):
  """Local softmax attention by blocks: q, k, v [B, S, N, D], segments [B, S] (0 = padding; a
  query sees keys of its own segment, a padding query every real key, as the full mask's key
  masking does) -> [B, S, N, D]. `dropout` acts on the probabilities."""
  batch, seq_len, heads, head_dim = q.shape
  length = block_length(window)
  blocks = -(-seq_len // length)
  padded = blocks * length
  if padded != seq_len:
    extra = [(0, 0), (0, padded - seq_len), (0, 0), (0, 0)]
    q, k, v = jnp.pad(q, extra), jnp.pad(k, extra), jnp.pad(v, extra)
    segments = jnp.pad(segments, [(0, 0), (0, padded - seq_len)])       # padding: segment 0
  q = q.reshape(batch, blocks, length, heads, head_dim) / jnp.sqrt(head_dim).astype(q.dtype)
  k = _blocks_with_neighbours(k, blocks, length)                        # [B, K, 3C, N, D]
  v = _blocks_with_neighbours(v, blocks, length)                        # [B, K, 3C, N, D]
  seg_q = segments.reshape(batch, blocks, length)                       # [B, K, C]
  seg_k = _blocks_with_neighbours(segments, blocks, length)             # [B, K, 3C]

  q_pos = np.arange(padded).reshape(blocks, length)                     # [K, C]
  k_pos = q_pos[:, :1] - length + np.arange(3 * length)[None]           # [K, 3C]
  band = np.abs(q_pos[:, :, None] - k_pos[:, None, :]) <= window       # [K, C, 3C]
  allowed = (jnp.asarray(band)[None] & (seg_k[:, :, None, :] > 0)
             & ((seg_q[..., None] == seg_k[:, :, None, :]) | (seg_q[..., None] == 0)))
  bias = jnp.where(allowed, 0.0, _MASK_VALUE)[:, None]                  # [B, 1, K, C, 3C]

  logits = jnp.einsum("bkcnd,bkjnd->bnkcj", q, k,
                      preferred_element_type=jnp.float32 if float32_logits else q.dtype)
  logits = logits.astype(jnp.float32) + bias                            # [B, N, K, C, 3C]
  probs = dropout(jax.nn.softmax(logits, axis=-1).astype(v.dtype))
  context = jnp.einsum("bnkcj,bkjnd->bkcnd", probs, v)                  # [B, K, C, N, D]
  return context.reshape(batch, padded, heads, head_dim)[:, :seq_len]   # [B, S, N, D]
