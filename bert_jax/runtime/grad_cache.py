"""Gradient caching (GradCache: Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size
under Memory Limited Setup"): the exact gradient of a loss over a whole batch's embeddings,
holding the activations of a few rows at a time.

A contrastive loss couples every row with every other (each query is scored against every
document of the batch), so gradient accumulation over micro-batches would change the loss: each
micro-batch would see only its own negatives. GradCache splits the gradient instead, for an
objective whose terms factor through per-row embeddings (`Objective.embed`,
`Objective.embedded_terms`, bert_jax/runtime/step.py):

1. embed the batch chunk by chunk, keeping only the embeddings (no activations: nothing is
   differentiated in this pass);
2. the loss of the whole batch from its embeddings, and its gradient w.r.t. them (small);
3. each chunk embedded again under `jax.vjp`, its embeddings' gradient pulled back to the
   parameters, summed over the chunks. The last chunk is embedded under `jax.vjp` in step 1
   already, and pulled back first in step 3: its forward pass runs once.

By the chain rule the sum is the gradient of the plain step (the same loss, differentiated
through the whole batch at once), up to float32 summation order; memory holds one chunk's
activations, time is one more forward pass of every chunk but the last (with one chunk, the
plain step). A chunk's dropout draws are `fold_in(rng, chunk)` in both passes, so the two passes
see the same masks (and other masks than the plain step's).

Chunks are taken per data-parallel device: `rows` is each device's rows in a chunk, and chunk j
holds rows j*rows .. (j+1)*rows - 1 of every device's part of the batch, so every chunk keeps
every device busy and no row moves between devices. Shapes: B rows, D devices along `data`
(1 outside a mesh, and under pmap, where a step sees its own rows), b = B / D, c = `rows`,
n = b / c chunks.

XLA's cost analysis counts a loop body once, so a compile for its cost (`--compile_for`'s
roofline) traces the chunk loops unrolled (`unrolled_for_cost`): the same values, every chunk
counted.
"""
import contextlib
import contextvars
from typing import Any, Dict, Iterator, Tuple

import jax
import jax.numpy as jnp

from bert_jax.model.layers import batch_sharded

Arrays = Dict[str, jax.Array]

_UNROLLED = contextvars.ContextVar("grad_cache_unrolled", default=False)


@contextlib.contextmanager
def unrolled_for_cost() -> Iterator[None]:
  """Steps traced inside have their chunk loops unrolled: what a compile for XLA's cost analysis
  needs (it counts a loop body once). Not for training: a long program, the same values."""
  token = _UNROLLED.set(True)
  try:
    yield
  finally:
    _UNROLLED.reset(token)


def data_devices() -> int:
  """Devices along the `data` axis of the mesh the step is traced under (1 without one)."""
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty or "data" not in mesh.axis_names else mesh.shape["data"]


def chunked(tree, rows: int, devices: int):
  """Every array [B, ...] -> [n, D * c, ...]: chunk j is rows j*c .. (j+1)*c - 1 of each
  device's b rows, devices major (so each chunk stays split along `data` as the batch is)."""

  def split(x):
    batch = x.shape[0]
    per_device = batch // devices
    x = x.reshape((devices, per_device // rows, rows) + x.shape[1:])           # [D, n, c, ...]
    x = jnp.swapaxes(x, 0, 1)                                                   # [n, D, c, ...]
    return x.reshape((per_device // rows, devices * rows) + x.shape[3:])        # [n, D*c, ...]
  return jax.tree_util.tree_map(split, tree)


def unchunked(tree, devices: int):
  """The inverse of `chunked`: [n, D * c, ...] -> [B, ...] in the batch's row order."""

  def join(x):
    count, width = x.shape[:2]
    x = x.reshape((count, devices, width // devices) + x.shape[2:])             # [n, D, c, ...]
    x = jnp.swapaxes(x, 0, 1)                                                   # [D, n, c, ...]
    return x.reshape((count * width,) + x.shape[3:])                            # [B, ...]
  return jax.tree_util.tree_map(join, tree)


def check_rows(batch_rows: int, devices: int, rows: int, what: str = "") -> None:
  """A clear error unless each device's rows split into whole chunks of `rows`."""
  if rows < 1 or batch_rows % devices or (batch_rows // devices) % rows:
    raise ValueError(f"grad_cache_chunk={rows}: each of the {devices} data-parallel devices "
                     f"holds {batch_rows} / {devices} rows of the batch{what}, which must split "
                     f"into whole chunks of {rows} rows")


def gradients(params, batch, step_rng, objective, totals: Arrays,
              rows: int) -> Tuple[Any, Arrays]:
  """(gradients, terms) of `objective` on `batch`, as `runtime.step.gradients` computes them,
  with the activations of `rows` rows per device at a time (see the module docstring)."""
  if objective.embed is None or objective.embedded_terms is None:
    raise ValueError("gradient caching needs an objective whose terms factor through "
                     "embeddings (Objective.embed and Objective.embedded_terms)")
  devices = data_devices()
  batch_rows = jax.tree_util.tree_leaves(batch)[0].shape[0]
  check_rows(batch_rows, devices, rows)
  chunks = chunked(batch, rows, devices)                                        # [n, D*c, ...]
  count = batch_rows // devices // rows
  index = jnp.arange(count)
  unroll = max(count - 1, 1) if _UNROLLED.get() else 1

  def embed(p, chunk, j):
    chunk = jax.tree_util.tree_map(batch_sharded, chunk)
    return objective.embed(p, chunk, jax.random.fold_in(step_rng, j))

  first = lambda tree: jax.tree_util.tree_map(lambda x: x[:-1], tree)          # [n-1, D*c, ...]
  last = lambda tree: jax.tree_util.tree_map(lambda x: x[-1], tree)             # [D*c, ...]

  # 1. Embeddings only: a forward pass per chunk, nothing kept for a backward one; but the last
  # chunk's forward is the one its gradient will need (jax.vjp keeps what the backward pass
  # reads), so it is not run a second time: n - 1 extra forward passes, not n.
  last_embedded, last_pull_back = jax.vjp(lambda p: embed(p, last(chunks), count - 1), params)
  embedded = jax.tree_util.tree_map(lambda l: l[None], last_embedded)           # [1, D*c, ...]
  if count > 1:
    _, others = jax.lax.scan(lambda _, xs: (None, embed(params, xs[1], xs[0])), None,
                             (index[:-1], first(chunks)), unroll=unroll)        # [n-1, D*c, ...]
    embedded = jax.tree_util.tree_map(lambda o, l: jnp.concatenate([o, l]),
                                      others, embedded)                         # [n, D*c, ...]
  embeddings = unchunked(embedded, devices)                                     # [B, ...]

  # 2. The whole batch's loss and its gradient w.r.t. the embeddings.
  def loss_of(e):
    terms = objective.embedded_terms(e, batch)
    return objective.loss(terms, totals), terms

  (_, terms), embedding_grads = jax.value_and_grad(loss_of, has_aux=True)(embeddings)
  cotangents = chunked(embedding_grads, rows, devices)                          # [n, D*c, ...]

  # 3. The last chunk pulled back first (what it kept is freed before the other chunks run),
  # then each other chunk embedded again, its embeddings' gradient pulled back to the
  # parameters, summed. The barrier keeps the compiler from merging this forward pass with the
  # first one (it would when the loops are unrolled), which would keep every chunk's
  # activations: what this avoids. It takes the last chunk's gradient, so the loop runs after it.
  grads = last_pull_back(last(cotangents))[0]
  if count == 1:
    return grads, terms
  again, grads = jax.lax.optimization_barrier((params, grads))

  def pull_back(total, xs):
    j, chunk, cotangent = xs
    _, vjp = jax.vjp(lambda p: embed(p, chunk, j), again)
    return jax.tree_util.tree_map(jnp.add, total, vjp(cotangent)[0]), None

  grads, _ = jax.lax.scan(pull_back, grads, (index[:-1], first(chunks), first(cotangents)),
                          unroll=unroll)
  return grads, terms
