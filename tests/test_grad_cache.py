"""Gradient caching's passes (runtime.grad_cache) on a toy objective: the plain step's gradient,
and the last chunk's forward pass run once, not twice."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.runtime import grad_cache
from bert_jax.runtime import step as step_core


def _toy_objective(calls: list):
  """Rows [B, 3] embedded by tanh(x @ w) [B, 2]; the loss couples every row with every other
  (a softmax over the batch's similarities), as a contrastive loss does."""

  def embed(params, batch, rng):
    calls.append(batch["x"].shape[0])
    noise = jax.random.uniform(rng, (batch["x"].shape[0], 1))                 # a dropout stand-in
    return {"e": jnp.tanh(batch["x"] @ params["w"]) * (1 + 0.1 * noise)}      # [b, 2]

  def embedded_terms(embeddings, batch):
    e = embeddings["e"]                                                        # [B, 2]
    scores = e @ e.T                                                           # [B, B]
    return {"loss": -jnp.sum(jnp.diag(jax.nn.log_softmax(scores, axis=-1)))}

  def terms(params, batch, rng):   # the plain step embeds the whole batch with one draw
    return embedded_terms(embed(params, batch, rng), batch)
  return step_core.Objective(totals=lambda batch: {}, terms=terms,
                             loss=lambda terms, totals: terms["loss"],
                             metrics=lambda terms: terms, embed=embed,
                             embedded_terms=embedded_terms)


@pytest.mark.parametrize("rows, chunks", [(2, 4), (4, 2), (8, 1)])
def test_every_chunk_but_the_last_is_embedded_twice(rows, chunks):
  """Run eagerly (each loop a Python loop), the objective embeds n - 1 chunks in the first pass,
  the last chunk once under jax.vjp, and n - 1 chunks again: 2n - 1 forward passes, not 2n."""
  calls = []
  objective = _toy_objective(calls)
  params = {"w": jnp.asarray(np.random.RandomState(0).randn(3, 2), jnp.float32)}
  batch = {"x": jnp.asarray(np.random.RandomState(1).randn(8, 3), jnp.float32)}
  with jax.disable_jit():
    grad_cache.gradients(params, batch, jax.random.PRNGKey(0), objective, {}, rows)
  assert calls == [rows] * (2 * chunks - 1)


def test_the_gradient_is_the_same_at_every_chunk_size():
  """One chunk is the plain step (one draw of the noise for the whole batch); 2 and 4 chunks
  draw per chunk, so they are checked against each other through the noise-free objective."""
  calls = []
  objective = _toy_objective(calls)
  params = {"w": jnp.asarray(np.random.RandomState(0).randn(3, 2), jnp.float32)}
  batch = {"x": jnp.asarray(np.random.RandomState(1).randn(8, 3), jnp.float32)}
  rng = jax.random.PRNGKey(0)
  plain = jax.grad(lambda p: objective.terms(p, batch, jax.random.fold_in(rng, 0))["loss"])(params)
  whole, _ = grad_cache.gradients(params, batch, rng, objective, {}, 8)
  np.testing.assert_allclose(whole["w"], plain["w"], rtol=1e-6)

  def by_hand(p, rows):   # every chunk's own draw, the loss of the whole batch
    chunks = [objective.embed(p, {"x": batch["x"][j * rows:(j + 1) * rows]},
                              jax.random.fold_in(rng, j))["e"] for j in range(8 // rows)]
    return objective.embedded_terms({"e": jnp.concatenate(chunks)}, batch)["loss"]
  for rows in (2, 4):
    cached, terms = grad_cache.gradients(params, batch, rng, objective, {}, rows)
    np.testing.assert_allclose(cached["w"], jax.grad(by_hand)(params, rows)["w"], rtol=1e-5)
    assert float(terms["loss"]) == pytest.approx(float(by_hand(params, rows)), rel=1e-6)
