"""The ModernBERT family in Flax Linen: the encoder and its masked-LM head.

What differs from the 2018 block (`bert_jax/model/post_ln.py`), as transformers'
`ModernBertModel` computes it
(Warner et al. 2024):
- pre-norm blocks, x + attn(norm(x)) then x + mlp(norm(x)), LayerNorm without bias (RMSNorm as
  an option); the first layer's attention norm is skipped (the embedding norm precedes it);
  an embedding norm and a final norm;
- a GLU MLP: Wi [H, 2I] -> act(first half) * second half -> Wo (GeGLU with gelu, SwiGLU with silu);
- rotary positions on q and k, one base for global and one for local layers; no position
  table, no token types;
- alternating attention: layers 0, N, 2N, ... global, the others within a sliding window of
  `local_attention` tokens in total (|i - j| <= local_attention // 2);
- no biases unless asked (`attention_bias`, `mlp_bias`, `norm_bias`), ModernBERT's
  initialisation, and its MLM head: dense -> activation -> norm -> the tied decoder plus a bias.

The modules keep the call signature and the top-level parameter names of BERT's (`post_ln`)
(`bert/...` for the encoder, `cls/predictions/...` for the head), so that the pre-training job,
the fine-tuning heads, the sharding rules and the checkpoint code take either family. Names
below the top mirror transformers' (`attn/Wqkv`, `mlp/Wi`, `final_norm`, ...), so that import
and export are a rename (`bert_jax.io.modern_checkpoints`).

Attention is computed as `BertConfig.attention` chooses (`layers.attention_kind`): XLA (a band
of the [S, S] logits for short sequences; for long ones, `local_attention.blocked_attention`, which
never builds an [S, S] matrix on local layers), the splash kernel on TPU (its local mask, composed
with the segment ids of padding and packing), or cuDNN on GPU.

Shape letters: B batch, S sequence, H hidden, N heads, D head dim, I GLU width, P predictions,
V vocabulary, G scanned groups.
"""
import functools
from typing import Any, Callable, Dict, Optional, Tuple

import flax.linen as nn
from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import kernels, layers, local_attention, ops, splash
from bert_jax.model.masked_lm import MaskedLM
from bert_jax.model.config import BertConfig

Array = Any


# ----------------------------------------------------------------------------------- blocks


def _blocks(config: BertConfig) -> kernels.Kernels:
  return kernels.select(config.kernels)


def _dropout(config: BertConfig):
  """The dropout of the [B, S, H] activations (not of attention probabilities): on TPU, where
  the tuned form is chosen, `ops.RecomputedDropout` (the mask drawn again in the backward pass,
  never stored: ModernBERT-base's step 123.7 -> 109.9 GB per chip on a v5litepod-8,
  benchmarks/RESULTS.md)."""
  chosen = _blocks(config).Dropout
  if chosen is ops.Dropout and kernels.target_backend() == "tpu":
    return ops.RecomputedDropout
  return chosen


def _init(config: BertConfig, std: float, axes):
  # ModernBERT's: a truncated normal of `std`, cut at +-initializer_cutoff_factor std.
  cut = config.initializer_cutoff_factor
  init = nn.initializers.truncated_normal(stddev=std, lower=-cut, upper=cut)
  return nn.with_logical_partitioning(init, axes)


def residual_std(config: BertConfig) -> float:
  """The std of the layers that write into the residual stream (each Wo, the head's dense)."""
  return config.initializer_range / float(np.sqrt(2.0 * config.num_hidden_layers))


def _dense(config: BertConfig, features: int, axes, name: str, bias: bool,
           std: Optional[float] = None) -> nn.Dense:
  return nn.Dense(features, use_bias=bias, dtype=jnp.dtype(config.dtype),
                  param_dtype=jnp.float32,
                  kernel_init=_init(config, config.initializer_range if std is None else std,
                                    axes),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), axes[1:]),
                  name=name, dot_general=_blocks(config).dense_dot_general)


def _norm(config: BertConfig, name: str) -> nn.Module:
  """LayerNorm (statistics in float32, optional bias) or RMSNorm, as `config.norm_type` says."""
  scale = nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",))
  if config.norm_type == "rmsnorm":
    return nn.RMSNorm(epsilon=config.layer_norm_eps, dtype=jnp.dtype(config.dtype),
                      param_dtype=jnp.float32, scale_init=scale, name=name)
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=jnp.dtype(config.dtype),
                      param_dtype=jnp.float32, use_bias=config.norm_bias, scale_init=scale,
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                             ("embed",)), name=name)


# ----------------------------------------------------------------------------------- rotary


def rotary_frequencies(head_dim: int, theta: float) -> np.ndarray:
  """[D] float32: transformers' default RoPE frequencies theta^(-2i/D), i < D/2, in both halves
  (the two halves of each head rotated together)."""
  inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))  # [D/2]
  return np.concatenate([inv_freq, inv_freq]).astype(np.float32)


def rotary_tables(positions: Array, head_dim: int, theta: float):
  """cos, sin [B or 1, S, D] in float32 for integer positions [B or 1, S]."""
  angles = (positions.astype(jnp.float32)[..., None]
            * jnp.asarray(rotary_frequencies(head_dim, theta)))                        # [., S, D]
  return jnp.cos(angles), jnp.sin(angles)


def _turn(x: Array, cos: Array, sin: Array) -> Array:
  """Each pair (x_i, x_{i + D/2}) turned by its angle: cos [..., D] (the angles in both halves),
  sin [..., D] signed (-sin, sin). transformers' x cos + rotate_half(x) sin, in x's dtype, with
  rotate_half(x) (-x2, x1) as x (x2, x1) times the signed table. Under bfloat16 the tables are
  rounded to bfloat16 as transformers rounds them; it then multiplies in float32, which here
  materialised float32 copies of q and k (compiled for a v5litepod-8, a 4-layer ModernBERT-base
  step moved 38.2 GB per chip with the float32 products, 32.2 GB without:
  benchmarks/history/2026-11-25-modern-encoders.md). In float32 both are the same.

  On TPU the halves are swapped by a product with the [D, D] permutation (exact: each output
  is one input times 1) rather than sliced and concatenated, which XLA's TPU backend fuses
  with the products and the sum into fewer passes over q and k (the halves of a 64-wide head
  are half a vector register each; benchmarks/history/2026-11-26-modern-tpu.md); elsewhere
  they are sliced. The values are the same either way."""
  half = x.shape[-1] // 2
  if kernels.target_backend() == "tpu":
    swap = np.roll(np.eye(2 * half, dtype=np.float32), half, axis=1)      # [D, D]: (x2, x1)
    swapped = jnp.matmul(x, jnp.asarray(swap, x.dtype), precision=jax.lax.Precision.HIGHEST)
  else:
    swapped = jnp.concatenate([x[..., half:], x[..., :half]], axis=-1)     # (x2, x1)
  return x * cos.astype(x.dtype) + swapped * sin.astype(x.dtype)


@jax.custom_vjp
def _rotate(x: Array, cos: Array, sin: Array) -> Array:
  return _turn(x, cos, sin)


def _rotate_forward(x, cos, sin):
  return _turn(x, cos, sin), (cos, sin)


def _rotate_backward(residuals, g):
  # The rotation is orthogonal: its cotangent is g turned back by the same angles, one
  # pass in the layout of q and k. The tables are constants: no cotangent.
  cos, sin = residuals
  return _turn(g, cos, -sin), None, None


_rotate.defvjp(_rotate_forward, _rotate_backward)


def apply_rotary(x: Array, cos: Array, sin: Array, heads_first: bool = False) -> Array:
  """x [B, S, N, D] (or [B, N, S, D] `heads_first`) rotated by cos, sin [B or 1, S, D]; computed
  in float32, returned in x's dtype (transformers' order of operations)."""
  axis = 1 if heads_first else 2
  half = x.shape[-1] // 2   # the tables repeat their angles in both halves
  signed = jnp.concatenate([-sin[..., :half], sin[..., half:]], axis=-1)      # [., S, D]
  return _rotate(x, jnp.expand_dims(cos, axis), jnp.expand_dims(signed, axis))


# ----------------------------------------------------------------------------------- layers


class Linear(nn.Module):
  """nn.Dense's parameters (`kernel` [in, out], `bias` [out]: the same names, shapes and
  initialisation), applied as nn.Dense applies them (the tuned `dense_dot_general`), or through
  an einsum over the kernel reshaped, for an output layout nn.Dense cannot write."""
  config: BertConfig
  in_features: int
  features: int
  axes: Tuple[str, str]
  use_bias: bool
  std: float

  @nn.compact
  def __call__(self, x, equation: Optional[str] = None, kernel_shape=None, bias_shape=None,
               columns: Optional[Tuple[int, int]] = None):
    """x @ kernel (+ bias); with `equation`, einsum(equation, x, kernel.reshape(kernel_shape))
    (+ bias.reshape(bias_shape)), of the kernel's `columns` (start, stop) only if given."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    kernel = self.param("kernel", _init(c, self.std, self.axes),
                        (self.in_features, self.features), jnp.float32).astype(dtype)
    bias = (self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                            self.axes[1:]),
                       (self.features,), jnp.float32).astype(dtype) if self.use_bias else None)
    x = x.astype(dtype)
    if columns is not None:
      kernel = kernel[:, columns[0]:columns[1]]
      bias = None if bias is None else bias[columns[0]:columns[1]]
    if equation == _HEADS_FIRST:
      return _heads_first(x, kernel.reshape(kernel_shape))
    if equation is None:
      y = _blocks(c).dense_dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
      return y if bias is None else y + bias
    y = jnp.einsum(equation, x, kernel.reshape(kernel_shape))
    return y if bias is None else y + bias.reshape(bias_shape)

  def heads_first(self, x, heads: int):
    """The fused q, k, v projection [B, S, H] -> 3 x [B, N, S, D], one product per output (no
    [3, ...] buffer to slice); without a bias, one product over all three in the backward pass
    (`_heads_first`)."""
    hidden, width = x.shape[-1], self.features // 3
    dim = width // heads
    if not self.use_bias:
      return self(x, _HEADS_FIRST, (hidden, 3, heads, dim))
    return tuple(self(x, "bsh,hnd->bnsd", (hidden, heads, dim), (heads, 1, dim),
                      columns=(i * width, (i + 1) * width)) for i in range(3))


_HEADS_FIRST = "heads_first"   # Linear's equation for `_heads_first`


@jax.custom_vjp
def _heads_first(x: Array, kernel: Array):
  """x [B, S, H], kernel [H, 3, N, D] -> q, k, v [B, N, S, D], one product each."""
  return tuple(jnp.einsum("bsh,hnd->bnsd", x, kernel[:, i]) for i in range(3))


def _heads_first_forward(x, kernel):
  return _heads_first(x, kernel), (x, kernel)


def _heads_first_backward(residuals, grads):
  # The three cotangents stacked into one product for x and one for the kernel: autodiff's
  # three products each read x again and wrote a partial sum of x's gradient (compiled for a
  # v5litepod-8, ModernBERT-base's products moved 3.2 GB more per chip per step;
  # benchmarks/history/2026-12-02-modern-tpu-dropout.md). XLA fuses the stacking into them.
  x, kernel = residuals
  g = jnp.stack(grads)                                                        # [3, B, N, S, D]
  return jnp.einsum("cbnsd,hcnd->bsh", g, kernel), jnp.einsum("bsh,cbnsd->hcnd", x, g)


_heads_first.defvjp(_heads_first_forward, _heads_first_backward)


class Attention(nn.Module):
  """Fused Wqkv -> rotary q, k -> attention (global, or a sliding window) -> Wo.

  For the splash kernel (TPU) the projections write and read the kernel's heads-first layout
  [B, N, S, D] directly, so no transpose of q, k, v or the output is materialised (compiled for
  a v5litepod-8, the transposes and the rotary positions' backward were the largest elementwise
  traffic of the step; benchmarks/history/2026-11-25-modern-encoders.md), and the kernels turn q
  and k by their rotary positions themselves (`splash.Rotary`: no pass over q and k before
  them or over their gradients after); the other paths keep [B, S, N, D] and rotate here."""
  config: BertConfig
  is_global: bool

  @nn.compact
  def __call__(self, x, context, deterministic: bool):
    c = self.config
    batch, seq_len, hidden = x.shape
    heads, dim = c.num_attention_heads, c.head_dim
    heads_first = context.kind == "splash"
    wqkv = Linear(c, hidden, 3 * hidden, ("embed", "joined_kv"), c.attention_bias,
                  c.initializer_range, name="Wqkv")
    if heads_first:
      q, k, v = wqkv.heads_first(x, heads)                                     # 3 x [B, N, S, D]
    else:
      qkv = wqkv(x).reshape(batch, seq_len, 3, heads, dim)                    # [B, S, 3, N, D]
      q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]                       # [B, S, N, D]
    if not heads_first:   # the splash kernels turn q and k themselves (context.attend)
      cos, sin = context.rotary(self.is_global)
      q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    drop_probs = _blocks(c).Dropout(c.attention_probs_dropout_prob, name="probs_dropout")
    out = context.attend(q, k, v, self.is_global,
                         lambda p: drop_probs(p, deterministic=deterministic))  # as q
    wo = Linear(c, hidden, hidden, ("joined_kv", "embed"), c.attention_bias, residual_std(c),
                name="Wo")
    if heads_first:
      out = wo(out, "bnsd,ndh->bsh", (heads, dim, hidden), (hidden,))          # [B, S, H]
    else:
      out = wo(out.reshape(batch, seq_len, hidden))                            # [B, S, H]
    return _dropout(c)(c.attention_output_dropout_prob)(out, deterministic=deterministic)


class Mlp(nn.Module):
  """GLU: Wi [H, 2I] -> act(input) * gate -> dropout -> Wo; or dense -> act -> dense (glu=False)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, deterministic: bool):
    c = self.config
    act = layers.activation(c, c.hidden_act)
    width = c.intermediate_size * (2 if c.glu else 1)
    h = _dense(c, width, ("embed", "mlp"), "Wi", c.mlp_bias)(x)               # [B, S, I or 2I]
    if c.glu:
      h = act(h[..., :c.intermediate_size]) * h[..., c.intermediate_size:]    # [B, S, I]
    else:
      h = act(h)
    h = _dropout(c)(c.hidden_dropout_prob)(h, deterministic=deterministic)
    return _dense(c, c.hidden_size, ("mlp", "embed"), "Wo", c.mlp_bias, residual_std(c))(h)


class Layer(nn.Module):
  """One pre-norm block; `first` skips the attention norm (the embedding norm came just before)."""
  config: BertConfig
  is_global: bool
  first: bool = False

  @nn.compact
  def __call__(self, x, context, deterministic: bool):
    c = self.config
    h = x if self.first else _norm(c, "attn_norm")(x)
    x = x + Attention(c, self.is_global, name="attn")(h, context, deterministic)
    x = x + Mlp(c, name="mlp")(_norm(c, "mlp_norm")(x), deterministic)
    return layers.batch_sharded(x)


class _Group(nn.Module):
  """The scanned unit: N consecutive layers after the first, the last of them global (layers
  1 + gN .. (g + 1)N), with the (carry, x) -> (carry, y) signature of `nn.scan`."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, context, deterministic: bool):
    size = group_size(self.config)
    outputs = []
    for k in range(size):
      x = Layer(self.config, is_global=k == size - 1, name=f"layer_{k}")(x, context,
                                                                            deterministic)
      outputs.append(x)
    return x, jnp.stack(outputs)                                # carry, [N, B, S, H]


def group_size(config: BertConfig) -> int:
  """Layers per scanned group: one period of the local/global pattern."""
  return config.global_attn_every_n_layers if config.local_attention else 1


def check_scannable(config: BertConfig) -> None:
  size = group_size(config)
  if (config.num_hidden_layers - 1) % size:
    raise ValueError(
        f"config.model.scan_layers with architecture='modernbert' scans the layers after the "
        f"first in groups of global_attn_every_n_layers={size} (one local/global period), so "
        f"num_hidden_layers - 1 must divide by it (num_hidden_layers="
        f"{config.num_hidden_layers}); set scan_layers=False")


class Encoder(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x, context, deterministic: bool, output_hidden_states: bool = False):
    """Returns (last hidden before the final norm [B, S, H], every layer's output [L, B, S, H]
    or None)."""
    c = self.config
    policy = (None if c.remat_policy == "nothing_saveable"
              else getattr(jax.checkpoint_policies, c.remat_policy))
    remat = functools.partial(nn.remat, static_argnums=(3,), policy=policy)
    layer_cls = remat(Layer) if c.remat else Layer
    x = layer_cls(c, is_global=True, first=True, name="layer_0")(x, context, deterministic)
    outputs = [x[None]]
    if c.scan_layers:
      check_scannable(c)
      body = remat(_Group) if c.remat else _Group
      scanned = nn.scan(
          body, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, nn.broadcast),
          length=(c.num_hidden_layers - 1) // group_size(c),
          metadata_params={nn.PARTITION_NAME: "layers"})
      x, stacked = scanned(c, name="layer")(x, context, deterministic)   # stacked [G, N, B, S, H]
      outputs.append(stacked.reshape((-1,) + stacked.shape[2:]))
    else:
      for i in range(1, c.num_hidden_layers):
        x = layer_cls(c, is_global=c.is_global_layer(i), name=f"layer_{i}")(x, context,
                                                                              deterministic)
        outputs.append(x[None])
    return x, (jnp.concatenate(outputs) if output_hidden_states else None)


@struct.dataclass
class AttentionContext:
  """What every layer's attention needs from the batch, computed once per call: the rotary
  tables of both kinds of layer and the masks in the form the chosen kernel takes. A pytree
  (arrays, plus static fields), so nn.scan and nn.remat pass it to every layer as it is.

  The band of a local layer counts positions in the row; packed sequences are kept apart by their
  segments, so a window never reaches into a neighbour.
  """
  global_rotary: Any                 # (cos, sin) [B or 1, S, D] float32; None for splash,
  local_rotary: Any                  # whose kernels turn q and k from `positions` themselves
  positions: Array                   # [B or 1, S] int32: the rotary positions
  segments: Array                    # [B, S] (splash.segment_ids: 0 padding)
  global_bias: Optional[Array]       # [B, 1, S or 1, S] additive (xla, cudnn)
  local_bias: Optional[Array]        # [B, 1, S, S] the band added (short sequences)
  config: BertConfig = struct.field(pytree_node=False)
  kind: str = struct.field(pytree_node=False)       # "xla" | "splash" | "cudnn"
  blocked: bool = struct.field(pytree_node=False)   # local layers by blocks (long sequences)

  def rotary(self, is_global: bool):
    return self.global_rotary if is_global else self.local_rotary

  def attend(self, q, k, v, is_global: bool, dropout: Callable):
    """q, k, v [B, S, N, D] -> [B, S, N, D] ([B, N, S, D] for splash: the kernel's layout);
    `dropout` acts on the probabilities (XLA only)."""
    c = self.config
    window = None if is_global or not c.local_attention else c.window
    if self.kind == "splash":   # q and k unturned: the kernels turn them by their positions
      theta = c.global_rope_theta if is_global else c.local_rope_theta
      rotary = splash.Rotary(self.positions, jnp.asarray(rotary_frequencies(c.head_dim, theta)))
      return splash.splash_attention_heads_first(q, k, v, self.segments, False, window=window,
                                                 rotary=rotary)
    if window is not None and self.blocked:
      return local_attention.blocked_attention(q, k, v, self.segments, window, dropout,
                                               c.float32_attention_logits)
    bias = self.global_bias if window is None else self.local_bias
    if self.kind == "cudnn":
      return layers.fused_attention(q, k, v, bias, "cudnn")
    return _blocks(c).attention(q, k, v, bias, dropout, c.float32_attention_logits)


def attention_context(config: BertConfig, attention_mask: Array, position_ids: Optional[Array],
                      kind: str, seq_len: int) -> AttentionContext:
  """attention_mask [B, S] (padding) or [B, S, S] (block-diagonal packed rows); position_ids
  [B, S] (restarting per packed sequence) or None (0..S-1)."""
  positions = (jnp.arange(seq_len, dtype=jnp.int32)[None] if position_ids is None
               else position_ids)                                              # [B or 1, S]
  blocked = config.local_attention > 0 and local_attention.use_blocks(seq_len, config.window, kind)
  global_bias = local_bias = None
  if kind in ("xla", "cudnn"):
    global_bias = layers.attention_bias(attention_mask, causal=False)        # [B, 1, S|1, S]
    if config.local_attention and not blocked:
      local_bias = local_attention.banded_bias(global_bias, seq_len, config.window)
  tables = (lambda theta: None) if kind == "splash" else (
      lambda theta: rotary_tables(positions, config.head_dim, theta))
  return AttentionContext(
      global_rotary=tables(config.global_rope_theta), local_rotary=tables(config.local_rope_theta),
      positions=positions, segments=splash.segment_ids(attention_mask), global_bias=global_bias,
      local_bias=local_bias, config=config, kind=kind, blocked=blocked)


class ModernBertModel(nn.Module):
  """The encoder, called as BERT's `post_ln.BertModel` is. Returns a dict:

    sequence_output  [B, S, H]      after the final norm (transformers' last_hidden_state)
    pooled_output    [B, H]         the classifier's pooling head (add_pooling_layer): cls or
                                    mean of the real tokens (`classifier_pooling`), then dense,
                                    activation and norm, as transformers' sequence classifier
    token_output     [B, S, H]      that head on every token (`token_head`; add_pooling_layer):
                                    what transformers' token and span classifiers read
    hidden_states    [L+1, B, S, H] embeddings then every layer, the last after the final
                                    norm (= sequence_output; only if output_hidden_states)

  `token_type_ids` is accepted and ignored (the family has no token types), so that the tasks
  call either family alike.
  """
  config: BertConfig
  add_pooling_layer: bool = True

  def setup(self):
    c = self.config
    self.embeddings = Embeddings(c)
    self.encoder = Encoder(c)
    self.final_norm = _norm(c, "final_norm")
    if self.add_pooling_layer:
      self.pooler = PredictionTransform(c)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
               deterministic: bool = True, output_hidden_states: bool = False,
               cls_positions=None, token_head: bool = False) -> Dict[str, Array]:
    del token_type_ids
    c = self.config
    layers.check_inputs(c, input_ids)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    seq_len = input_ids.shape[-1]
    kind = ("xla" if self.is_initializing()
            else layers.attention_kind(c, deterministic, seq_len))
    context = attention_context(c, attention_mask, position_ids, kind, seq_len)
    x = layers.batch_sharded(self.embeddings(input_ids, deterministic))       # [B, S, H]
    last, per_layer = self.encoder(x, context, deterministic, output_hidden_states)
    outputs = {"sequence_output": self.final_norm(last)}                        # [B, S, H]
    if self.add_pooling_layer:
      outputs["pooled_output"] = self.pooler(
          pool(outputs["sequence_output"], attention_mask, c.classifier_pooling, cls_positions))
      if token_head:   # transformers' token and span classes: the same head on every token
        outputs["token_output"] = self.pooler(outputs["sequence_output"])      # [B, S, H]
    if output_hidden_states:
      # The last layer's entry is after the final norm (the encoder's output), as BERT's last
      # entry is its sequence_output: layer -1 of every feature reader is transformers'
      # last_hidden_state.
      per_layer = per_layer.at[-1].set(outputs["sequence_output"])
      outputs["hidden_states"] = jnp.concatenate([x[None], per_layer], axis=0)
    return outputs

  def attend(self, hidden):
    return self.embeddings.attend(hidden)


def pool(sequence: Array, attention_mask: Array, how: str, cls_positions=None) -> Array:
  """[B, S, H] -> [B, H]: the first token (cls) or the mean over real tokens (mean, padding mask
  [B, S]); [B, K, H] at packed rows' `cls_positions` [B, K]."""
  if cls_positions is not None:
    return layers.gather_positions(sequence, cls_positions)                  # [B, K, H]
  if how == "cls" or attention_mask.ndim != 2:
    return sequence[:, 0]                                                      # [B, H]
  mask = attention_mask.astype(jnp.float32)[..., None]                         # [B, S, 1]
  total = jnp.sum(sequence.astype(jnp.float32) * mask, axis=1)                 # [B, H]
  return (total / jnp.maximum(jnp.sum(mask, axis=1), 1.0)).astype(sequence.dtype)


class Embeddings(nn.Module):
  """Token embeddings -> norm -> dropout (no positions: rotary; no token types)."""
  config: BertConfig

  def setup(self):
    c = self.config
    self.word_embeddings = nn.Embed(
        c.vocab_size, c.hidden_size, dtype=jnp.dtype(c.dtype), param_dtype=jnp.float32,
        embedding_init=_init(c, c.initializer_range, ("vocab", "embed")))
    self.norm = _norm(c, "norm")
    self.dropout = _dropout(c)(c.hidden_dropout_prob)

  def __call__(self, input_ids, deterministic: bool):
    c = self.config
    x = _blocks(c).word_lookup(self.word_embeddings.embedding, input_ids, jnp.dtype(c.dtype))
    # ModernBERT's embedding is `nn.Embedding(padding_idx=pad_token_id)` (transformers' and its
    # own training code): a [PAD] looked up adds nothing to its row's gradient (the tied decoder
    # still does). Masking's random replacement puts [PAD] at real positions now and then.
    is_pad = (input_ids == c.pad_token_id)[..., None]                           # [B, S, 1]
    x = jnp.where(is_pad, jax.lax.stop_gradient(x), x)                          # [B, S, H]
    return self.dropout(self.norm(x), deterministic=deterministic)             # [B, S, H]

  def attend(self, hidden):
    """Logits against the tied token embeddings: [..., H] -> [..., V] (as BERT's)."""
    dtype = jnp.dtype(self.config.dtype)
    table = self.word_embeddings.embedding.astype(dtype)                       # [V, H]
    return _blocks(self.config).dense_matmul(hidden.astype(dtype), table.T)    # [..., V]


class PredictionTransform(nn.Module):
  """transformers' ModernBertPredictionHead: dense -> activation -> norm (the MLM head's first
  part, and the sequence classifier's pooling head)."""
  config: BertConfig

  @nn.compact
  def __call__(self, hidden):
    c = self.config
    h = _dense(c, c.hidden_size, ("embed", "embed_out"), "dense", c.classifier_bias,
               residual_std(c))(hidden)
    return _norm(c, "norm")(layers.activation(c, c.classifier_activation)(h))


class MaskedLMHead(nn.Module):
  """`cls/predictions`: transform, then logits against the tied embeddings plus the decoder's
  bias (`decoder_bias`), at the gathered positions only."""
  config: BertConfig

  @nn.compact
  def __call__(self, hidden, embedding_attend):
    c = self.config
    logits = embedding_attend(PredictionTransform(c, name="transform")(hidden))   # [..., V]
    logits = logits.astype(jnp.float32)
    if not c.decoder_bias:
      return logits
    bias = self.param("output_bias", nn.with_logical_partitioning(
        nn.initializers.zeros_init(), ("vocab",)), (c.vocab_size,), jnp.float32)
    return _blocks(c).add_bias(logits, bias)                                   # [..., V]


def masked_lm(config: BertConfig, use_nsp: bool = False) -> MaskedLM:
  """Encoder + masked-LM head (`bert_jax.model.masked_lm`), transformers' ModernBertForMaskedLM;
  called as BERT's `BertForPreTraining` is, with no NSP."""
  return MaskedLM(config, encoder=ModernBertModel, head=MaskedLMHead, use_nsp=use_nsp)
