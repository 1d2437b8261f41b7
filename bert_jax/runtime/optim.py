"""Optimizers and learning-rate schedules (spec section 4; ModernBERT's recipe).

AdamW as the original `AdamWeightDecayOptimizer`: beta1 0.9, beta2 0.999, epsilon 1e-6, decoupled
weight decay 0.01 that skips LayerNorm parameters and biases, global-norm clipping at 1.0, and by
default *no* bias correction (`config.optimizer.bias_correction=False` is the original; True is
the usual Adam). LAMB (You et al. 2019) for large batches. StableAdamW (Wortsman et al. 2023,
ModernBERT's optimizer): bias-corrected AdamW whose step is divided, tensor by tensor, by the RMS
of the gradient over its second moment when that exceeds 1 (`stable_adamw`).

Schedules (`config.schedule`): `bert`, the original (linear warm-up, linear decay computed over
all steps; the default), or `wsd`, warmup-stable-decay (linear warm-up, constant, then a linear,
cosine or 1-sqrt decay over the last steps; warm-up and stable may be empty, so a decay phase
started from a checkpoint is one run of its own). Every optimizer counts the schedule's steps in
its own state (optax's `scale_by_learning_rate`), apart from the count of Adam's bias correction,
so a later phase can carry the moments and restart the schedule (`restart_schedules`).
"""
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import optax

OPTIMIZERS = ("adamw", "lamb", "stable_adamw")
SCHEDULES = ("bert", "wsd", "linear")
# x in [0, 1] (the fraction of the decay done) -> the fraction of the way from the final rate to
# the peak still left: 1 at the start of the decay, 0 at its end.
DECAY_SHAPES = {
    "linear": lambda x: 1.0 - x,
    "cosine": lambda x: 0.5 * (1.0 + jnp.cos(jnp.pi * x)),
    "1-sqrt": lambda x: 1.0 - jnp.sqrt(x),     # Hägele et al. 2024; ModernBERT's decay
}


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


def wsd_schedule(learning_rate: float, warmup_steps: int, num_train_steps: int,
                 decay_steps: int, decay_shape: str = "1-sqrt",
                 final_learning_rate: float = 0.0) -> optax.Schedule:
  """Warmup-stable-decay (Zhai et al. 2022, Hu et al. 2024; ModernBERT section 2.2.4).

  With W = warmup_steps, N = num_train_steps, D = decay_steps and S = N - D, the rate of step t
  (0-based, the count of updates before this one) is
    t < W:        learning_rate * t / W                 (from 0, as `bert_schedule`'s warm-up)
    W <= t < S:   learning_rate
    t >= S:       final + (learning_rate - final) * shape((t - S) / D), the fraction clipped to 1
  where shape is 1 - x (linear), (1 + cos(pi x)) / 2 (cosine) or 1 - sqrt(x) (1-sqrt: with
  final 0, learning_rate * (1 - sqrt((t - S) / D))). Step S runs at the peak, the last step
  (N - 1) just above final, and any step past N at final. D = 0: no decay (warm-up then constant
  for good); W = 0 and D = N: a pure decay run, e.g. a decay phase started from a checkpoint.
  """
  if decay_shape not in DECAY_SHAPES:
    raise ValueError(f"decay_shape={decay_shape!r}: expected one of {sorted(DECAY_SHAPES)}")
  if warmup_steps < 0 or decay_steps < 0:
    raise ValueError(f"warmup_steps={warmup_steps}, decay_steps={decay_steps}: must be >= 0")
  if decay_steps and warmup_steps + decay_steps > num_train_steps:
    raise ValueError(f"The warm-up ({warmup_steps} steps) and the decay ({decay_steps} steps) "
                     f"overlap: together more than num_train_steps={num_train_steps}")
  decay_start = num_train_steps - decay_steps
  shape = DECAY_SHAPES[decay_shape]

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    rate = jnp.full_like(step, learning_rate)
    if decay_steps > 0:
      done = jnp.clip((step - decay_start) / decay_steps, 0.0, 1.0)
      decayed = final_learning_rate + (learning_rate - final_learning_rate) * shape(done)
      # Up to the decay's first step the rate is the peak exactly (final + (peak - final) * 1
      # need not be).
      rate = jnp.where(step <= decay_start, rate, decayed)
    if warmup_steps > 0:
      rate = jnp.where(step < warmup_steps, learning_rate * step / warmup_steps, rate)
    return rate
  return schedule


def decay_steps_of(sched: ml_collections.ConfigDict, num_train_steps: int) -> int:
  """The length of a `wsd` schedule's decay: `decay_steps`, or `decay_fraction` of the steps."""
  if sched.decay_steps and sched.decay_fraction:
    raise ValueError(f"config.schedule.decay_steps={sched.decay_steps} and decay_fraction="
                     f"{sched.decay_fraction}: set one of them (the other 0)")
  if sched.decay_steps < 0 or not 0.0 <= sched.decay_fraction <= 1.0:
    raise ValueError(f"config.schedule.decay_steps={sched.decay_steps}, decay_fraction="
                     f"{sched.decay_fraction}: expected decay_steps >= 0, 0 <= decay_fraction <= 1")
  return sched.decay_steps or int(round(sched.decay_fraction * num_train_steps))


def make_schedule(sched: Optional[ml_collections.ConfigDict], learning_rate: float,
                  warmup_steps: int, num_train_steps: int) -> optax.Schedule:
  """The schedule a `config.schedule` block names (None: the default, the original's)."""
  sched = default_schedule_config() if sched is None else sched
  if not 0.0 <= sched.final_fraction <= 1.0:
    raise ValueError(f"config.schedule.final_fraction={sched.final_fraction}: expected 0..1")
  final = learning_rate * sched.final_fraction
  # bert and linear have one shape and length of decay: wsd's fields do not apply to them.
  if sched.name in ("bert", "linear") and (
      sched.decay_steps or sched.decay_fraction or sched.decay_shape != "linear"):
    raise ValueError(
        f"config.schedule.name={sched.name!r} decays linearly over "
        f"{'all steps' if sched.name == 'bert' else 'every step after the warm-up'}; decay_steps, "
        "decay_fraction and decay_shape are the 'wsd' schedule's (--config.schedule.name=wsd)")
  if sched.name == "bert":
    return bert_schedule(learning_rate, warmup_steps, num_train_steps, decay_to=final)
  if sched.name == "wsd":
    return wsd_schedule(learning_rate, warmup_steps, num_train_steps,
                        decay_steps_of(sched, num_train_steps), sched.decay_shape, final)
  if sched.name == "linear":
    # transformers' get_linear_schedule_with_warmup (sentence-transformers' trainer's default):
    # the warm-up, then straight down to the final rate over every other step.
    return wsd_schedule(learning_rate, warmup_steps, num_train_steps,
                        max(num_train_steps - warmup_steps, 0), "linear", final)
  raise ValueError(f"config.schedule.name={sched.name!r}: expected one of {list(SCHEDULES)}")


def decay_mask(params) -> Any:
  """True for parameters that get weight decay: everything but norms (LayerNorm, and the
  ModernBERT family's norms and RMSNorms: their `scale`) and biases."""
  def keep(path, _):
    names = [getattr(p, "key", str(p)) for p in path]
    return not (names[-1] in ("bias", "output_bias", "scale") or "LayerNorm" in names)
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


def update_rms(grad, nu_hat, eps: float, stacked: bool = False):
  """StableAdamW's RMS_t of one tensor: sqrt(mean(g^2 / max(u, eps^2))), u the bias-corrected
  second moment *including* this step's gradient. `stacked`: the leaf holds layers stacked on
  its axis 0 (`scan_layers`), and each layer is its own tensor: one RMS per layer, [L, 1, ...]."""
  ratio = jnp.square(grad) / jnp.maximum(nu_hat, eps * eps)
  if stacked:
    return jnp.sqrt(jnp.mean(ratio, axis=tuple(range(1, ratio.ndim)), keepdims=True))
  return jnp.sqrt(jnp.mean(ratio))


def stable_adamw(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-6, weight_decay: float = 0.0, mask: Optional[Any] = None,
                 stacked: Optional[Any] = None) -> optax.GradientTransformation:
  """StableAdamW: Wortsman et al. 2023, "Stable and low-precision training for large-scale
  vision-language models", Algorithm 2 (AdamW with Adafactor's update clipping as a per-tensor
  learning rate); the form of `optimi.StableAdamW`, which ModernBERT trains with.

  For every tensor, with g its gradient and t = 1, 2, ... the update count:
    m_t = b1 m_{t-1} + (1 - b1) g          m^ = m_t / (1 - b1^t)
    v_t = b2 v_{t-1} + (1 - b2) g^2        v^ = v_t / (1 - b2^t)
    RMS_t = sqrt(mean over the tensor of g^2 / max(v^, eps^2))
    eta_t = lr(s) / max(1, RMS_t)
    theta_t = theta_{t-1} - eta_t (m^ / (sqrt(v^) + eps) + weight_decay * theta_{t-1})
  where s = t - 1 in a run of its own. The paper writes the correction into the betas
  (b^ = b (1 - b^(t-1)) / (1 - b^t), moments kept corrected); that is the same m^ and v^, and
  these are optax's `scale_by_adam` moments. The state is that of `optax.adamw`: optax's
  `ScaleByAdamState` (t as `count`, mu, nu; sharded like the parameters) then the schedule's
  own count s (`optax.scale_by_learning_rate`). Two counts, so that a later phase can carry the
  moments with their bias correction's t while its schedule starts again at s = 0
  (`config.init_optimizer_state`, bert_jax/tasks/jobs/init_checkpoint.py).

  Epsilon: twice, as in the paper and optimi: outside the square root in the Adam step, and
  squared as the floor of v^ in the RMS (so a coordinate whose gradient history is ~0 does not
  blow RMS_t up). Weight decay: decoupled and multiplied by eta_t, i.e. by the schedule *and* by
  this tensor's clipping factor (the paper's "- eta_t lambda theta_{t-1}"; optimi's default);
  `mask` (a tree of Python bools or a function of the parameters, as optax's) picks the tensors
  that decay. optimi's fully decoupled decay (`decouple_lr=True`, ModernBERT's recipe: the decay
  is (eta_t / lr_max) lambda theta) is this with weight_decay = lambda / lr_max
  (`build_optimizer` does that for `config.optimizer.fully_decoupled_weight_decay`).

  `stacked` (a tree of Python bools, or a function of the parameters, as `mask`): the leaves
  whose axis 0 stacks layers (`scan_layers`, the `layers` logical axis: `stacked_layers`); each
  layer of them is clipped by its own RMS_t, so a scanned model updates as the same model
  unrolled (tests/test_optim.py).

  Where no tensor is clipped (every RMS_t <= 1) the updates are those of `optax.adamw` with the
  same arguments, bit for bit (tests/test_optim.py).
  """
  return optax.chain(scale_by_stable_adam(b1, b2, eps, weight_decay, mask, stacked),
                     optax.scale_by_learning_rate(learning_rate))


def lamb(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-6, weight_decay: float = 0.0, mask: Optional[Any] = None,
         stacked: Optional[Any] = None) -> optax.GradientTransformation:
  """`optax.lamb` (You et al. 2019: Adam, decoupled decay, each tensor's update scaled by its
  trust ratio ||theta|| / ||update||), the same chain and state, with the trust ratio taken per
  layer of the `stacked` leaves (`scan_layers`: `stacked_layers`), so a scanned model updates as
  the same model unrolled (tests/test_optim.py). Without stacked leaves: `optax.lamb`, bit for
  bit."""
  return optax.chain(
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      optax.add_decayed_weights(weight_decay=weight_decay, mask=mask),
      scale_by_trust_ratio(stacked),
      optax.scale_by_learning_rate(learning_rate))


def scale_by_trust_ratio(stacked: Optional[Any] = None) -> optax.GradientTransformation:
  """`optax.scale_by_trust_ratio` (its state, its zero-norm rule), the norms of a stacked leaf
  taken per layer ([L, 1, ...]) rather than over the whole stack."""
  def update(updates, state, params=None):
    if params is None:
      raise ValueError("LAMB's trust ratio needs the parameters: tx.update(grads, state, params)")
    stacks = (jax.tree_util.tree_map(lambda _: False, updates) if stacked is None else
              stacked(params) if callable(stacked) else stacked)

    def scale(update, param, stack):
      axes = tuple(range(1, update.ndim)) if stack else None
      param_norm = optax.safe_norm(param, 0.0, axis=axes, keepdims=stack)
      update_norm = optax.safe_norm(update, 0.0, axis=axes, keepdims=stack)
      ratio = param_norm / update_norm
      zero = jnp.logical_or(param_norm == 0.0, update_norm == 0.0)
      return update * jnp.where(zero, jnp.array(1.0, dtype=param.dtype), ratio)

    return jax.tree_util.tree_map(scale, updates, params, stacks), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def scale_by_stable_adam(b1: float, b2: float, eps: float, weight_decay: float = 0.0,
                         mask: Optional[Any] = None,
                         stacked: Optional[Any] = None) -> optax.GradientTransformation:
  """`stable_adamw` before its learning rate: each tensor's (m^ / (sqrt(v^) + eps) +
  weight_decay * theta) / max(1, RMS_t), in optax's `ScaleByAdamState`."""
  def init(params):
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                  mu=optax.tree.zeros_like(params),
                                  nu=optax.tree.zeros_like(params))

  def update(grads, state, params=None):
    if params is None and weight_decay:
      raise ValueError("stable_adamw with weight decay needs the parameters: "
                       "tx.update(grads, state, params)")
    # The same moment and bias-correction arithmetic as optax.scale_by_adam.
    mu = optax.tree.update_moment(grads, state.mu, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(grads, state.nu, b2, 2)
    count = optax.safe_increment(state.count)
    mu_hat = optax.tree.bias_correction(mu, b1, count)
    nu_hat = optax.tree.bias_correction(nu, b2, count)
    if not weight_decay:
      decays = jax.tree_util.tree_map(lambda _: False, grads)
    elif mask is None:
      decays = jax.tree_util.tree_map(lambda _: True, grads)
    else:
      decays = mask(params) if callable(mask) else mask

    if stacked is None:
      stacks = jax.tree_util.tree_map(lambda _: False, grads)
    else:
      stacks = stacked(params) if callable(stacked) else stacked

    def step(g, m, v, p, decay, stack):
      direction = m / (jnp.sqrt(v) + eps)
      if decay:
        direction = direction + weight_decay * p
      # Divided by exactly 1 where the tensor is not clipped: then optax.adamw's update, bit
      # for bit, once scaled by the rate.
      clip = jnp.maximum(1.0, update_rms(g, v, eps, stacked=stack))
      return direction / jnp.asarray(clip, direction.dtype)

    if params is None:
      params = jax.tree_util.tree_map(lambda _: None, grads)
    updates = jax.tree_util.tree_map(step, grads, mu_hat, nu_hat, params, decays, stacks)
    return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def create_optimizer(config: ml_collections.ConfigDict, num_train_steps: int,
                     stacked: Optional[Any] = None) -> tuple[optax.GradientTransformation,
                                                             Callable]:
  """(optimizer, schedule) from `config.optimizer`, `config.schedule` and the step fields;
  `stacked`: the parameters' stacked-layer leaves (`stacked_layers`), for the optimizers that
  look at a tensor as a whole."""
  return build_optimizer(config.optimizer, config.learning_rate, config.warmup_steps,
                         num_train_steps, config.schedule, stacked=stacked)


def stacked_layers(param_axes) -> Any:
  """A tree of bools from the parameters' logical axes (`sharding.logical_axes`): True where
  axis 0 is `layers`, the stacked-layer axis of `scan_layers`."""
  from jax.sharding import PartitionSpec
  return jax.tree_util.tree_map(
      lambda spec: bool(spec) and spec[0] == "layers", param_axes,
      is_leaf=lambda x: isinstance(x, PartitionSpec) or x is None)


def build_optimizer(opt, learning_rate: float, warmup_steps: int, num_train_steps: int,
                    schedule: Optional[ml_collections.ConfigDict] = None,
                    stacked: Optional[Any] = None,
                    ) -> tuple[optax.GradientTransformation, Callable]:
  """(optimizer, schedule): `opt` (a `config.optimizer` block) with the schedule that `schedule`
  (a `config.schedule` block) names; None is the default block, the paper's schedule."""
  rate = make_schedule(schedule, learning_rate, warmup_steps, num_train_steps)
  weight_decay = opt.weight_decay
  if opt.fully_decoupled_weight_decay and weight_decay:
    # optimi's decouple_lr / Composer's decoupled decay: the decay of a step is
    # (lr_t / learning_rate) * weight_decay, i.e. lr_t * (weight_decay / learning_rate).
    if opt.name == "lamb":
      raise ValueError("config.optimizer.fully_decoupled_weight_decay is for adamw and "
                       "stable_adamw (LAMB's decay goes through its trust ratio)")
    if learning_rate <= 0:
      raise ValueError("config.optimizer.fully_decoupled_weight_decay divides by the peak "
                       f"learning rate; config.learning_rate={learning_rate}")
    weight_decay = weight_decay / learning_rate
  if opt.name == "adamw":
    if opt.bias_correction:
      moments = optax.scale_by_adam(b1=opt.b1, b2=opt.b2, eps=opt.eps)
    else:
      moments = scale_by_adam_without_bias_correction(opt.b1, opt.b2, opt.eps)
    core = optax.chain(moments, optax.add_decayed_weights(weight_decay, mask=decay_mask),
                       optax.scale_by_learning_rate(rate))
  elif opt.name == "lamb":
    core = lamb(rate, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=weight_decay,
                mask=decay_mask, stacked=stacked)
  elif opt.name == "stable_adamw":
    core = stable_adamw(rate, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=weight_decay,
                        mask=decay_mask, stacked=stacked)
  else:
    raise ValueError(f"config.optimizer.name={opt.name!r}: expected one of {list(OPTIMIZERS)}")
  chain = [core]
  if opt.clip_grad_norm:
    chain.insert(0, optax.clip_by_global_norm(opt.clip_grad_norm))
  return optax.chain(*chain), rate


def restart_schedules(opt_state, fresh):
  """`opt_state` (an earlier run's, carried into a new one) with the count of every
  learning-rate schedule in it (`optax.ScaleByScheduleState`: `optax.scale_by_learning_rate`'s,
  in every optimizer here) taken from `fresh` (the new run's own optimizer state, 0), so the
  schedule starts again; the moments and the count of their bias correction stay carried."""
  is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)
  return jax.tree_util.tree_map(lambda carried, new: new if is_schedule(carried) else carried,
                                opt_state, fresh, is_leaf=is_schedule)


def default_optimizer_config() -> ml_collections.ConfigDict:
  """`config.optimizer` (each field documented in experiments/common_defaults.py)."""
  return ml_collections.ConfigDict(dict(
      name="adamw", b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, clip_grad_norm=1.0,
      bias_correction=False, fully_decoupled_weight_decay=False))


def default_schedule_config() -> ml_collections.ConfigDict:
  """`config.schedule` (each field documented in experiments/common_defaults.py): the original
  schedule."""
  return ml_collections.ConfigDict(dict(
      name="bert", decay_steps=0, decay_fraction=0.0, decay_shape="linear", final_fraction=0.0))
