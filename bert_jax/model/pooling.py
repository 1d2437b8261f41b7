"""Sentence embeddings from an encoder's token states: the pooling of sentence-transformers'
`Pooling` module (`mean`, `cls`, `last`) and its `Normalize`, for every family.

    vectors = pooling.embed(sequence_output, input_mask, "mean", normalized=True)   # [B, H]

`mean` averages the real tokens (padding mask [B, S]) in float32, as sentence-transformers does;
`cls` takes the first token; `last` the last real token (right padding). Shapes: B rows, S
tokens, H hidden.
"""
import jax
import jax.numpy as jnp

POOLINGS = ("mean", "cls", "last")


def pool(sequence: jax.Array, input_mask: jax.Array, how: str) -> jax.Array:
  """[B, S, H] token states, [B, S] padding mask (1 real) -> [B, H] float32."""
  if how not in POOLINGS:
    raise ValueError(f"pooling {how!r}: expected one of {POOLINGS}")
  states = sequence.astype(jnp.float32)                                       # [B, S, H]
  if how == "cls":
    return states[:, 0]                                                        # [B, H]
  mask = input_mask.astype(jnp.float32)                                        # [B, S]
  if how == "last":
    last = jnp.maximum(jnp.sum(mask, axis=1).astype(jnp.int32) - 1, 0)         # [B]
    return jnp.take_along_axis(states, last[:, None, None], axis=1)[:, 0]      # [B, H]
  total = jnp.einsum("bsh,bs->bh", states, mask)                               # [B, H]
  # sentence-transformers clamps the token count at 1e-9 (a row without tokens gives 0).
  return total / jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1e-9)


def normalize(vectors: jax.Array) -> jax.Array:
  """[B, H] -> unit length (torch.nn.functional.normalize: the norm clamped at 1e-12)."""
  norm = jnp.linalg.norm(vectors, axis=-1, keepdims=True)                      # [B, 1]
  return vectors / jnp.maximum(norm, 1e-12)


def embed(sequence: jax.Array, input_mask: jax.Array, how: str = "mean",
          normalized: bool = False) -> jax.Array:
  """The pooled [B, H] vectors, unit length when `normalized`."""
  vectors = pool(sequence, input_mask, how)
  return normalize(vectors) if normalized else vectors
