"""sentence-transformers' `MultipleNegativesRankingLoss` (in-batch negatives, InfoNCE) on
embeddings, with the documents of every data-parallel device as negatives.

    rows = ranking_loss.ranking(queries, positives, negatives, negative_mask,
                                scale=20.0, symmetric=False)
    rows["loss"], rows["correct"]         # [b] each row's loss; 1 where it ranks its own first

Query i is scored against every document of the *global* batch: the B positives, then the B * K
hard negatives, `scale * cos_sim`; its label is its own positive. `symmetric` adds the
positive -> query term (positive i against the B queries) and averages the two, as
`MultipleNegativesSymmetricRankingLoss` does (`directions=("query_to_doc", "doc_to_query")`,
`partition_mode="per_direction"`: the two log-partitions averaged; the hard negatives take no
part in the backward term). The mean of the row losses over the global batch is theirs.

Where the rows of the other devices come from (`gathered`):
* under `jit` over a mesh the batch is one logical array split along `data`: the documents'
  embeddings are pinned whole on every device, so the compiler inserts one all-gather of them
  ([B * (1 + K), H] floats) and each device scores its own queries against all of them;
* under `pmap` (`axis_name`) each device holds its rows only: `jax.lax.all_gather` them, and a
  device's labels start at its index times its rows. The gradient of an all-gather is a
  reduce-scatter: each device's documents receive the gradients of every device's queries.

Shapes: b rows here (the whole batch under jit, a device's under pmap), B in the global batch, K
hard negatives per row, H hidden.
"""
from typing import Dict, Optional

import jax
import jax.numpy as jnp

from bert_jax.model.pooling import normalize

# The score of a hard-negative slot a row leaves empty: far below any scaled cosine, so that its
# softmax weight is exactly 0, and finite, so that no gradient is inf * 0.
_EMPTY_SLOT = -1e9


def gathered(x: jax.Array, axis_name: Optional[str] = None) -> jax.Array:
  """`x` [b, ...] of this device's rows -> [B, ...], the rows of every data-parallel device.

  Under pmap an explicit all-gather along `axis_name`; traced under a mesh with a `data` axis,
  a sharding constraint that replicates `x` (the compiler's all-gather); else `x` (one device).
  """
  if axis_name is not None:
    return jax.lax.all_gather(x, axis_name, tiled=True)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or "data" not in mesh.axis_names or mesh.shape["data"] == 1:
    return x
  return jax.lax.with_sharding_constraint(x, jax.sharding.PartitionSpec())


def first_row(rows: int, axis_name: Optional[str] = None) -> jax.Array:
  """The global index of this device's first row (0 under jit, where a device sees all rows)."""
  return 0 if axis_name is None else jax.lax.axis_index(axis_name) * rows


def cosine_scores(a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """scale * cos_sim(a, b): [n, H], [m, H] -> [n, m] float32, at full float32 precision (on TPU
  a float32 matmul otherwise rounds its inputs to bfloat16; this one is small beside the
  encoder)."""
  return scale * jnp.matmul(normalize(a.astype(jnp.float32)),
                            normalize(b.astype(jnp.float32)).T,
                            precision=jax.lax.Precision.HIGHEST)


def _cross_entropy(scores: jax.Array, labels: jax.Array) -> jax.Array:
  """[b, m] scores, [b] labels -> [b]: logsumexp minus the label's score."""
  own = jnp.take_along_axis(scores, labels[:, None], axis=1)[:, 0]             # [b]
  return jax.nn.logsumexp(scores, axis=1) - own


def ranking(queries: jax.Array, positives: jax.Array, negatives: Optional[jax.Array] = None,
            negative_mask: Optional[jax.Array] = None, *, scale: float = 20.0,
            symmetric: bool = False, axis_name: Optional[str] = None) -> Dict[str, jax.Array]:
  """{"loss": each row's loss [b], "correct": [b] 1.0 where the row's best-scored document is its
  own positive} (float32): queries and positives [b, H], hard negatives [b, K, H] (or None)
  with `negative_mask` [b, K] (1: a real negative; 0: an empty slot, never scored).
  `axis_name`: the pmap axis when the step runs per device."""
  rows, hidden = queries.shape
  labels = first_row(rows, axis_name) + jnp.arange(rows)                        # [b]
  scores = cosine_scores(queries, gathered(positives, axis_name), scale)        # [b, B]
  if negatives is not None and negatives.shape[1]:
    # The order of the candidates changes nothing (a softmax over all of them): each row's
    # negatives side by side, not sentence-transformers' column by column.
    others = gathered(negatives.reshape(-1, hidden), axis_name)                # [B * K, H]
    negative_scores = cosine_scores(queries, others, scale)                     # [b, B * K]
    if negative_mask is not None:
      empty = gathered(negative_mask.reshape(-1), axis_name) == 0               # [B * K]
      negative_scores = jnp.where(empty[None, :], _EMPTY_SLOT, negative_scores)
    scores = jnp.concatenate([scores, negative_scores], axis=1)                 # [b, B(1 + K)]
  losses = _cross_entropy(scores, labels)                                       # [b]
  correct = (jnp.argmax(scores, axis=1) == labels).astype(jnp.float32)          # [b]
  if symmetric:
    backward = cosine_scores(positives, gathered(queries, axis_name), scale)    # [b, B]
    losses = (losses + _cross_entropy(backward, labels)) / 2
  return {"loss": losses, "correct": correct}
