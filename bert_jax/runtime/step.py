"""The one train step core: a job supplies its loss as an `Objective`; the core does the rest.

`train_step(state, batch, rng, objective=..., tx=..., schedule=...)` is pure: dropout draws from
`fold_in(rng, step)` (and the device index under `pmap`), so a resumed run draws exactly what an
uninterrupted one would. With `grad_accum_steps` > 1 the batch is split into micro-batches whose
losses are normalised by the *whole* batch's totals, so the summed gradient is the large batch's
gradient exactly (up to float summation order), not a mean of per-micro-batch means. Under
`pmap` (`axis_name` set) the same holds across devices: the totals are summed over devices and
the gradients too, which equals one device running the global batch. A non-finite loss or
gradient leaves parameters and optimizer state unchanged (the step is skipped and counted;
`runtime.loop` aborts after `max_consecutive_skips` in a row).

With `grad_cache_rows` > 0 the gradient of an objective whose terms factor through per-row
embeddings (a contrastive loss, where every row is scored against every other and micro-batches
would change the loss) is computed by gradient caching instead (`runtime.grad_cache`): the same
gradient, holding the activations of that many rows per device at a time.
"""
import dataclasses
from typing import Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from bert_jax.parallel import sharding
from bert_jax.runtime import grad_cache
from bert_jax.runtime.state import TrainState

Arrays = Dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Objective:
  """What a job's loss is, in three pure functions over sums (so they add across batches):

    totals(batch) -> {name: sum}       normalisers that depend on the data only (e.g. the number
                                        of masked tokens), summed over the whole batch
    terms(params, batch, rng) -> {name: sum}   differentiable sums over (micro-)batch rows
    loss(terms, totals) -> scalar      linear in `terms` (the totals are constants)
    metrics(terms) -> {name: scalar}   logged values from the terms of the whole batch (its
                                        "loss", if any, is logged instead of loss(terms, totals))

  An objective whose terms factor through per-row embeddings also gives the two factors, for
  gradient caching (`runtime.grad_cache`; `terms` must equal embedded_terms(embed(...))):

    embed(params, batch, rng) -> {name: [B, ...]}   row i from row i of the batch only
    embedded_terms(embeddings, batch) -> {name: sum}
  """
  totals: Callable[[Arrays], Arrays]
  terms: Callable[..., Arrays]
  loss: Callable[[Arrays, Arrays], jax.Array]
  metrics: Callable[[Arrays], Arrays]
  embed: Optional[Callable[..., Arrays]] = None
  embedded_terms: Optional[Callable[[Arrays, Arrays], Arrays]] = None


def _micro_batches(batch, count: int):
  """[B, ...] -> [count, B / count, ...] for every array of the batch."""
  return jax.tree_util.tree_map(
      lambda x: x.reshape((count, x.shape[0] // count) + x.shape[1:]), batch)


def gradients(params, batch, step_rng, objective: Objective, totals: Arrays,
              grad_accum_steps: int = 1, grad_cache_rows: int = 0) -> Tuple[Arrays, Arrays]:
  """(gradients, terms) of the whole batch, accumulated over `grad_accum_steps` micro-batches,
  or by gradient caching with `grad_cache_rows` rows per device at a time."""
  if grad_cache_rows:
    if grad_accum_steps != 1:
      raise ValueError("gradient caching computes the whole batch's gradient itself: "
                       f"grad_accum_steps={grad_accum_steps} must be 1 with it")
    return grad_cache.gradients(params, batch, step_rng, objective, totals, grad_cache_rows)

  def loss_fn(p, micro_batch, micro_rng):
    terms = objective.terms(p, micro_batch, micro_rng)
    return objective.loss(terms, totals), terms

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if grad_accum_steps == 1:
    (_, terms), grads = grad_fn(params, batch, step_rng)
    return grads, terms
  micro = _micro_batches(batch, grad_accum_steps)

  def accumulate(carry, xs):
    index, micro_batch = xs
    (_, t), g = grad_fn(params, micro_batch, jax.random.fold_in(step_rng, index))
    return jax.tree_util.tree_map(jnp.add, carry, (g, t)), None

  first = jax.tree_util.tree_map(lambda x: x[0], micro)
  zeros = jax.tree_util.tree_map(
      lambda s: jnp.zeros(s.shape, s.dtype),
      jax.eval_shape(lambda: (params, grad_fn(params, first, step_rng)[0][1])))
  (grads, terms), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(grad_accum_steps), micro))
  return grads, terms


def train_step(state: TrainState, batch, rng, *, objective: Objective,
               tx: optax.GradientTransformation, schedule: Callable,
               grad_accum_steps: int = 1, axis_name: Optional[str] = None,
               grad_cache_rows: int = 0):
  """One optimizer update. Pure: the same (state, batch, rng) always gives the same result."""
  step_rng = jax.random.fold_in(rng, state.step)
  total = (lambda x: jax.lax.psum(x, axis_name)) if axis_name else (lambda x: x)
  if axis_name:
    step_rng = jax.random.fold_in(step_rng, jax.lax.axis_index(axis_name))
  totals = total(objective.totals(batch))
  grads, terms = gradients(state.params, batch, step_rng, objective, totals, grad_accum_steps,
                           grad_cache_rows)
  if axis_name:
    grads, terms = total((grads, terms))
  grads = sharding.placed_gradients(grads)   # where the strategy wants them (ZeRO-1), else as is
  loss = objective.loss(terms, totals)
  metrics = dict({"loss": loss}, **objective.metrics(terms))
  # The name scope labels the update's operations in the compiled module (the compile report's
  # `optimizer_update` bytes); it changes nothing that is computed.
  with jax.named_scope("optimizer_update"):
    updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    # A non-finite step changes nothing but the counters.
    keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new,
                                                   old)
    new_state = state.replace(
        step=state.step + 1,
        params=keep(new_params, state.params),
        opt_state=keep(new_opt_state, state.opt_state),
        consecutive_skips=jnp.where(finite, 0, state.consecutive_skips + 1),
        total_skips=state.total_skips + jnp.where(finite, 0, 1))
    param_norm = optax.tree.norm(new_state.params)
  metrics.update(grad_norm=grad_norm, param_norm=param_norm,
                 # The rate this step applied: the optimizer's own count, which a skipped step
                 # does not advance (state.step does).
                 learning_rate=schedule(state.step - state.total_skips),
                 skipped=1.0 - finite.astype(jnp.float32))
  return new_state, metrics
