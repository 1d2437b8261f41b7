"""Exact nearest-neighbour search by dot product, the corpus sharded over the devices.

    search = ExactSearch(corpus_vectors)             # [N, D] float32, split over jax.devices()
    scores, ids = search.top_k(query_vectors, k=100)  # [Q, k] each, best first

The corpus rows are split along a 1-D mesh of the devices (`sharding.create_mesh`: each of the d
devices holds N/d rows, the last ones padded); each device scores a block of queries against its
rows and keeps its own top k (`jax.lax.top_k`), and the d*k candidates of each query are merged
into its top k. Nothing is approximate: the result is numpy's `argsort(-queries @ corpus.T)[:, :k]`
up to the order of equal scores. The products are float32 at full precision (a GPU's TF32 or a
TPU's bfloat16 passes would reorder close documents). Queries go in blocks of `query_block`, so a
device holds [query_block, N/d] scores at a time. Cosine similarity is the dot product of unit
vectors: normalise both sides first.
"""
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_jax.parallel import sharding

AXIS = sharding.DATA_AXIS


class ExactSearch:
  """The corpus placed once on the devices; `top_k` for any number of queries."""

  def __init__(self, corpus: np.ndarray, mesh: Optional[Mesh] = None, query_block: int = 256):
    corpus = np.asarray(corpus, np.float32)
    if corpus.ndim != 2 or not len(corpus):
      raise ValueError(f"the corpus vectors have shape {corpus.shape}: expected [N > 0, D]")
    self.mesh = mesh if mesh is not None else sharding.create_mesh()
    if self.mesh.axis_names != (AXIS,):
      raise ValueError(f"ExactSearch needs a 1-D {AXIS!r} mesh, not {self.mesh.axis_names}")
    self.count, self.dim = corpus.shape
    self.query_block = query_block
    devices = self.mesh.shape[AXIS]
    self.rows = -(-self.count // devices)                                  # N/d, rounded up
    padded = np.zeros((self.rows * devices, self.dim), np.float32)         # [d * N/d, D]
    padded[:self.count] = corpus
    # Every process holds the whole corpus and places its own devices' rows.
    self.corpus = jax.make_array_from_callback(
        padded.shape, NamedSharding(self.mesh, P(AXIS)), lambda index: padded[index])
    self._replicated = NamedSharding(self.mesh, P())
    self._compiled = {}

  def _search_fn(self, k: int):
    """jit((queries [B, D] replicated, corpus [d * N/d, D] sharded) -> scores, ids [B, k])."""
    local_k = min(k, self.rows)
    count, rows = self.count, self.rows

    def local(queries, shard):
      scores = jnp.matmul(queries, shard.T, precision=jax.lax.Precision.HIGHEST)   # [B, N/d]
      offset = jax.lax.axis_index(AXIS) * rows
      ids = offset + jnp.arange(rows)                                                # [N/d]
      scores = jnp.where(ids[None, :] < count, scores, -jnp.inf)     # padding never wins
      best, where = jax.lax.top_k(scores, local_k)                                   # [B, k']
      return best[None], (where + offset)[None]                                      # [1, B, k']

    sharded = jax.shard_map(local, mesh=self.mesh, in_specs=(P(), P(AXIS)),
                            out_specs=(P(AXIS), P(AXIS)))

    def search(queries, corpus):
      best, ids = sharded(queries, corpus)                                           # [d, B, k']
      best = jnp.moveaxis(best, 0, 1).reshape(queries.shape[0], -1)                  # [B, d*k']
      ids = jnp.moveaxis(ids, 0, 1).reshape(queries.shape[0], -1)
      top, where = jax.lax.top_k(best, k)                                            # [B, k]
      return top, jnp.take_along_axis(ids, where, axis=1)

    return jax.jit(search, out_shardings=(self._replicated, self._replicated))

  def top_k(self, queries: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """(scores [Q, k] float32, corpus row ids [Q, k] int32), each row best first; k is at most
    the corpus size."""
    queries = np.asarray(queries, np.float32)
    if queries.ndim != 2 or queries.shape[1] != self.dim:
      raise ValueError(f"queries of shape {queries.shape}: expected [Q, {self.dim}] (the "
                       "corpus vectors' width)")
    k = min(k, self.count)
    if k not in self._compiled:
      self._compiled[k] = self._search_fn(k)
    search, block = self._compiled[k], self.query_block
    scores, ids = [], []
    for start in range(0, len(queries), block):
      rows = queries[start:start + block]
      padded = np.zeros((block, self.dim), np.float32)   # one compiled shape for every block
      padded[:len(rows)] = rows
      placed = jax.make_array_from_callback(padded.shape, self._replicated,
                                            lambda index, x=padded: x[index])
      top, where = search(placed, self.corpus)
      scores.append(np.asarray(top)[:len(rows)])
      ids.append(np.asarray(where)[:len(rows)])
    if not scores:
      return np.zeros((0, k), np.float32), np.zeros((0, k), np.int32)
    return np.concatenate(scores), np.concatenate(ids).astype(np.int32)
