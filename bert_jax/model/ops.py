"""Small building blocks of the model, written for speed where the obvious form is slow.

Each computes the textbook function; what differs is how XLA gets to compile it. Measured on
the 2-core CPU of benchmarks/history/2026-11-23.md ("Where the CPU step's time went"; what each
part buys today: benchmarks/RESULTS.md, "Hand-tuned kernels per backend"):

- `gelu`: the erf form `x/2 * (1 + erf(x/sqrt 2))`, the same expression as PyTorch's and
  Hugging Face's. `jax.nn.gelu(approximate=False)` goes through `erfc` and a select, which XLA's
  CPU backend evaluates 3-4x slower (forward+backward of a [4096, 1024] activation: 22 ms vs 5 ms).
- `Dropout`: inverted dropout that draws 16 random bits per element instead of 32 (one threefry
  word feeds two elements) and compares integers instead of building floats. The keep
  probability is quantised to 1/65536 (rate 0.1 keeps with probability 58982/65536 =
  0.8999939) and the survivors are scaled by the inverse of *that* probability, so the expected
  output equals the input exactly.
- `RecomputedDropout` (the ModernBERT family on TPU): the same keep probability and scale, its
  mask drawn 32 bits an element and drawn again in the backward pass instead of stored, so that
  XLA fuses the draws into the ops that read them (a memory-bound TPU step moves fewer bytes;
  more threefry work).
- `dense_dot_general`: the product of every `nn.Dense` ([..., K] x [K, N]) and of the tied MLM
  decoder, whose kernel gradient is one 2-D matmul over the flattened rows, taken as [N, K] and
  transposed when K > N if `transpose_wide_grad` (the CPU orientation). Autodiff of the 3-D
  product made XLA contract over two batch-like axes through copies and Eigen's kernel
  (BERT-mini step 1.2x faster).
- `add_bias`: `x + bias` whose bias gradient is a matrix-vector product (the MLM output bias).
- `softmax_cross_entropy`: -log_softmax(logits)[label] with its gradient written out,
  `softmax - one_hot`, in one elementwise pass over the saved logits; autodiff of the textbook
  form made XLA build the [..., V] gradient from several passes (BERT-mini step 1.03x faster).
- `xla_attention`: heads first and keys transposed once, so both products are plain batched
  matmuls (BERT-mini step 1.03x faster than einsums over [B, S, N, D]; 1.009x on an H100).
- `word_lookup`: gathers from the float32 table, then casts, so the gradient's scatter-add sums
  in float32 (precision; 1.024x on an H100 under bfloat16).

Which of these a model uses, and their textbook forms, is `bert_jax.model.kernels`'s choice
(`BertConfig.kernels`): call them through `kernels.select(config.kernels)`, not from here.
"""
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = Any

_SQRT_HALF = float(1.0 / np.sqrt(2.0))


def gelu(x: Array) -> Array:
  """The exact (erf) GELU."""
  return 0.5 * x * (1.0 + jax.lax.erf(x * jnp.asarray(_SQRT_HALF, x.dtype)))


def keep_threshold(rate: float) -> int:
  """The 16-bit threshold t: an element is kept when its draw (uniform on 0..65535) is < t."""
  return int(min(max(round((1.0 - rate) * 65536), 1), 65536))


def dropout_keep_mask(rng: Array, rate: float, shape) -> Array:
  """Boolean mask, True with probability keep_threshold(rate) / 65536, from 16 bits per element.

  The words are drawn with the mask's leading axes ([..., ceil(last / 2)]), so a mask of a
  batch-sharded activation is generated shard by shard like `jax.random.bernoulli`'s would be.
  """
  threshold = keep_threshold(rate)
  if threshold == 65536:
    return jnp.ones(shape, bool)
  *lead, last = shape
  words = jax.random.bits(rng, (*lead, (last + 1) // 2), jnp.uint32)           # [..., ceil(L/2)]
  halves = jax.lax.bitcast_convert_type(words, jnp.uint16)                     # [..., ceil(L/2), 2]
  halves = halves.reshape(*lead, -1)[..., :last]                               # [..., L]
  return halves < np.uint16(threshold)


class Dropout(nn.Module):
  """Inverted dropout (the `flax.linen.Dropout` interface: `rate`, `deterministic`, the
  'dropout' RNG stream) with 16-bit draws; see the module docstring."""
  rate: float

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    return self.drop(x, self.make_rng("dropout"))

  def drop(self, x: Array, key: Array) -> Array:
    return _dropped(x, dropout_keep_mask(key, self.rate, x.shape), self.rate)


def _dropped(x: Array, keep: Array, rate: float) -> Array:
  """The survivors of `keep` scaled by the inverse of the quantised keep probability."""
  scale = jnp.asarray(65536.0 / keep_threshold(rate), x.dtype)
  return jnp.where(keep, x * scale, jnp.zeros((), x.dtype))


def recomputed_keep_mask(rng: Array, rate: float, shape) -> Array:
  """`dropout_keep_mask`'s distribution from one 32-bit draw per element (its top 16 bits
  against the same threshold): each element's draw is a function of its index alone, with no
  reshape of words into halves, so XLA can compute it inside the fusion that reads it."""
  threshold = keep_threshold(rate)
  if threshold == 65536:
    return jnp.ones(shape, bool)
  return (jax.random.bits(rng, shape, jnp.uint32) >> np.uint32(16)) < np.uint32(threshold)


class RecomputedDropout(Dropout):
  """`Dropout` whose mask is never stored: the forward and the backward pass each draw it from
  the key (`recomputed_keep_mask`), inside the fusions that read it, so neither the random bits
  nor the mask reach HBM. The ModernBERT family's form on TPU (`families/modernbert/model.py`
  `_dropout`): compiled by libtpu for a v5litepod-8, ModernBERT-base's step with
  attention-output dropout 0.1 moved 123.7 GB per chip with `Dropout` (its bits hoisted into
  fusions of their own and the masks kept for the backward pass) and 109.9 GB with this one,
  less than with no dropout at all (116.0; benchmarks/RESULTS.md). The keep probability and
  scale are `Dropout`'s; the masks differ."""

  def drop(self, x: Array, key: Array) -> Array:
    return _recomputed(x, key, self.rate)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _recomputed(x: Array, key: Array, rate: float) -> Array:
  return _dropped(x, recomputed_keep_mask(key, rate, x.shape), rate)


def _recomputed_forward(x, key, rate):
  return _recomputed(x, key, rate), key          # the key is the only residual


def _recomputed_backward(rate, key, g):
  # The barrier keeps XLA from recognising this draw as the forward one and storing that mask
  # for both passes (common-subexpression elimination), which is what it avoids.
  key = jax.lax.optimization_barrier(key)
  return _dropped(g, recomputed_keep_mask(key, rate, g.shape), rate), None


_recomputed.defvjp(_recomputed_forward, _recomputed_backward)


def dense_dot_general(lhs: Array, rhs: Array, dimension_numbers, precision=None,
                      preferred_element_type=None, *, transpose_wide_grad: bool = False,
                      float32_products: bool = False) -> Array:
  """`jax.lax.dot_general` for `nn.Dense(dot_general=...)`: lhs [..., K] x kernel [K, N].

  Any other contraction, or a preferred element type, goes to `jax.lax.dot_general` unchanged.
  `transpose_wide_grad`, `float32_products`: see `dense_matmul`.
  """
  dense_form = (((lhs.ndim - 1,), (0,)), ((), ()))
  if rhs.ndim != 2 or dimension_numbers != dense_form or preferred_element_type is not None:
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
  return dense_matmul(lhs, rhs, precision, transpose_wide_grad=transpose_wide_grad,
                      float32_products=float32_products)


def dense_matmul(x: Array, kernel: Array, precision=None, *, transpose_wide_grad: bool = False,
                 float32_products: bool = False) -> Array:
  """x [..., K] @ kernel [K, N] -> [..., N], the kernel gradient as one 2-D matmul over the rows.

  `transpose_wide_grad`: when K > N, compute the kernel gradient as [N, K] and transpose it, the
  faster orientation on XLA's CPU backend (`bert_jax.model.kernels` turns it on there only).
  `float32_products`: a bfloat16 product (forward and both gradients) asks for a float32 result
  and rounds it to bfloat16. XLA's CPU backend runs bfloat16 x bfloat16 -> float32 on its fast
  path and bfloat16 -> bfloat16 on a slow one: [4096, 256] x [256, 768] at 840 against 144
  GFLOP/s on a 2-core Xeon with AMX (benchmarks/history/2026-11-25-modern-cpu-step.md). The same
  values up to the last rounding (both sum in float32); on CPU only (`bert_jax.model.kernels`).
  """
  return _dense_matmul(x, kernel, precision, transpose_wide_grad, float32_products)


def _product(a: Array, b: Array, precision, float32_products: bool) -> Array:
  """a @ b in a's dtype; bfloat16 through a float32 result when `float32_products`."""
  if float32_products and a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16:
    return jnp.matmul(a, b, precision=precision,
                      preferred_element_type=jnp.float32).astype(jnp.bfloat16)
  return jnp.matmul(a, b, precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _dense_matmul(x, kernel, precision, transpose_wide_grad, float32_products):
  return _product(x, kernel, precision, float32_products)                    # [..., N]


def _dense_matmul_fwd(x, kernel, precision, transpose_wide_grad, float32_products):
  return (_dense_matmul(x, kernel, precision, transpose_wide_grad, float32_products),
          (x, kernel))


def _dense_matmul_bwd(precision, transpose_wide_grad, float32_products, residuals, g):
  x, kernel = residuals
  k, n = kernel.shape
  product = functools.partial(_product, precision=precision, float32_products=float32_products)
  rows, g_rows = x.reshape(-1, k), g.reshape(-1, n)                           # [M, K], [M, N]
  x_grad = product(g, kernel.T)                                               # [..., K]
  if k > n and transpose_wide_grad:
    # On XLA's CPU backend a [K, N] product with K > N contracting over M ran 1.4x slower than
    # the [N, K] one (e.g. [4096, 1024]^T [4096, 256]: 17 vs 12 ms). The barrier keeps XLA
    # from folding the transpose back into the product.
    kernel_grad = jax.lax.optimization_barrier(product(g_rows.T, rows)).T    # [K, N]
  else:
    kernel_grad = product(rows.T, g_rows)                                     # [K, N]
  return x_grad.astype(x.dtype), kernel_grad.astype(kernel.dtype)


_dense_matmul.defvjp(_dense_matmul_fwd, _dense_matmul_bwd)


@jax.custom_vjp
def add_bias(x: Array, bias: Array) -> Array:
  """x [..., K] + bias [K], whose bias gradient is the matrix-vector product ones @ g.

  The gradient of a broadcast add is a sum over every leading axis. For the vocabulary-sized MLM
  bias ([B*P, V] -> [V]) XLA's CPU reduction over the major axis took 54 ms of a 1.2 s BERT-mini
  step; `ones @ g` takes 2 ms. The optimisation barrier keeps g materialised as it is: without
  it XLA fused the softmax gradient into the transposed copy that feeds the decoder's weight
  gradient, which cost the time back.
  """
  return x + bias


def _add_bias_fwd(x, bias):
  # The residuals only carry the dtypes (each gradient must match its primal's).
  return x + bias, (jnp.zeros((0,), x.dtype), jnp.zeros((0,), bias.dtype))


def _add_bias_bwd(dtypes, g):
  x_like, bias_like = dtypes
  g = jax.lax.optimization_barrier(g)
  rows = g.reshape(-1, g.shape[-1])                                            # [R, K]
  # HIGHEST: a float32 sum on every backend (TPU's default would round g to bfloat16).
  bias_grad = jnp.dot(jnp.ones((rows.shape[0],), rows.dtype), rows,
                      precision=jax.lax.Precision.HIGHEST)                     # [K]
  return g.astype(x_like.dtype), bias_grad.astype(bias_like.dtype)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


def softmax_cross_entropy(logits: Array, labels: Array, label_by_mask: bool = False):
  """(nll, label_is_max) for logits [..., V] and integer labels [...], both [...] float32.

  nll = logsumexp(logits) - logits[label], i.e. -log_softmax(logits)[label]; label_is_max is 1.0
  where the label's logit is the maximum (argmax accuracy up to exact ties) and carries no
  gradient. The label's logit is gathered: with the gradient written by hand there is no
  scatter in the backward pass. `label_by_mask` (the TPU form, `kernels.select`) takes it as a
  sum over the vocabulary of the logits where the index is the label (the same value: one term,
  the others exact zeros): a reduction XLA fuses with the logsumexp's over the logits as they
  come out of the decoder (bfloat16 products plus the float32 bias), where a gather makes it
  write the float32 [..., V] logits out to read them back (compiled for a v5litepod-8: about
  2 GB a step of ModernBERT-base at 16 x 320 predictions per chip, by `hlo_profile`'s count;
  benchmarks/history/2026-11-26-modern-tpu.md).
  """
  return _softmax_cross_entropy(logits.astype(jnp.float32), labels.astype(jnp.int32),
                                label_by_mask)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _softmax_cross_entropy(logits, labels, label_by_mask):
  return _softmax_cross_entropy_fwd(logits, labels, label_by_mask)[0]


def _label_logit(logits, labels, label_by_mask: bool):
  if label_by_mask:
    vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.sum(jnp.where(vocab == labels[..., None], logits, 0.0), axis=-1)   # [...]
  return jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]          # [...]


def _softmax_cross_entropy_fwd(logits, labels, label_by_mask):
  top = jnp.max(logits, axis=-1)                                               # [...]
  logsumexp = top + jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1))  # [...]
  label_logit = _label_logit(logits, labels, label_by_mask)                    # [...]
  outputs = (logsumexp - label_logit, (label_logit >= top).astype(jnp.float32))
  return outputs, (logits, logsumexp, labels)


def _softmax_cross_entropy_bwd(label_by_mask, residuals, cotangents):
  del label_by_mask
  logits, logsumexp, labels = residuals
  g_nll, _ = cotangents                                     # label_is_max is not differentiable
  one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)      # [..., V]
  g_logits = (jnp.exp(logits - logsumexp[..., None]) - one_hot) * g_nll[..., None]  # [..., V]
  return g_logits, None


_softmax_cross_entropy.defvjp(_softmax_cross_entropy_fwd, _softmax_cross_entropy_bwd)


def xla_attention(q, k, v, bias, dropout, float32_logits: bool = True):
  """softmax(q k^T / sqrt(D) + bias) v with `dropout` on the probabilities, as XLA ops.

  q, k, v [B, S, N, D], bias [B, 1, S or 1, S] -> [B, S, N, D]. The softmax is float32; the
  logits are too unless `float32_logits` is False, when the product is written in q's dtype (half
  the bytes of the largest tensor of the step under bfloat16) and upcast inside the softmax.
  Heads go first and the keys are transposed once, so that both products are plain batched
  matmuls; with einsums over [B, S, N, D] XLA's CPU backend copied the operands into that layout
  inside the step and ran the products slower (BERT-mini step 1.03x faster this way,
  benchmarks/history/2026-11-23.md).
  """
  head_dim = q.shape[-1]
  q = q.transpose(0, 2, 1, 3) / jnp.sqrt(head_dim).astype(q.dtype)           # [B, N, S, D]
  k = k.transpose(0, 2, 3, 1)                                                  # [B, N, D, S]
  v = v.transpose(0, 2, 1, 3)                                                  # [B, N, S, D]
  logits = jnp.matmul(q, k, preferred_element_type=jnp.float32 if float32_logits else q.dtype)
  logits = logits.astype(jnp.float32) + bias                                   # [B, N, S, S]
  probs = dropout(jax.nn.softmax(logits, axis=-1).astype(v.dtype))             # [B, N, S, S]
  return jnp.matmul(probs, v).transpose(0, 2, 1, 3)                            # [B, S, N, D]


def word_lookup(table, ids, dtype):
  """table[ids] cast to the compute dtype: [V, H] at [B, S] -> [B, S, H].

  Gathered from the float32 table and then cast (the same values as casting the table first), so
  that the gradient's scatter-add sums each token's cotangents in float32. Cast first, the sum
  runs in bfloat16: a token seen hundreds of times a batch ([CLS], [SEP], "the") loses most of its
  gradient's precision, and on GPU the bfloat16 atomic adds were also slower
  (benchmarks/history/2026-11-23-gpu-step.md).
  """
  return jnp.take(table, ids, axis=0).astype(dtype)                          # [B, S, H]
