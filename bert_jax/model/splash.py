"""Fused attention on TPU: the Pallas splash-attention kernel (`config.model.attention="splash"`).

softmax(q k^T / sqrt(D) + mask) v without writing the [B, N, S, S] logits and probabilities to
HBM: the kernel streams blocks of keys through the chip's vector memory (flash attention), so the
step's memory traffic for attention is that of q, k, v and the output. Its masks are segment
ids: a token attends to the keys of its own segment. BERT's padding mask is segment 1 for real
tokens and 0 for padding; packed rows (a [B, S, S] block-diagonal mask) give each pair its own
segment. Padding queries then attend to padding keys instead of to the real ones: their outputs
differ from the XLA path's, but no loss reads them (the heads read real positions), so losses
and gradients are the same (tests/test_splash_attention.py).

`window` gives sliding-window (local) attention, as ModernBERT's local layers: a query sees the
keys of its segment within `window` positions, by the library's `LocalMask`, so the kernel skips
the blocks outside the band (and takes blocks no wider than it, for there to be some to skip).

The stock kernel has no dropout on the attention probabilities, so `splash` requires
`attention_probs_dropout_prob=0` in training (`check`): a clear error otherwise.

The forward and backward passes are the library's kernel bodies in calls of ours that move one
value per position as one row where the library broadcasts it in HBM: the forward writes its
residual (the logsumexp per query row) as one float32 per row instead of a 128-lane block; all
three kernels read the segment ids as a [1, S] row, and the backward ones the logsumexp and
`di` as [N, 1, S] (see `_forward`, `_backward_dq`, `_backward_dkv`).

With `rotary` (the ModernBERT family) the kernels also apply the rotary positions to q and k
in vector memory, and the backward kernels turn dq and dk back ("rotary positions in the
kernels" below).

On CPU the same kernel runs in Pallas' interpret mode (slow; for tests). Under `jit` over a mesh
(`jax.sharding.use_mesh`, which `parallel.strategies` sets while tracing a step) the kernel runs
per device with `shard_map`: the batch split along `data`, the heads along `model`.
"""
import functools
from typing import Any, List, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib
from jax.sharding import PartitionSpec as P

from bert_jax.model import kernels

Array = Any
# The mesh axis names of bert_jax.parallel.sharding (the model layer does not import it).
_BATCH_AXES = ("data",)
_HEAD_AXIS = "model"
_BLOCKS = (512, 256, 128)   # the kernel's block sizes (its smallest is 128)


def check(config, deterministic: bool, seq_len=None) -> None:
  """Fails clearly where the kernel cannot compute what the config asks."""
  if seq_len is not None and seq_len % 128:
    raise ValueError(f"config.model.attention='splash' needs a sequence length that is a "
                     f"multiple of 128 (the kernel's block), got {seq_len}: use "
                     "--config.model.attention=xla")
  if not deterministic and config.attention_probs_dropout_prob > 0:
    raise ValueError(
        f"config.model.attention='splash' has no dropout on the attention probabilities, but "
        f"attention_probs_dropout_prob={config.attention_probs_dropout_prob}: set "
        "--config.model.attention_probs_dropout_prob=0 (measured on the TPU compiler in "
        "benchmarks/RESULTS.md) or use --config.model.attention=xla")


def segment_ids(attention_mask: Array) -> Array:
  """[B, S] segment ids from a padding mask [B, S] (1 real, 0 padding) or a block-diagonal mask
  [B, S, S] (each block: the position of its first key, plus one; rows with no key: 0)."""
  mask = attention_mask.astype(bool)
  if mask.ndim == 2:
    return mask.astype(jnp.int32)                                   # [B, S]
  first = jnp.argmax(mask, axis=-1).astype(jnp.int32)               # [B, S]
  return jnp.where(jnp.any(mask, axis=-1), first + 1, 0)           # [B, S]


def _block(seq_len: int, window: Optional[int] = None) -> int:
  """The kernel's block: the largest of `_BLOCKS` that divides `seq_len`; with a window, the
  largest no wider than the band (2 * window, at least 128), so that whole blocks outside the
  band exist to be skipped (a 512 block at window 64 computes 3 x 512 keys per query block for
  129 in the band, a 128 block 3 x 128)."""
  widest = max(_BLOCKS[-1], 2 * window) if window is not None else _BLOCKS[0]
  for block in _BLOCKS:
    if seq_len % block == 0 and block <= widest:
      return block
  raise ValueError(f"splash attention needs a sequence length that is a multiple of 128, "
                   f"got {seq_len}")


@functools.lru_cache(maxsize=32)
def _kernel_recipe(num_heads: int, seq_len: int, causal: bool, window: Optional[int]):
  """(mask, block sizes) of the kernel: plain hashable objects, tied to no trace."""
  shape = (seq_len, seq_len)
  if window is not None:
    # The library's own local mask: it is evaluated per block when the kernel is built, so the
    # kernel skips blocks wholly outside the band and masks inside the blocks that cross it.
    head_mask = mask_lib.LocalMask(shape, window_size=(window, 0 if causal else window),
                                   offset=0)
  elif causal:
    head_mask = mask_lib.CausalMask(shape)
  else:
    head_mask = mask_lib.FullMask(shape)
  block = _block(seq_len, window)
  sizes = kernel_lib.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                                block_q_dkv=block, block_kv_dkv=block,
                                block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  return mask_lib.MultiHeadMask([head_mask] * num_heads), sizes


def _kernel(num_heads: int, seq_len: int, causal: bool, interpret: bool,
            window: Optional[int] = None):
  """The splash kernel for one example: q [N, S, D], k, v [N, S, D], segment ids -> [N, S, D];
  with `window`, query i sees only keys j with |i - j| <= window (and j <= i if causal).

  Built anew by every call, never cached: `make_splash_mha` turns its block tables (which blocks
  to compute, skip or mask) into jnp arrays, which under a trace are that trace's values. A
  cached kernel, first built inside a train step's jit, handed that trace's tracers to the
  evaluation step's jit (UnexpectedTracerError at a pre-training run's first evaluation).
  Building the tables eagerly instead (`ensure_compile_time_eval`) fails where the default
  devices are compile-only (the compile report lowers for a TPU without one). What is costly,
  the numpy tables from the mask, the library caches itself (`mask_info._process_mask`, keyed
  by the hashable mask), so only the recipe is cached here and a call costs little."""
  mask, sizes = _kernel_recipe(num_heads, seq_len, causal, window)
  return kernel_lib.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                    interpret=interpret)


# ------------------------------------------------------------ the forward pass, its residual
# The library's forward kernel writes its residual, the logsumexp of every query row, as
# [N, S, 128] float32 (the row's value repeated across the 128 lanes), and its backward pass
# reads lane 0. Compiled for a v5litepod-8 (ModernBERT-base, 16 x 1,024 tokens per chip), that
# cost about 0.4 GB per layer: the kernel's 100 MB write, a 200 MB layout copy of it and a 100 MB
# read, for 0.8 MB of values (benchmarks/history/2026-11-26-modern-tpu.md). This forward pass
# runs the library's kernel body unchanged with that block in vector memory and writes only its
# first lane, transposed into a row of the [N, 1, S] array the backward kernels read; its
# running max, sum and output accumulator are scratch, not outputs. Its query segment ids come
# in as one row [1, S] and are laid down the rows of a [bq, 128] scratch block at each query
# block's first step, where the library reads a [S, 128] int32 array broadcast in HBM for it
# (8.4 MB written and read per layer at 16 x 1,024 tokens: 0.55 GB of ModernBERT-base's step).


def _lay_down(row_ref, block_ref):
  """Segment ids of one block from a [1, b] row into the [b, 128] block (each id repeated along
  the lanes) that the library's kernel bodies read: a transpose in vector memory instead of an
  [S, 128] int32 array in HBM."""
  row = row_ref[...]                                                        # [1, b]
  block_ref[...] = jnp.broadcast_to(row, (block_ref.shape[-1], row.shape[-1])).T   # [b, 128]


# ------------------------------------------------------------ rotary positions in the kernels
# With `rotary` (ModernBERT on TPU), q and k come in unrotated and q unscaled: each kernel turns
# the blocks it reads by their positions' angles in vector memory (q once per query block, k at
# every step that reads it, the angles computed there from the position ids), and the backward
# kernels turn dq and dk back before writing them. XLA's passes over q and k that did it before
# the kernels, and over dq and dk after them, are gone (4.8 GB a step of ModernBERT-base on a
# v5litepod-8). The function is the model's `apply_rotary` then the 1/sqrt(D) scale of q.


class Rotary(NamedTuple):
  positions: Array     # [B, S] int32: each token's position in its sequence
  inv_freq: Array      # [D] float32: the rotary frequencies, repeated in both halves


def _turned(x, positions_row, inv_freq_row, direction: float):
  """x [b, D] turned by its rows' angles: positions_row [1, b] int32, inv_freq_row [1, 128]
  float32 (the D frequencies, then zeros); direction -1 turns back (the transpose). In float32,
  returned in x's dtype. The halves are swapped by a product with the [D, D] permutation, as
  `_turn` does on TPU."""
  rows, dim = x.shape
  lanes = inv_freq_row.shape[-1]
  positions = jnp.broadcast_to(positions_row.astype(jnp.float32), (lanes, rows)).T  # [b, 128]
  angles = positions * inv_freq_row                                                # [b, 128]
  cos, sin = jnp.cos(angles)[:, :dim], jnp.sin(angles)[:, :dim]                    # [b, D]
  lane = jax.lax.broadcasted_iota(jnp.int32, (1, dim), 1)
  sign = jnp.where(lane < dim // 2, -direction, direction).astype(jnp.float32)     # [1, D]
  row, column = (jax.lax.broadcasted_iota(jnp.int32, (dim, dim), d) for d in (0, 1))
  swap = (column == (row + dim // 2) % dim).astype(x.dtype)                        # [D, D]
  swapped = jnp.dot(x, swap, preferred_element_type=jnp.float32)                  # (x2, x1)
  return x.astype(jnp.float32) * cos + swapped * (sin * sign)


def _rotary_operands(rotary: Optional[Rotary], q_block, k_block, bq: int, bkv: int):
  """The query rows' and key rows' positions ([1, S] rows) and the frequencies ([1, 128]), with
  their block specs (index maps `q_block`, `k_block` give the block along S), as `_Operands`;
  None x 3 without rotary."""
  if rotary is None:
    return _Operands([None] * 3, (None,) * 3)
  row = rotary.positions[None, :]                                                  # [1, S]
  lanes = kernel_lib.NUM_LANES
  if rotary.inv_freq.shape[-1] > lanes:
    raise ValueError(f"splash attention turns rotary positions for heads of at most {lanes} "
                     f"dimensions, got {rotary.inv_freq.shape[-1]}")
  freqs = jnp.zeros((1, lanes), jnp.float32).at[0, :rotary.inv_freq.shape[-1]].set(
      rotary.inv_freq)                                                             # [1, 128]
  return _Operands([pl.BlockSpec((1, bq), lambda *a: (0, q_block(*a))),
                    pl.BlockSpec((1, bkv), lambda *a: (0, k_block(*a))),
                    pl.BlockSpec((1, lanes), lambda *_: (0, 0))], (row, row, freqs))


def _turn_into(scratch, ref, positions_ref, freqs_ref, scale: float = 1.0):
  scratch[...] = (_turned(ref[...], positions_ref[...], freqs_ref[...], 1.0)
                  * scale).astype(scratch.dtype)


def _turn_back(ref, positions_ref, freqs_ref, scale: float = 1.0):
  ref[...] = (_turned(ref[...], positions_ref[...], freqs_ref[...], -1.0)
              * scale).astype(ref.dtype)


def _forward_kernel(data_next_ref, block_mask_ref, mask_next_ref, q_ref, k_ref, v_ref,
                    q_segment_row_ref, kv_segment_ids_ref, mask_ref, q_sequence_ref,
                    q_positions_ref, k_positions_ref, freqs_ref,
                    o_ref, logsumexp_ref, m_scratch, l_scratch, o_scratch, rows_scratch,
                    q_segment_ids_scratch, q_turned, k_turned, *, grid_width: int,
                    scale: float, **options):
  @pl.when(pl.program_id(2) == 0)   # a query block's first step
  def _():
    _lay_down(q_segment_row_ref, q_segment_ids_scratch)
    if freqs_ref is not None:
      _turn_into(q_turned, q_ref, q_positions_ref, freqs_ref, scale)

  if freqs_ref is not None:
    _turn_into(k_turned, k_ref, k_positions_ref, freqs_ref)
    q_ref, k_ref = q_turned, k_turned
  kernel_lib.flash_attention_kernel(
      data_next_ref, block_mask_ref, mask_next_ref, q_ref, k_ref, v_ref, q_segment_ids_scratch,
      kv_segment_ids_ref, None, mask_ref, q_sequence_ref, m_scratch, l_scratch, o_scratch,
      o_ref, rows_scratch, grid_width=grid_width, **options)

  @pl.when(pl.program_id(2) == grid_width - 1)
  def _():
    logsumexp_ref[...] = rows_scratch[...].T[:1]                 # [bq, 128] -> [1, bq]


class _Operands(NamedTuple):
  specs: List[Any]          # a block spec per array (None for an absent one)
  arrays: Tuple[Any, ...]


def _rows(h, i, j, *_):
  return h, i, 0


def _query_major(mask_info, q, k, v, segment_ids, bq: int, bkv: int):
  """What the forward and dq calls share, walking the grid (heads, query blocks, the key blocks
  the mask leaves): the operands that lead the call (q, k, v [N, S, D], the query ids as a
  [1, S] row, the key ids [8, S]) and those that end it (the partial-mask blocks and the mask's
  q_sequence, each None where the mask has none), with their block specs; and the grid."""
  heads, seq_len, head_dim = q.shape
  lanes, sublanes = kernel_lib.NUM_LANES, kernel_lib.NUM_SUBLANES

  def next_block(h, i, j, data_next_ref, block_mask_ref, mask_next_ref=None):
    return kernel_lib._next_nonzero(h, i, j, data_next_ref, block_mask_ref, mask_next_ref)

  keys = lambda h, i, j, *refs: (h, next_block(h, i, j, *refs)[0], 0)
  lead = _Operands(
      [pl.BlockSpec((None, bq, head_dim), _rows), pl.BlockSpec((None, bkv, head_dim), keys),
       pl.BlockSpec((None, bkv, head_dim), keys), pl.BlockSpec((1, bq), lambda h, i, j, *_: (0, i)),
       pl.BlockSpec((sublanes, bkv), lambda h, i, j, *refs: (0, keys(h, i, j, *refs)[1]))],
      (q, k, v, segment_ids.q[None, :],
       jax.lax.broadcast_in_dim(segment_ids.kv, (sublanes, seq_len), (1,))))
  partial, q_sequence = mask_info.partial_mask_blocks, mask_info.q_sequence
  tail = _Operands(
      [None if partial is None else pl.BlockSpec(
          (None, bq, bkv), lambda h, i, j, *refs: (next_block(h, i, j, *refs)[1], 0, 0)),
       None if q_sequence is None else pl.BlockSpec((bq, lanes), lambda h, i, j, *_: (i, 0))],
      (partial, None if q_sequence is None else
       jax.lax.broadcast_in_dim(q_sequence, (seq_len, lanes), (0,))))
  grid_width = (mask_info.data_next.shape[-1] if mask_info.data_next is not None
                else seq_len // bkv)
  key_block = lambda h, i, j, *refs: keys(h, i, j, *refs)[1]
  return lead, tail, (heads, seq_len // bq, grid_width), key_block


def _rotary_scratch(rotary, q, bq: int, bkv: int):
  """Vector-memory blocks for the turned q and k (unused without rotary)."""
  rows = (bq, bkv) if rotary is not None else (8, 8)
  return [pltpu.VMEM((rows[0], q.shape[-1]), q.dtype), pltpu.VMEM((rows[1], q.shape[-1]), q.dtype)]


def _forward(mask_info, q, k, v, segment_ids, sizes, mask_function, interpret: bool,
             rotary: Optional[Rotary] = None, scale: float = 1.0):
  """The library's `_splash_attention_forward` with save_residuals, for multi-head attention
  without sinks or a soft cap: q, k, v [N, S, D] -> out [N, S, D], logsumexp [N, S] float32.
  It calls the library's kernel body and block logic (jax 0.10.2): after a jax upgrade, run
  tests/test_splash_attention.py (interpret mode) and a `--compile_for` (the TPU lowering)."""
  heads, seq_len, head_dim = q.shape
  bq, bkv, bkv_compute = sizes.block_q, sizes.block_kv, sizes.block_kv_compute
  lanes = kernel_lib.NUM_LANES

  lead, tail, grid, key_block = _query_major(mask_info, q, k, v, segment_ids, bq, bkv)
  turns = _rotary_operands(rotary, lambda h, i, j, *_: i, key_block, bq, bkv)
  out, logsumexp = pl.pallas_call(
      functools.partial(_forward_kernel, mask_value=kernel_lib.DEFAULT_MASK_VALUE, scale=scale,
                        grid_width=grid[-1], bq=bq, bkv=bkv, bkv_compute=bkv_compute,
                        head_dim_v=head_dim, q_layout=sizes.q_layout, k_layout=sizes.k_layout,
                        v_layout=sizes.v_layout, attn_logits_soft_cap=None,
                        mask_function=mask_function),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3, in_specs=lead.specs + tail.specs + turns.specs,
          out_specs=[pl.BlockSpec((None, bq, head_dim), _rows),
                     pl.BlockSpec((None, 1, bq), lambda h, i, j, *_: (h, 0, i))],
          scratch_shapes=[pltpu.VMEM((bq, lanes), jnp.float32),
                          pltpu.VMEM((bq, lanes), jnp.float32),
                          pltpu.VMEM((bq, head_dim), jnp.float32),
                          pltpu.VMEM((bq, lanes), jnp.float32),
                          pltpu.VMEM((bq, lanes), segment_ids.q.dtype),
                          *_rotary_scratch(rotary, q, bq, bkv)],
          grid=grid),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "arbitrary", "arbitrary")),
      out_shape=[jax.ShapeDtypeStruct((heads, seq_len, head_dim), q.dtype),
                 jax.ShapeDtypeStruct((heads, 1, seq_len), jnp.float32)],
      name="splash_mha_fwd_segmented_row_residuals", interpret=interpret,
  )(mask_info.data_next, mask_info.block_mask, mask_info.mask_next, *lead.arrays, *tail.arrays,
    *turns.arrays)
  return out, logsumexp[:, 0]                                      # [N, S, D], [N, S]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _attention(sizes, mask_function, interpret, scale, fwd_info, dq_info, dkv_info, q, k, v,
               segment_ids, rotary):
  return _forward(fwd_info, q, k, v, segment_ids, sizes, mask_function, interpret, rotary,
                  scale)[0]


def _attention_forward(sizes, mask_function, interpret, scale, fwd_info, dq_info, dkv_info, q,
                       k, v, segment_ids, rotary):
  out, logsumexp = _forward(fwd_info, q, k, v, segment_ids, sizes, mask_function, interpret,
                            rotary, scale)
  return out, (q, k, v, segment_ids, rotary, out, logsumexp, dq_info, dkv_info)


# ------------------------------------------------------------------------ the backward pass
# The library's backward kernel bodies (dq; dk and dv) in calls of ours, for the same reason as
# the forward's: the library broadcasts in HBM, per call, the segment ids along 128 lanes
# ([S, 128] int32: the dq kernel's query ids, the dkv kernel's key ids) and the dkv kernel's
# logsumexp and `di` along 8 sublanes ([N, 8, S] float32), each written and read again for one
# value per position. Here the ids come in as a [1, S] row laid down in vector memory
# (`_lay_down`), the logsumexp and `di` as [N, 1, S] blocks of one row (the dkv body reads row 0
# only), and the dk/dv accumulators are scratch instead of outputs.


def _dq_kernel(data_next_ref, block_mask_ref, mask_next_ref, q_ref, k_ref, v_ref,
               q_segment_row_ref, kv_segment_ids_ref, logsumexp_ref, do_ref, di_ref, mask_ref,
               q_sequence_ref, q_positions_ref, k_positions_ref, freqs_ref, dq_ref, dq_scratch,
               q_segment_ids_scratch, q_turned, k_turned, *, grid_width: int, scale: float,
               **options):
  @pl.when(pl.program_id(2) == 0)   # a query block's first step
  def _():
    _lay_down(q_segment_row_ref, q_segment_ids_scratch)
    if freqs_ref is not None:
      _turn_into(q_turned, q_ref, q_positions_ref, freqs_ref, scale)

  if freqs_ref is not None:
    _turn_into(k_turned, k_ref, k_positions_ref, freqs_ref)
  kernel_lib._flash_attention_dq_kernel(
      data_next_ref, block_mask_ref, mask_next_ref,
      q_turned if freqs_ref is not None else q_ref, k_turned if freqs_ref is not None else k_ref,
      v_ref, q_segment_ids_scratch, kv_segment_ids_ref, None, logsumexp_ref, do_ref, di_ref,
      mask_ref, q_sequence_ref, dq_scratch, dq_ref, grid_width=grid_width, **options)

  if freqs_ref is not None:
    @pl.when(pl.program_id(2) == grid_width - 1)   # dq written: back to the unturned q's
    def _():
      _turn_back(dq_ref, q_positions_ref, freqs_ref, scale)


def _dkv_kernel(data_next_ref, block_mask_ref, mask_next_ref, q_ref, k_ref, v_ref,
                q_segment_ids_ref, kv_segment_row_ref, logsumexp_ref, do_ref, di_ref, mask_ref,
                q_sequence_ref, q_positions_ref, k_positions_ref, freqs_ref, dk_ref, dv_ref,
                dk_scratch, dv_scratch, kv_segment_ids_scratch, q_turned, k_turned, *,
                grid_width: int, scale: float, **options):
  @pl.when((pl.program_id(1) == 0) & (pl.program_id(2) == 0))   # a key block's first step
  def _():
    _lay_down(kv_segment_row_ref, kv_segment_ids_scratch)

  if freqs_ref is not None:
    @pl.when(pl.program_id(2) == 0)   # a (key block, head)'s first step
    def _():
      _turn_into(k_turned, k_ref, k_positions_ref, freqs_ref)

    _turn_into(q_turned, q_ref, q_positions_ref, freqs_ref, scale)
  kernel_lib._flash_attention_dkv_kernel(
      data_next_ref, block_mask_ref, mask_next_ref,
      q_turned if freqs_ref is not None else q_ref, k_turned if freqs_ref is not None else k_ref,
      v_ref, q_segment_ids_ref, kv_segment_ids_scratch, None, logsumexp_ref, do_ref, di_ref,
      mask_ref, q_sequence_ref, None, dk_scratch, dv_scratch, None, dk_ref, dv_ref,
      grid_width=grid_width, **options)

  if freqs_ref is not None:
    @pl.when(pl.program_id(2) == grid_width - 1)   # dk written: back to the unturned k's
    def _():
      _turn_back(dk_ref, k_positions_ref, freqs_ref)


def _backward_dq(mask_info, q, k, v, segment_ids, logsumexp, do, di, sizes, mask_function,
                 interpret: bool, rotary: Optional[Rotary] = None, scale: float = 1.0):
  """The library's `_splash_attention_bwd_dq` for multi-head attention without sinks or a soft
  cap: [N, S, D] operands, logsumexp and di [N, 1, S] -> dq [N, S, D]."""
  head_dim = q.shape[-1]
  bq, bkv = sizes.block_q_dq, sizes.block_kv_dq
  lead, tail, grid, key_block = _query_major(mask_info, q, k, v, segment_ids, bq, bkv)
  turns = _rotary_operands(rotary, lambda h, i, j, *_: i, key_block, bq, bkv)
  per_row = pl.BlockSpec((None, 1, bq), lambda h, i, j, *_: (h, 0, i))   # logsumexp, di
  in_specs = [*lead.specs, per_row, pl.BlockSpec((None, bq, head_dim), _rows), per_row,
              *tail.specs, *turns.specs]
  return pl.pallas_call(
      functools.partial(_dq_kernel, mask_value=kernel_lib.DEFAULT_MASK_VALUE, scale=scale,
                        grid_width=grid[-1], bq=bq, bkv=bkv, attn_logits_soft_cap=None,
                        q_layout=sizes.q_layout, k_layout=sizes.k_layout,
                        v_layout=sizes.v_layout, mask_function=mask_function),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3, in_specs=in_specs,
          out_specs=pl.BlockSpec((None, bq, head_dim), _rows),
          scratch_shapes=[pltpu.VMEM((bq, head_dim), jnp.float32),
                          pltpu.VMEM((bq, kernel_lib.NUM_LANES), segment_ids.q.dtype),
                          *_rotary_scratch(rotary, q, bq, bkv)],
          grid=grid),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("arbitrary", "arbitrary", "arbitrary")),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      name="splash_mha_dq_segmented_row_ids", interpret=interpret,
  )(mask_info.data_next, mask_info.block_mask, mask_info.mask_next, *lead.arrays, logsumexp, do,
    di, *tail.arrays, *turns.arrays)


def _backward_dkv(mask_info, q, k, v, segment_ids, logsumexp, do, di, sizes, mask_function,
                  interpret: bool, rotary: Optional[Rotary] = None, scale: float = 1.0):
  """The library's `_splash_attention_bwd_dkv` (unfused: no dq) for multi-head attention
  without sinks or a soft cap: [N, S, D] operands, logsumexp and di [N, 1, S] -> dk, dv."""
  heads, seq_len, head_dim = q.shape
  bq, bkv, bkv_compute = sizes.block_q_dkv, sizes.block_kv_dkv, sizes.block_kv_dkv_compute
  lanes, sublanes = kernel_lib.NUM_LANES, kernel_lib.NUM_SUBLANES

  def next_block(kv, h, i, *refs):   # the grid walks key blocks outermost
    return kernel_lib._next_nonzero(h, i, kv, *refs[:3], next_i=True)

  queries = lambda kv, h, i, *refs: (h, next_block(kv, h, i, *refs)[0], 0)
  keys = lambda kv, h, i, *_: (h, kv, 0)
  per_row = pl.BlockSpec((None, 1, bq), lambda kv, h, i, *refs: (h, 0, queries(kv, h, i,
                                                                                *refs)[1]))
  query_ids = pl.BlockSpec((sublanes, bq), lambda kv, h, i, *refs: (0, queries(kv, h, i,
                                                                              *refs)[1]))
  in_specs = [pl.BlockSpec((None, bq, head_dim), queries),
              pl.BlockSpec((None, bkv, head_dim), keys), pl.BlockSpec((None, bkv, head_dim), keys),
              query_ids, pl.BlockSpec((1, bkv), lambda kv, h, i, *_: (0, kv)),
              per_row, pl.BlockSpec((None, bq, head_dim), queries), per_row]
  q_ids = jax.lax.broadcast_in_dim(segment_ids.q, (sublanes, seq_len), (1,))     # [8, S]
  partial = mask_info.partial_mask_blocks
  in_specs.append(None if partial is None else pl.BlockSpec(
      (None, bkv, bq), lambda kv, h, i, *refs: (next_block(kv, h, i, *refs)[1], 0, 0)))
  q_sequence = None
  if mask_info.q_sequence is not None:
    q_sequence = jax.lax.broadcast_in_dim(mask_info.q_sequence, (sublanes, seq_len), (1,))
    in_specs.append(query_ids)
  else:
    in_specs.append(None)
  grid_width = (mask_info.data_next.shape[-2] if mask_info.data_next is not None
                else seq_len // bq)
  turns = _rotary_operands(rotary, lambda kv, h, i, *refs: queries(kv, h, i, *refs)[1],
                           lambda kv, h, i, *_: kv, bq, bkv)
  in_specs += turns.specs
  return pl.pallas_call(
      functools.partial(_dkv_kernel, num_q_heads=heads, num_kv_heads=heads, scale=scale,
                        mask_value=kernel_lib.DEFAULT_MASK_VALUE, grid_width=grid_width, bq=bq,
                        bkv_compute=bkv_compute, is_mqa=False, attn_logits_soft_cap=None,
                        q_layout=sizes.q_layout, k_layout=sizes.k_layout,
                        v_layout=sizes.v_layout, bkv=bkv, mask_function=mask_function),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3, in_specs=in_specs,
          out_specs=[pl.BlockSpec((None, bkv, head_dim), keys)] * 2,
          scratch_shapes=[pltpu.VMEM((bkv, head_dim), jnp.float32),
                          pltpu.VMEM((bkv, head_dim), jnp.float32),
                          pltpu.VMEM((bkv, lanes), segment_ids.kv.dtype),
                          *_rotary_scratch(rotary, q, bq, bkv)],
          grid=(seq_len // bkv, heads, grid_width)),
      # All sequential, as the library's: dk and dv are sums over heads' query blocks.
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("arbitrary", "arbitrary", "arbitrary")),
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      name="splash_mha_dkv_segmented_row_ids", interpret=interpret,
  )(mask_info.data_next, mask_info.block_mask, mask_info.mask_next, q, k, v, q_ids,
    segment_ids.kv[None, :], logsumexp, do, di, partial, q_sequence, *turns.arrays)


def _attention_backward(sizes, mask_function, interpret, scale, residuals, g):
  q, k, v, segment_ids, rotary, out, logsumexp, dq_info, dkv_info = residuals
  di = jnp.einsum("hsd,hsd->hs", out.astype(jnp.float32), g.astype(jnp.float32))   # [N, S]
  one_row = lambda x: x[:, None, :]                                                # [N, 1, S]
  operands = (q, k, v, segment_ids, one_row(logsumexp), g, one_row(di), sizes, mask_function,
              interpret, rotary, scale)
  dk, dv = _backward_dkv(dkv_info, *operands)
  dq = _backward_dq(dq_info, *operands)
  return None, None, None, dq, dk, dv, None, None


_attention.defvjp(_attention_forward, _attention_backward)


def _attend(q, k, v, segments, positions, inv_freq, causal: bool, window: Optional[int] = None,
            scale: float = 1.0):
  """q, k, v [B, N, S, D], segments [B, S] -> [B, N, S, D], on one device; q already scaled, or
  with rotary (positions [B, S], inv_freq [D]) unrotated, unscaled and turned and scaled by
  `scale` in the kernels."""
  _, heads, seq_len, _ = q.shape
  # Interpret mode wherever the program is not for a TPU (compiled *for* a TPU on a CPU host by
  # the compile report, it is the real kernel).
  kernel = _kernel(heads, seq_len, causal, kernels.target_backend() != "tpu", window)
  options = kernel.kwargs
  # As the library's `_splash_attention`: partial-mask blocks [..., bq, bkv] with their leading
  # axes collapsed.
  collapse = lambda info: (info if info is None or info.partial_mask_blocks is None else
                           info._replace(partial_mask_blocks=info.partial_mask_blocks.reshape(
                               -1, *info.partial_mask_blocks.shape[-2:])))
  infos = [collapse(info) for info in (kernel.fwd_mask_info, kernel.dq_mask_info,
                                       kernel.dkv_mask_info)]

  def one(q, k, v, segments, positions):                          # [N, S, D], [S], [S]
    rotary = None if positions is None else Rotary(positions, inv_freq)
    return _attention(options["block_sizes"], options["mask_function"], options["interpret"],
                      scale, *infos, q, k, v, kernel_lib.SegmentIds(q=segments, kv=segments),
                      rotary)

  return jax.vmap(one, in_axes=(0, 0, 0, 0, None if positions is None else 0))(
      q, k, v, segments, positions)


def _mesh_axes(mesh, names):
  present = tuple(n for n in names if n in mesh.axis_names and mesh.shape[n] > 1)
  return present or None


def splash_attention(q, k, v, segments, causal: bool = False, window: Optional[int] = None):
  """softmax(q k^T / sqrt(D) + mask) v: q, k, v [B, S, N, D], segments [B, S] (`segment_ids`)
  -> [B, S, N, D] (see the module docstring for padding positions).

  `window`: sliding-window (local) attention, query i sees keys j with |i - j| <= window, within
  its segment (transformers' ModernBERT: window = local_attention // 2, so local_attention=128
  is window 64, 129 keys wide); None: every key of the segment."""
  heads_first = lambda t: t.transpose(0, 2, 1, 3)                          # [B, N, S, D]
  context = splash_attention_heads_first(heads_first(q), heads_first(k), heads_first(v),
                                         segments, causal, window)
  return context.transpose(0, 2, 1, 3)                                      # [B, S, N, D]


def splash_attention_heads_first(q, k, v, segments, causal: bool = False,
                                 window: Optional[int] = None, rotary: Optional[Rotary] = None):
  """`splash_attention` in the kernel's own layout: q, k, v [B, N, S, D] -> [B, N, S, D]. A model
  that projects straight into this layout (the ModernBERT family on TPU) writes no transposes.
  With `rotary` (positions [B, S], inv_freq [D]), q and k are turned by their rotary positions
  inside the kernels (see "rotary positions in the kernels")."""
  if window is not None and window < 0:
    raise ValueError(f"splash attention's window must be >= 0, got {window}")
  head_dim = q.shape[-1]
  scale = (1.0 / np.sqrt(head_dim)).astype(np.float32)
  if rotary is None:
    q = q * scale.astype(q.dtype)                                           # [B, N, S, D]
    positions, inv_freq = None, None
  else:
    positions = jnp.broadcast_to(rotary.positions, segments.shape).astype(jnp.int32)  # [B, S]
    inv_freq = jnp.asarray(rotary.inv_freq, jnp.float32)                    # [D]
  attend = functools.partial(_attend, causal=causal, window=window,
                             scale=1.0 if rotary is None else float(scale))
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and mesh.size > 1:
    batch, heads = _mesh_axes(mesh, _BATCH_AXES), _mesh_axes(mesh, (_HEAD_AXIS,))
    heads = heads[0] if heads else None
    qkv_spec, ids_spec = P(batch, heads, None, None), P(batch, None)
    attend = jax.shard_map(
        attend, mesh=mesh, out_specs=qkv_spec, check_vma=False,
        in_specs=(qkv_spec, qkv_spec, qkv_spec, ids_spec,
                  None if positions is None else ids_spec, None if inv_freq is None else P()))
  return attend(q, k, v, segments, positions, inv_freq)                     # [B, N, S, D]


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int,
                    causal: bool = False, window: Optional[int] = None) -> float:
  """The training FLOPs of the two attention products (forward 2, backward 4 matmuls of
  2*B*N*S*K*D each, K keys per query row): what XLA's cost analysis does not see inside the
  custom call. K is S, or with a `window` the band, approximated as min(S, 2*window+1) keys per
  row (exact away from the sequence's ends; rows near them see fewer, and the kernel computes
  whole blocks that cross the band's edges). Causal halves K (without a window) or keeps the
  band's left half, min(S, window+1)."""
  if window is None:
    keys = seq_len * (0.5 if causal else 1.0)
  else:
    keys = min(seq_len, (window + 1) if causal else (2 * window + 1))
  forward = 2 * 2.0 * batch * heads * seq_len * keys * head_dim
  return 3 * forward
