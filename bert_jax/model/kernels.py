"""Which form of each building block the model computes: the hand-tuned one (`ops`) or the textbook
JAX/Flax one, chosen per backend. `BertConfig.kernels` names the choice; this is the one place that
turns it into functions: the model, its heads and the pre-training loss call `select(...)` when
they are traced instead of reading module globals, so the ablation benchmarks switch a config
field rather than patching modules.

Both forms compute the same function (tests/test_ops.py: same outputs and gradients of a whole
model); they differ in how XLA compiles them. The parts, each named by its textbook form:

  jax_gelu          jax.nn.gelu(approximate=False) instead of ops.gelu (the erf form)
  flax_dropout      flax.linen.Dropout (32-bit bernoulli draws) instead of ops.Dropout (16-bit;
                    the ModernBERT family on TPU: ops.RecomputedDropout)
  plain_bias        x + bias instead of ops.add_bias (bias gradient as a matrix-vector product)
  einsum_attention  einsums over [B, S, N, D] instead of ops.xla_attention's heads-first layout
  optax_xent        optax.softmax_cross_entropy_with_integer_labels and argmax accuracy instead
                    of ops.softmax_cross_entropy (gradient written out)
  autodiff_dense    jax.lax.dot_general in every nn.Dense and a plain matmul in the tied MLM
                    decoder (autodiff's kernel gradient) instead of ops.dense_dot_general /
                    ops.dense_matmul
  cast_then_gather  the word embeddings cast to the compute dtype before the lookup (flax's
                    nn.Embed: the gradient's scatter-add runs in that dtype) instead of
                    ops.word_lookup

`BertConfig.kernels` is a comma list: at most one of "auto" (the default), "tuned" or "textbook",
then any part names to take in textbook form on top of it, e.g. "tuned,plain_bias".
"auto" is what measured faster on each backend (AUTO_TEXTBOOK; the ablations:
benchmarks/history/2026-11-28-finished-studies.md):

  cpu  every tuned form (each textbook form 1.02-1.20x slower, BERT-mini)
  gpu  tuned, except plain_bias and optax_xent (textbook: 0.995x and 1.000x of the tuned step on
       an H100, i.e. no difference, so the plain forms); ops.dense_matmul there takes the kernel
       gradient in the plain [K, N] orientation. autodiff_dense has not been measured on a GPU:
       tuned until it is.
  tpu  textbook plain_bias, autodiff_dense and cast_then_gather: compiled both ways for a v5e by
       libtpu (`benchmarks/tpu_aot.py --kernels`, BERT-mini bf16, a memory-bound step), each
       lowers XLA's bytes accessed at the same FLOPs (together 2.11 vs 2.79 GB per device,
       roofline 2.58 vs 3.40 ms); the tuned GELU and cross-entropy lower them, attention compiles
       to the same program, and flax's dropout lowers bytes but adds 5% FLOPs of random bits
       (kept tuned). The ModernBERT family's tuned dropout there is ops.RecomputedDropout:
       no random bits or masks in HBM (ModernBERT-base, attention-output dropout 0.1,
       v5litepod-8: 123.7 -> 109.9 GB per chip, est. MFU 45.6% -> 51.3%); BERT keeps
       ops.Dropout (its dropout on [B, N, S, S] probabilities drawn twice, 32 bits an element,
       added 14% to a tiny step's FLOPs). An estimate from the compiler's cost analysis, not a
       timing on a TPU.
       The tuned cross-entropy reads the label's logit as a masked sum there
       (`ops.softmax_cross_entropy(label_by_mask=True)`: the same values, fused with the
       logsumexp instead of a gather from float32 logits written out for it).
"""
import contextlib
import contextvars
import dataclasses
import functools
from typing import Any, Callable, FrozenSet, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax.model import ops

Array = Any

CHOICES = ("auto", "tuned", "textbook")
PARTS = ("jax_gelu", "flax_dropout", "plain_bias", "einsum_attention", "optax_xent",
         "autodiff_dense", "cast_then_gather")
# Parts "auto" takes in textbook form, per backend (others: none).
AUTO_TEXTBOOK = {"gpu": frozenset({"plain_bias", "optax_xent"}),
                 "tpu": frozenset({"plain_bias", "autodiff_dense", "cast_then_gather"})}


# ------------------------------------------------------------------------- the textbook forms


def plain_bias(x: Array, bias: Array) -> Array:
  return x + bias                                                              # [..., K]


def einsum_attention(q, k, v, bias, dropout, float32_logits: bool = True):
  """`ops.xla_attention`'s function as einsums over [B, S, N, D] (q, k, v [B, S, N, D])."""
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  logits = jnp.einsum("bqnd,bknd->bnqk", q, k,
                      preferred_element_type=jnp.float32 if float32_logits else q.dtype)
  logits = logits.astype(jnp.float32) + bias                                   # [B, N, S, S]
  probs = dropout(jax.nn.softmax(logits, axis=-1).astype(v.dtype))             # [B, N, S, S]
  return jnp.einsum("bnqk,bknd->bqnd", probs, v)                               # [B, S, N, D]


def optax_cross_entropy(logits: Array, labels: Array):
  """`ops.softmax_cross_entropy`'s (nll, label_is_max), by optax and argmax: [..., V] -> [...]."""
  logits = logits.astype(jnp.float32)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)       # [...]
  return nll, (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


def autodiff_matmul(x: Array, kernel: Array, precision=None) -> Array:
  return jnp.matmul(x, kernel, precision=precision)                           # [..., N]


def cast_then_gather(table: Array, ids: Array, dtype) -> Array:
  return jnp.take(table.astype(dtype), ids, axis=0)                           # [B, S, H]


# ------------------------------------------------------------------------------- the choice


@dataclasses.dataclass(frozen=True)
class Kernels:
  """The building blocks a model computes with (each with the signature of the `ops` form)."""
  gelu: Callable                     # exact GELU, x -> x
  Dropout: Any                       # a Flax module class: Dropout(rate)(x, deterministic=...)
  add_bias: Callable                 # (x [..., K], bias [K]) -> [..., K]
  attention: Callable                # ops.xla_attention's signature
  softmax_cross_entropy: Callable    # (logits [..., V], labels [...]) -> (nll, label_is_max)
  dense_dot_general: Callable        # nn.Dense(dot_general=...)
  dense_matmul: Callable             # (x [..., K], kernel [K, N]) -> [..., N] (tied decoder)
  word_lookup: Callable              # (table [V, H], ids [B, S], dtype) -> [B, S, H]


def parse(spec: str) -> Tuple[str, FrozenSet[str]]:
  """'tuned,plain_bias' -> ('tuned', {'plain_bias'}); the choice defaults to 'auto'."""
  items = [item.strip() for item in str(spec).split(",") if item.strip()]
  choices = [item for item in items if item in CHOICES]
  unknown = [item for item in items if item not in CHOICES and item not in PARTS]
  if unknown or len(choices) > 1:
    raise ValueError(f"kernels={spec!r}: expected at most one of {CHOICES} and any of {PARTS}")
  return (choices[0] if choices else "auto"), frozenset(items) - set(CHOICES)


# The backend a program is traced for when it is not JAX's default one: ahead-of-time
# compilation for a TPU slice from a CPU machine (`compiling_for`).
_TARGET_BACKEND: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    "bert_jax_kernels_target_backend", default=None)


@contextlib.contextmanager
def compiling_for(backend: str):
  """Within the block, "auto" resolves for `backend` (e.g. "tpu") instead of the default one."""
  token = _TARGET_BACKEND.set(backend)
  try:
    yield
  finally:
    _TARGET_BACKEND.reset(token)


def _backend(backend: Optional[str]) -> str:
  return backend or _TARGET_BACKEND.get() or jax.default_backend()


def target_backend() -> str:
  """The backend the program being traced is for: `compiling_for`'s, else JAX's default."""
  return _backend(None)


def textbook_parts(spec: str, backend: Optional[str] = None) -> FrozenSet[str]:
  """The parts `spec` takes in textbook form on `backend` (default: JAX's default backend)."""
  choice, parts = parse(spec)
  if choice == "textbook":
    return frozenset(PARTS)
  if choice == "auto":
    parts |= AUTO_TEXTBOOK.get(_backend(backend), frozenset())
  return parts


def select(spec: str = "auto", backend: Optional[str] = None) -> Kernels:
  """The functions of `spec` (a `BertConfig.kernels` value) on `backend`, resolved when traced."""
  backend = _backend(backend)
  textbook = textbook_parts(spec, backend)
  pick = lambda part, tuned, plain: plain if part in textbook else tuned
  # ops.dense_matmul's kernel gradient orientation ([N, K] transposed) and its bfloat16 products
  # through float32 results: faster on XLA's CPU backend only.
  cpu = dict(transpose_wide_grad=backend == "cpu", float32_products=backend == "cpu")
  dense = functools.partial(ops.dense_dot_general, **cpu)
  matmul = functools.partial(ops.dense_matmul, **cpu)
  # The label's logit as a masked sum on TPU, where XLA fuses it with the logsumexp.
  xent = (functools.partial(ops.softmax_cross_entropy, label_by_mask=True) if backend == "tpu"
          else ops.softmax_cross_entropy)
  return Kernels(
      gelu=pick("jax_gelu", ops.gelu, functools.partial(jax.nn.gelu, approximate=False)),
      Dropout=pick("flax_dropout", ops.Dropout, nn.Dropout),
      add_bias=pick("plain_bias", ops.add_bias, plain_bias),
      attention=pick("einsum_attention", ops.xla_attention, einsum_attention),
      softmax_cross_entropy=pick("optax_xent", xent, optax_cross_entropy),
      dense_dot_general=pick("autodiff_dense", dense, jax.lax.dot_general),
      dense_matmul=pick("autodiff_dense", matmul, autodiff_matmul),
      word_lookup=pick("cast_then_gather", ops.word_lookup, cast_then_gather))


def softmax_cross_entropy(logits: Array, labels: Array, spec: str = "auto"):
  """(nll, label_is_max) of logits [..., V] and labels [...] in the form `spec` chooses (the
  pre-training loss: `BertConfig.kernels` of the model it trains)."""
  return select(spec).softmax_cross_entropy(logits, labels)
