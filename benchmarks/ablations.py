"""The hand-tuned parts of bert_jax's step and the textbook JAX/Flax forms they replaced.

Each entry of TEXTBOOK is (module, attribute, replacement): `bench_util.swapped` puts the
replacement in while a step is traced, so the ablation benchmarks (`cpu_step_ablation.py`,
`gpu_pretrain_mfu.py --variants`) can time the step with one part swapped back:

  jax_gelu          jax.nn.gelu(approximate=False) instead of ops.gelu
  flax_dropout      flax.linen.Dropout (32-bit bernoulli draws) instead of ops.Dropout
  plain_bias        x + bias instead of ops.add_bias
  einsum_attention  einsums over [B, S, N, D] instead of modeling.xla_attention's layout
  optax_xent        optax.softmax_cross_entropy_with_integer_labels and argmax accuracy
                    instead of ops.softmax_cross_entropy
  autodiff_dense    a plain matmul (autodiff's kernel gradient) in every nn.Dense and the tied
                    MLM decoder instead of ops.dense_matmul
  cast_then_gather  the word embeddings cast to the compute dtype before the lookup (flax's
                    nn.Embed), so the gradient's scatter-add runs in that dtype, instead of
                    modeling.word_lookup
"""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax import modeling, ops


def einsum_attention(q, k, v, bias, dropout, float32_logits=True):
  """The attention of modeling.xla_attention (float32 logits) as einsums over [B, S, N, D]."""
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  logits = jnp.einsum("bqnd,bknd->bnqk", q, k, preferred_element_type=jnp.float32)  # [B,N,S,S]
  probs = dropout(jax.nn.softmax(logits + bias, axis=-1).astype(v.dtype))
  return jnp.einsum("bnqk,bknd->bqnd", probs, v)                                    # [B,S,N,D]


def optax_cross_entropy(logits, labels):
  logits = logits.astype(jnp.float32)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return nll, (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


def autodiff_matmul(x, kernel, precision=None):
  return jnp.matmul(x, kernel, precision=precision)


def cast_then_gather(table, ids, dtype):
  return jnp.take(table.astype(dtype), ids, axis=0)


TEXTBOOK = {"jax_gelu": (ops, "gelu", functools.partial(jax.nn.gelu, approximate=False)),
            "flax_dropout": (ops, "Dropout", nn.Dropout),
            "plain_bias": (ops, "add_bias", lambda x, bias: x + bias),
            "einsum_attention": (modeling, "xla_attention", einsum_attention),
            "optax_xent": (ops, "softmax_cross_entropy", optax_cross_entropy),
            "autodiff_dense": (ops, "dense_matmul", autodiff_matmul),
            "cast_then_gather": (modeling, "word_lookup", cast_then_gather)}
