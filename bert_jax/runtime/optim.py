"""Optimizers and the learning-rate schedule of the paper (spec section 4).

AdamW as the original `AdamWeightDecayOptimizer`: beta1 0.9, beta2 0.999, epsilon 1e-6, decoupled
weight decay 0.01 that skips LayerNorm parameters and biases, global-norm clipping at 1.0, and by
default *no* bias correction (`config.optimizer.bias_correction=False` is the original; True is
the usual Adam). LAMB (You et al. 2019) for large batches.
"""
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax


def bert_schedule(learning_rate: float, warmup_steps: int, num_train_steps: int,
                  decay_to: float = 0.0) -> optax.Schedule:
  """The original schedule: linear warm-up from 0, and linear decay computed over *all* steps.

  In the original code the polynomial (power 1) decay runs from step 0 to num_train_steps and the
  warm-up overrides it for step < warmup_steps, so right after warm-up the rate is
  lr * (1 - warmup / total), not lr.
  """
  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    frac = jnp.clip(step / max(num_train_steps, 1), 0.0, 1.0)
    decayed = (learning_rate - decay_to) * (1.0 - frac) + decay_to
    if warmup_steps <= 0:
      return decayed
    warm = learning_rate * step / warmup_steps
    return jnp.where(step < warmup_steps, warm, decayed)
  return schedule


def decay_mask(params) -> Any:
  """True for parameters that get weight decay: everything but LayerNorm and biases."""
  def keep(path, _):
    names = [getattr(p, "key", str(p)) for p in path]
    return not (names[-1] == "bias" or names[-1] == "output_bias" or "LayerNorm" in names)
  return jax.tree_util.tree_map_with_path(keep, params)


class _AdamState(NamedTuple):
  mu: Any
  nu: Any


def scale_by_adam_without_bias_correction(b1: float, b2: float,
                                          eps: float) -> optax.GradientTransformation:
  """Adam moments as in the original BERT optimizer: m / (sqrt(v) + eps), no bias correction."""
  def init(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
    return _AdamState(jax.tree_util.tree_map(zeros, params), jax.tree_util.tree_map(zeros, params))

  def update(updates, state, params=None):
    del params
    mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
    updates = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return updates, _AdamState(mu, nu)

  return optax.GradientTransformation(init, update)


def create_optimizer(config: ml_collections.ConfigDict,
                     num_train_steps: int) -> tuple[optax.GradientTransformation, Callable]:
  """(optimizer, schedule) from `config.optimizer` and the step fields of `config`."""
  return build_optimizer(config.optimizer, config.learning_rate, config.warmup_steps,
                         num_train_steps)


def build_optimizer(opt, learning_rate: float, warmup_steps: int,
                    num_train_steps: int) -> tuple[optax.GradientTransformation, Callable]:
  """(optimizer, schedule): `opt` (a `config.optimizer` block) with the paper's schedule."""
  schedule = bert_schedule(learning_rate, warmup_steps, num_train_steps)
  if opt.name == "adamw":
    if opt.bias_correction:
      moments = optax.scale_by_adam(b1=opt.b1, b2=opt.b2, eps=opt.eps)
    else:
      moments = scale_by_adam_without_bias_correction(opt.b1, opt.b2, opt.eps)
    core = optax.chain(moments, optax.add_decayed_weights(opt.weight_decay, mask=decay_mask),
                       optax.scale_by_learning_rate(schedule))
  elif opt.name == "lamb":
    core = optax.lamb(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                      weight_decay=opt.weight_decay, mask=decay_mask)
  else:
    raise ValueError(f"config.optimizer.name={opt.name!r}: expected 'adamw' or 'lamb'")
  chain = [core]
  if opt.clip_grad_norm:
    chain.insert(0, optax.clip_by_global_norm(opt.clip_grad_norm))
  return optax.chain(*chain), schedule


def default_optimizer_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      name="adamw", b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, clip_grad_norm=1.0,
      bias_correction=False))
