"""Optimizers and schedules (runtime/optim.py): StableAdamW against its formula written out in
numpy and against optax's AdamW where nothing is clipped; the warmup-stable-decay schedule's
shapes against their formulas; the default schedule and optimizer exactly as before."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax.runtime import optim
from experiments import pretraining_defaults

B1, B2, EPS = 0.9, 0.98, 1e-6


def _original_bert_schedule(learning_rate, warmup_steps, num_train_steps):
  """`optim.bert_schedule` as it was before config.schedule existed (decay to 0)."""
  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    frac = jnp.clip(step / max(num_train_steps, 1), 0.0, 1.0)
    decayed = (learning_rate - 0.0) * (1.0 - frac) + 0.0
    if warmup_steps <= 0:
      return decayed
    warm = learning_rate * step / warmup_steps
    return jnp.where(step < warmup_steps, warm, decayed)
  return schedule


def schedule_config(**fields):
  c = optim.default_schedule_config()
  c.update(fields)
  return c


def optimizer_config(**fields):
  c = optim.default_optimizer_config()
  c.update(fields)
  return c


def values(schedule, steps):
  return np.array([float(schedule(t)) for t in steps])


# ---------------------------------------------------------------------------------------------
# Schedules

@pytest.mark.parametrize("warmup, total", [(10, 100), (0, 50), (3, 7)])
def test_the_default_schedule_is_the_original_bit_for_bit(warmup, total):
  steps = range(total + 5)
  old = values(_original_bert_schedule(1e-4, warmup, total), steps)
  config = pretraining_defaults.get_config("tiny")
  config.learning_rate, config.warmup_steps = 1e-4, warmup
  built = [optim.create_optimizer(config, total)[1],
           optim.build_optimizer(config.optimizer, 1e-4, warmup, total)[1],   # fine-tuning's call
           optim.build_optimizer(config.optimizer, 1e-4, warmup, total, schedule_config())[1]]
  for schedule in built:
    np.testing.assert_array_equal(values(schedule, steps), old)
  # Compiled (as the train step runs it): XLA may fold the arithmetic differently from eager
  # execution, the same way for both.
  compiled_old = jax.jit(_original_bert_schedule(1e-4, warmup, total))
  np.testing.assert_array_equal(values(jax.jit(built[0]), steps), values(compiled_old, steps))


def test_the_default_adamw_is_the_original_chain_bit_for_bit():
  """Default config: clip at 1.0, Adam without bias correction, decay 0.01 off norms and biases,
  the schedule: the same updates as the chain built before the new fields existed."""
  params, grads = _tree(0), [_tree(s) for s in range(1, 4)]
  old = optax.chain(
      optax.clip_by_global_norm(1.0),
      optax.chain(optim.scale_by_adam_without_bias_correction(0.9, 0.999, 1e-6),
                  optax.add_decayed_weights(0.01, mask=optim.decay_mask),
                  optax.scale_by_learning_rate(_original_bert_schedule(1e-3, 1, 3))))
  new, _ = optim.build_optimizer(optim.default_optimizer_config(), 1e-3, 1, 3)
  _assert_same_updates(new, old, params, grads)


def wsd_reference(step, lr, warmup, total, decay, shape, final):
  """The warmup-stable-decay rate of `step`, written out in float64."""
  if step < warmup:
    return lr * step / warmup
  start = total - decay
  if decay == 0 or step < start:
    return lr
  x = min((step - start) / decay, 1.0)
  left = {"linear": 1 - x, "cosine": 0.5 * (1 + np.cos(np.pi * x)), "1-sqrt": 1 - np.sqrt(x)}
  return final + (lr - final) * left[shape]


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_values_against_the_formula(shape):
  lr, warmup, total, final_fraction = 8e-4, 10, 100, 0.1
  steps = [0, 1, 5, 9, 10, 11, 40, 69, 70, 71, 77, 85, 92, 99, 100, 130]
  by_fraction = optim.make_schedule(
      schedule_config(name="wsd", decay_fraction=0.3, decay_shape=shape,
                      final_fraction=final_fraction), lr, warmup, total)
  by_steps = optim.make_schedule(
      schedule_config(name="wsd", decay_steps=30, decay_shape=shape,
                      final_fraction=final_fraction), lr, warmup, total)
  expected = [wsd_reference(t, lr, warmup, total, 30, shape, lr * final_fraction) for t in steps]
  np.testing.assert_allclose(values(by_fraction, steps), expected, rtol=2e-6, atol=lr * 1e-6)
  np.testing.assert_array_equal(values(by_steps, steps), values(by_fraction, steps))
  got = dict(zip(steps, values(by_fraction, steps)))
  assert got[0] == 0.0                                  # warm-up from 0
  assert got[10] == got[40] == got[70] == np.float32(lr)   # stable: the peak exactly
  assert got[71] < got[70] and got[99] > got[100]
  np.testing.assert_allclose(got[100], lr * final_fraction, rtol=1e-6)
  assert got[130] == got[100]                           # past the end: the final rate


def test_one_minus_sqrt_decay_to_zero():
  """rate = lr * (1 - sqrt(t / T)) over a decay of T steps to 0."""
  lr, total, decay = 3e-4, 40, 16
  schedule = optim.wsd_schedule(lr, 4, total, decay, "1-sqrt")
  t = np.arange(decay + 1)
  np.testing.assert_allclose(values(schedule, total - decay + t), lr * (1 - np.sqrt(t / decay)),
                             rtol=2e-6, atol=lr * 1e-6)


def test_a_pure_decay_run():
  """ModernBERT's decay phase as a run of its own (from a checkpoint): no warm-up, no stable
  part, every step in the 1-sqrt decay, from learning_rate at step 0."""
  config = pretraining_defaults.get_config("tiny")
  config.learning_rate, config.warmup_steps, config.num_train_steps = 3e-4, 0, 50
  config.schedule.update(name="wsd", decay_fraction=1.0, decay_shape="1-sqrt",
                         final_fraction=0.001)
  _, schedule = optim.create_optimizer(config, config.num_train_steps)
  t = np.arange(51)
  final = 3e-4 * 0.001
  # float32 near the end: 1 - sqrt(49/50) loses digits; absolute error ~1e-6 of the peak.
  np.testing.assert_allclose(values(schedule, t), final + (3e-4 - final) * (1 - np.sqrt(t / 50)),
                             rtol=2e-6, atol=3e-4 * 1e-6)
  assert float(schedule(0)) == np.float32(3e-4)


def test_wsd_without_a_decay_stays_at_the_peak():
  """Warm-up then constant (ModernBERT's pre-training phase); warm-up 0 too: a constant rate."""
  schedule = optim.make_schedule(schedule_config(name="wsd"), 8e-4, 5, 20)
  np.testing.assert_allclose(values(schedule, [0, 1, 4]), [0.0, 8e-4 / 5, 8e-4 * 4 / 5],
                             rtol=1e-6)
  assert set(values(schedule, [5, 6, 19, 20, 1000])) == {np.float32(8e-4)}
  constant = optim.make_schedule(schedule_config(name="wsd"), 3e-4, 0, 20)
  assert set(values(constant, [0, 10, 25])) == {np.float32(3e-4)}


@pytest.mark.parametrize("warmup, total", [(6, 60), (0, 7), (3, 31)])
def test_the_linear_schedule_is_transformers(warmup, total):
  """`linear` (the embedding job's default) is transformers' get_linear_schedule_with_warmup,
  the schedule of sentence-transformers' trainer, step for step."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  parameter = torch.nn.Parameter(torch.zeros(1))
  optimizer = torch.optim.SGD([parameter], lr=2e-5)
  theirs = transformers.get_linear_schedule_with_warmup(optimizer, warmup, total)
  want = [2e-5 * theirs.lr_lambdas[0](t) for t in range(total + 2)]
  schedule = optim.make_schedule(schedule_config(name="linear"), 2e-5, warmup, total)
  np.testing.assert_allclose(values(schedule, range(total + 2)), want, rtol=1e-6, atol=1e-12)


def test_final_fraction_of_the_bert_schedule():
  schedule = optim.make_schedule(schedule_config(final_fraction=0.25), 1e-4, 10, 100)
  np.testing.assert_allclose(values(schedule, [5, 10, 55, 100]),
                             [0.5e-4, 0.25e-4 + 0.75e-4 * 0.9, 0.25e-4 + 0.75e-4 * 0.45, 0.25e-4],
                             rtol=1e-6)


@pytest.mark.parametrize("fields, warmup, message", [
    (dict(name="wsd", decay_steps=10, decay_fraction=0.1), 0, "set one of them"),
    (dict(name="wsd", decay_fraction=0.5), 60, "overlap"),
    (dict(name="wsd", decay_fraction=1.5), 0, "decay_fraction"),
    (dict(name="wsd", decay_steps=10, decay_shape="exponential"), 0, "decay_shape"),
    (dict(name="wsd", final_fraction=2.0), 0, "final_fraction"),
    (dict(decay_fraction=0.2), 0, "the 'wsd' schedule's"),
    (dict(decay_shape="1-sqrt"), 0, "the 'wsd' schedule's"),
    (dict(name="trapezoid"), 0, "expected one of"),
    (dict(name="linear", decay_fraction=0.5), 10, "the 'wsd' schedule's"),
])
def test_schedule_errors_name_the_field(fields, warmup, message):
  with pytest.raises(ValueError, match=message):
    optim.make_schedule(schedule_config(**fields), 1e-4, warmup, 100)


# ---------------------------------------------------------------------------------------------
# StableAdamW

def _tree(seed, scale=1.0):
  """A small parameter-shaped tree: decayed kernels and embeddings, an undecayed bias and norm."""
  rng = np.random.default_rng(seed)
  shapes = {"dense": {"kernel": (4, 3), "bias": (3,)}, "embeddings": {"embedding": (5, 4)},
            "LayerNorm": {"scale": (4,)}}
  return jax.tree_util.tree_map(lambda s: jnp.asarray(scale * rng.normal(size=s), jnp.float32),
                                shapes, is_leaf=lambda x: isinstance(x, tuple))


def _flat(tree):
  return {jax.tree_util.keystr(k): np.asarray(v, np.float64)
          for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def _assert_same_updates(tx_a, tx_b, params, grads):
  state_a, state_b = tx_a.init(params), tx_b.init(params)
  for g in grads:
    ua, state_a = tx_a.update(g, state_a, params)
    ub, state_b = tx_b.update(g, state_b, params)
    for a, b in zip(jax.tree_util.tree_leaves(ua), jax.tree_util.tree_leaves(ub)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    params = optax.apply_updates(params, ua)


def stable_adamw_reference(params, grads, rates, weight_decay, decays, peak=None):
  """Wortsman et al. 2023, Algorithm 2, in float64 with numpy, tensor by tensor; `peak`: the
  fully decoupled decay (eta_t / peak) * weight_decay. Returns the parameters after every step
  and each tensor's RMS_t."""
  p = _flat(params)
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  history, rms_log = [], {k: [] for k in p}
  for t, (g_tree, lr) in enumerate(zip(grads, rates), start=1):
    g = _flat(g_tree)
    for k in p:
      m[k] = B1 * m[k] + (1 - B1) * g[k]
      v[k] = B2 * v[k] + (1 - B2) * g[k] ** 2
      m_hat, v_hat = m[k] / (1 - B1 ** t), v[k] / (1 - B2 ** t)
      rms = np.sqrt(np.mean(g[k] ** 2 / np.maximum(v_hat, EPS ** 2)))
      eta = lr / max(1.0, rms)
      decay = 0.0
      if decays[k]:
        decay = (eta / peak if peak else eta) * weight_decay
      p[k] = p[k] - decay * p[k] - eta * m_hat / (np.sqrt(v_hat) + EPS)
      rms_log[k].append(rms)
    history.append({k: x.copy() for k, x in p.items()})
  return history, rms_log


def spiky_grads(steps=5):
  """Gradients of fixed directions (an entry of each tensor at 0) whose dense kernel jumps 20x at
  step 3 (clipped there: RMS_t > 1) and whose other tensors shrink every step (never clipped)."""
  base = jax.tree_util.tree_map(lambda x: x.at[0].set(0.0), _tree(100))
  kernel_scale = [1.0, 0.9, 20.0, 0.8, 0.7]
  grads = []
  for t in range(steps):
    g = jax.tree_util.tree_map(lambda x: x * 0.5 ** t, base)
    g["dense"]["kernel"] = base["dense"]["kernel"] * kernel_scale[t]
    grads.append(g)
  return grads


def _spiky_run_optimizer(fully_decoupled: bool):
  """(lr, weight_decay, tx, schedule): build_optimizer's stable_adamw without global-norm
  clipping, warmup-stable-decay over the 5 steps of `spiky_grads`."""
  lr, weight_decay = 1e-2, (1e-3 if fully_decoupled else 0.1)
  opt = optimizer_config(name="stable_adamw", b1=B1, b2=B2, eps=EPS, weight_decay=weight_decay,
                         clip_grad_norm=0.0, fully_decoupled_weight_decay=fully_decoupled)
  tx, schedule = optim.build_optimizer(opt, lr, 1, 5, schedule_config(
      name="wsd", decay_steps=2, decay_shape="1-sqrt"))
  return lr, weight_decay, tx, schedule


@pytest.mark.parametrize("fully_decoupled", [False, True])
def test_stable_adamw_is_its_formula(fully_decoupled):
  """build_optimizer's stable_adamw without global-norm clipping (clip_grad_norm=0, as
  ModernBERT runs it: the spike has a global norm far above 1 and is not clipped), under jit,
  with the wsd schedule, against Algorithm 2 in numpy for 5 steps."""
  lr, weight_decay, tx, schedule = _spiky_run_optimizer(fully_decoupled)
  params, grads = _tree(0), spiky_grads()
  rates = [float(schedule(t)) for t in range(5)]
  assert rates[0] == 0.0 and rates[1] == rates[2] == rates[3] == np.float32(lr) > rates[4]
  decays = _flat(optim.decay_mask(params))
  expected, rms = stable_adamw_reference(params, grads, rates, weight_decay, decays,
                                         peak=lr if fully_decoupled else None)
  # The premise: the kernel is clipped at the spike, the others never; norm and bias not decayed.
  kernel, embedding = "['dense']['kernel']", "['embeddings']['embedding']"
  assert rms[kernel][2] > 1.2 and max(rms[kernel][:2] + rms[kernel][3:]) < 1.0
  assert max(max(r) for k, r in rms.items() if k != kernel) < 1.0
  assert not decays["['LayerNorm']['scale']"] and not decays["['dense']['bias']"]
  assert decays[kernel] and decays[embedding]

  state, update = tx.init(params), jax.jit(tx.update)
  for step, g in enumerate(grads):
    updates, state = update(g, state, params)
    params = optax.apply_updates(params, updates)
    got = _flat(params)
    for key, want in expected[step].items():
      np.testing.assert_allclose(got[key], want, rtol=2e-6, atol=1e-7, err_msg=f"{key} {step}")
  adam, schedule_state = state[0]   # the moments' count and the schedule's
  assert int(adam.count) == int(schedule_state.count) == 5


@pytest.mark.parametrize("fully_decoupled", [False, True])
def test_stable_adamw_matches_optimi(fully_decoupled):
  """The same spiky gradients through optimi.StableAdamW (torch-optimi: the optimizer ModernBERT
  trains with) in param groups by our decay mask, each step's rate set to our schedule(t):
  parameters equal to float32 rounding at every step (the spike at step 3 is clipped:
  test_stable_adamw_is_its_formula checks that premise on these gradients)."""
  torch = pytest.importorskip("torch", reason="optimi's StableAdamW runs on PyTorch")
  optimi = pytest.importorskip("optimi", reason="pip install torch-optimi (a test extra)")
  lr, weight_decay, tx, schedule = _spiky_run_optimizer(fully_decoupled)
  params, grads = _tree(0), spiky_grads()
  decays = _flat(optim.decay_mask(params))
  theirs = {k: torch.nn.Parameter(torch.tensor(np.asarray(v))) for k, v in _flat(params).items()}
  torch_opt = optimi.StableAdamW(
      [dict(params=[p for k, p in theirs.items() if decays[k]], weight_decay=weight_decay),
       dict(params=[p for k, p in theirs.items() if not decays[k]], weight_decay=0.0)],
      lr=lr, betas=(B1, B2), eps=EPS, decouple_lr=fully_decoupled,
      max_lr=lr if fully_decoupled else None, kahan_sum=False, foreach=False, triton=False)

  state, update = tx.init(params), jax.jit(tx.update)
  for step, g in enumerate(grads):
    updates, state = update(g, state, params)
    params = optax.apply_updates(params, updates)
    for k, grad in _flat(g).items():
      theirs[k].grad = torch.tensor(np.asarray(grad))
    for group in torch_opt.param_groups:
      group["lr"] = float(schedule(step))
    torch_opt.step()
    ours = _flat(params)
    for k, p in theirs.items():
      np.testing.assert_allclose(ours[k], p.detach().numpy(), rtol=2e-6, atol=1e-7,
                                 err_msg=f"{k} at step {step}")


def test_without_clipping_stable_adamw_is_optax_adamw_bit_for_bit():
  """Where every tensor's RMS_t <= 1 (shrinking gradients, some entries 0) the updates equal
  optax.adamw's (bias-corrected Adam, decay lr_t * weight_decay * theta off the mask) exactly,
  both as the bare transformation and as built from the config (vs. adamw with
  bias_correction=True), global-norm clipping, schedule and fully decoupled decay included."""
  base = _tree(7)
  grads = [jax.tree_util.tree_map(lambda x: (x * 0.6 ** t).at[0].set(0.0), base)
           for t in range(6)]
  params = _tree(0)
  # The premise, checked on optax's own moments: no tensor is clipped at any step.
  adam, state = optax.scale_by_adam(B1, B2, EPS), None
  state = adam.init(params)
  for t, g in enumerate(grads, start=1):
    _, state = adam.update(g, state)
    nu_hat = jax.tree_util.tree_map(lambda v: v / (1 - B2 ** t), state.nu)
    assert max(jax.tree_util.tree_leaves(jax.tree_util.tree_map(
        lambda g, v: float(optim.update_rms(g, v, EPS)), g, nu_hat))) < 1.0

  schedule = optim.wsd_schedule(1e-2, 2, 6, 3, "1-sqrt")
  _assert_same_updates(
      optim.stable_adamw(schedule, B1, B2, EPS, 0.05, optim.decay_mask),
      optax.adamw(schedule, B1, B2, EPS, weight_decay=0.05, mask=optim.decay_mask),
      params, grads)
  for fully_decoupled in (False, True):
    fields = dict(b1=B1, b2=B2, eps=EPS, weight_decay=0.05, clip_grad_norm=1.0,
                  fully_decoupled_weight_decay=fully_decoupled)
    stable, _ = optim.build_optimizer(optimizer_config(name="stable_adamw", **fields), 1e-2, 2, 6,
                                      schedule_config(name="wsd", decay_steps=3))
    adamw, _ = optim.build_optimizer(optimizer_config(name="adamw", bias_correction=True,
                                                      **fields), 1e-2, 2, 6,
                                     schedule_config(name="wsd", decay_steps=3))
    _assert_same_updates(stable, adamw, params, grads)


def test_clipping_is_per_tensor():
  """At the spike only the kernel's step shrinks: the unclipped tensors' updates are still
  optax.adamw's, the kernel's is adamw's divided by its RMS_t (> 1)."""
  params, grads = _tree(0), spiky_grads()
  stable = optim.stable_adamw(1e-2, B1, B2, EPS, 0.1, optim.decay_mask)
  adamw = optax.adamw(1e-2, B1, B2, EPS, weight_decay=0.1, mask=optim.decay_mask)
  s_state, a_state = stable.init(params), adamw.init(params)
  for step, g in enumerate(grads, start=1):
    us, s_state = stable.update(g, s_state, params)
    ua, a_state = adamw.update(g, a_state, params)
    us, ua = _flat(us), _flat(ua)
    nu_hat = _flat(jax.tree_util.tree_map(lambda v: v / (1 - B2 ** step), s_state[0].nu))
    for key, g_k in _flat(g).items():
      rms = float(optim.update_rms(jnp.asarray(g_k, jnp.float32),
                                   jnp.asarray(nu_hat[key], jnp.float32), EPS))
      if rms <= 1.0:
        np.testing.assert_array_equal(us[key], ua[key])
      else:
        assert step == 3 and key == "['dense']['kernel']"
        np.testing.assert_allclose(us[key], ua[key] / rms, rtol=1e-6)


def test_clip_grad_norm_zero_turns_global_clipping_off():
  """A gradient of global norm ~100, then a small one: with clip_grad_norm=0 the built optimizer
  is the bare stable_adamw; with 1.0 the first gradient is scaled to norm 1, which changes the
  second step's Adam statistics."""
  params = _tree(0)
  grads = [_tree(1, scale=30.0), _tree(2, scale=0.01)]
  bare = optim.stable_adamw(1e-3, B1, B2, EPS, 0.01, optim.decay_mask)
  fields = dict(name="stable_adamw", b1=B1, b2=B2, eps=EPS, weight_decay=0.01)
  unclipped, _ = optim.build_optimizer(optimizer_config(clip_grad_norm=0.0, **fields),
                                       1e-3, 0, 10, schedule_config(name="wsd"))
  _assert_same_updates(unclipped, bare, params, grads)
  clipped, _ = optim.build_optimizer(optimizer_config(clip_grad_norm=1.0, **fields),
                                     1e-3, 0, 10, schedule_config(name="wsd"))
  states = [tx.init(params) for tx in (clipped, unclipped)]
  for g in grads:
    (uc, states[0]), (uu, states[1]) = (clipped.update(g, states[0], params),
                                        unclipped.update(g, states[1], params))
  kernel = lambda u: np.asarray(u["dense"]["kernel"])
  assert not np.allclose(kernel(uc), kernel(uu), rtol=1e-2)


def test_stable_adamw_under_a_frozen_encoder_mask():
  """Fine-tuning's feature-based path wraps the optimizer in optax.multi_transform (the frozen
  part gets no state and no update): stable_adamw works inside it."""
  opt = optimizer_config(name="stable_adamw", bias_correction=True)
  tx, _ = optim.build_optimizer(opt, 1e-3, 0, 10)
  params = {"bert": _tree(0), "classifier": _tree(1)}
  labels = lambda p: {k: ("frozen" if k == "bert" else "train") for k in p}
  tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
  state = tx.init(params)
  updates, _ = jax.jit(tx.update)({"bert": _tree(2), "classifier": _tree(3)}, state, params)
  assert all(not np.any(np.asarray(u)) for u in jax.tree_util.tree_leaves(updates["bert"]))
  assert all(np.all(np.isfinite(np.asarray(u))) and np.any(np.asarray(u))
             for u in jax.tree_util.tree_leaves(updates["classifier"]))


def test_fully_decoupled_adamw_divides_the_decay_by_the_peak():
  params, grads = _tree(0), [_tree(1), _tree(2)]
  schedule = optim.bert_schedule(2e-3, 1, 4)
  built, _ = optim.build_optimizer(
      optimizer_config(bias_correction=True, weight_decay=1e-5, clip_grad_norm=0.0,
                       fully_decoupled_weight_decay=True), 2e-3, 1, 4)
  _assert_same_updates(built, optax.adamw(schedule, 0.9, 0.999, 1e-6, weight_decay=1e-5 / 2e-3,
                                          mask=optim.decay_mask), params, grads)


@pytest.mark.parametrize("fields, learning_rate, message", [
    (dict(name="lamb", fully_decoupled_weight_decay=True), 1e-3, "adamw and stable_adamw"),
    (dict(fully_decoupled_weight_decay=True), 0.0, "peak learning rate"),
    (dict(name="adafactor"), 1e-3, "stable_adamw"),
])
def test_optimizer_errors_name_the_field(fields, learning_rate, message):
  with pytest.raises(ValueError, match=message):
    optim.build_optimizer(optimizer_config(**fields), learning_rate, 0, 10)


def test_pretraining_steps_with_stable_adamw_and_wsd():
  """The pre-training step of a tiny model runs on the new optimizer and schedule from the
  config (create_optimizer), and logs the schedule's rate."""
  from tests.test_train_step import make_step, synthetic_batch, tiny_config
  config = tiny_config(warmup_steps=1, num_train_steps=4)
  config.optimizer.update(name="stable_adamw", b2=0.98, weight_decay=1e-5, clip_grad_norm=0.0,
                          fully_decoupled_weight_decay=True)
  config.schedule.update(name="wsd", decay_fraction=0.5, decay_shape="1-sqrt")
  state, step = make_step(config)
  rates, before = [], state.params
  for i in range(3):
    state, metrics = step(state, synthetic_batch(i), jax.random.PRNGKey(0))
    assert np.isfinite(float(metrics["loss"])) and float(metrics["skipped"]) == 0.0
    rates.append(float(metrics["learning_rate"]))
  np.testing.assert_allclose(rates, [0.0, 1e-3, 1e-3], rtol=1e-6)
  moved = [np.any(np.asarray(a) != np.asarray(b)) for a, b in
           zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(before))]
  assert all(moved)


def test_every_schedule_and_optimizer_field_is_declared():
  """The fields build_optimizer reads are the defaults' (a locked config has them all)."""
  config = pretraining_defaults.get_config("tiny")
  assert set(config.schedule) == {"name", "decay_steps", "decay_fraction", "decay_shape",
                                  "final_fraction"}
  assert config.optimizer.fully_decoupled_weight_decay is False
  assert isinstance(config.schedule, ml_collections.ConfigDict)


def test_epsilon_squared_floors_the_rms():
  """RMS_t divides by max(v^, eps^2): a tensor whose gradients are far below eps (v^ < eps^2)
  is not clipped by a 20x jump, one whose gradients are small but above eps is."""
  params = {"small": {"kernel": jnp.ones((6,), jnp.float32)},
            "tiny": {"kernel": jnp.ones((6,), jnp.float32)}}
  direction = np.asarray([1.0, -0.5, 0.8, -1.2, 0.3, 0.0], np.float32)
  grads = [{"small": {"kernel": jnp.asarray(direction * 1e-4 * s)},
            "tiny": {"kernel": jnp.asarray(direction * 1e-8 * s)}} for s in (1.0, 0.9, 20.0)]
  rates = [1e-2] * 3
  decays = _flat(optim.decay_mask(params))
  expected, rms = stable_adamw_reference(params, grads, rates, 0.1, decays)
  assert rms["['small']['kernel']"][2] > 1.2 and max(rms["['tiny']['kernel']"]) < 1.0
  tx = optim.stable_adamw(1e-2, B1, B2, EPS, 0.1, optim.decay_mask)
  state = tx.init(params)
  for step, g in enumerate(grads):
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
    for key, want in expected[step].items():
      np.testing.assert_allclose(_flat(params)[key], want, rtol=2e-6, atol=1e-9)


def _stack(trees):
  """Per-layer trees -> one tree of leaves stacked on axis 0 (the scan_layers layout)."""
  return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


def _updates(tx, params, steps):
  """The updates of `tx` at fixed `params` for each gradient of `steps`."""
  state, out = tx.init(params), []
  for g in steps:
    update, state = tx.update(g, state, params)
    out.append(update)
  return out


def test_stacked_layers_are_clipped_each_by_its_own_rms():
  """A leaf of layers stacked on axis 0 (`scan_layers`) with `stacked`: each layer's update is
  what it would be as its own tensor (the model unrolled); a spike in layer 0 clips layer 0
  only. Without `stacked` the one RMS of the whole leaf clips every layer (what scanning did)."""
  rng = np.random.default_rng(0)
  layers = [{"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)} for _ in range(3)]
  grads = [[{"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)} for _ in range(3)]
           for _ in range(3)]
  for layer in grads[2][:1]:   # step 3: a spike in layer 0 alone
    layer["w"] = layer["w"] * 50.0

  tx = optim.stable_adamw(1e-2, B1, B2, EPS, 0.1)
  per_layer = [_updates(tx, layers[i], [grads[s][i] for s in range(3)]) for i in range(3)]
  stacked = _updates(optim.stable_adamw(1e-2, B1, B2, EPS, 0.1, stacked={"w": True}),
                _stack(layers), [_stack(g) for g in grads])
  whole = _updates(tx, _stack(layers), [_stack(g) for g in grads])
  for s in range(3):
    want = np.stack([np.asarray(per_layer[i][s]["w"]) for i in range(3)])
    np.testing.assert_allclose(np.asarray(stacked[s]["w"]), want, rtol=1e-6, atol=1e-9)
  # The test can fail: one RMS over the stack clips the unspiked layers 1 and 2 as well.
  assert not np.allclose(np.asarray(whole[2]["w"])[1:], want[1:], rtol=1e-3)


def test_a_scanned_model_s_stacked_leaves_are_the_optimizer_s():
  """`stacked_layers` of a job's logical axes marks exactly the leaves under the scanned
  `encoder/layer` (the `layers` axis), for the pre-training job's optimizer."""
  from bert_jax.parallel import sharding
  from bert_jax.tasks.jobs import pretraining
  from experiments import pretrain_modernbert
  config = pretrain_modernbert.get_config("quick")
  config.model.scan_layers = True
  model = pretraining.build_model(pretraining.job_config(config))
  axes = sharding.logical_axes(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
  marked = {jax.tree_util.keystr(path): flag for path, flag in
            jax.tree_util.tree_leaves_with_path(optim.stacked_layers(axes))}
  assert any(marked.values())
  for path, flag in marked.items():
    assert flag == ("['layer']" in path), path


def test_lamb_trust_ratio_is_per_layer_of_a_stacked_leaf():
  """LAMB's trust ratio ||theta|| / ||update|| of each layer of a leaf stacked on axis 0
  (`scan_layers`): the scanned update equals each layer's as its own tensor (the model
  unrolled), and not the ratio of the whole stack; without stacked leaves it is optax.lamb, bit
  for bit."""
  rng = np.random.default_rng(1)
  scales = (0.1, 1.0, 10.0)   # layers of other norms: one ratio for the stack is wrong for all
  layers = [{"w": jnp.asarray(s * rng.normal(size=(4, 3)), jnp.float32)} for s in scales]
  grads = [[{"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)} for _ in range(3)]
           for _ in range(2)]

  per_layer = [_updates(optim.lamb(1e-2, weight_decay=0.01), layers[i],
                   [grads[s][i] for s in range(2)]) for i in range(3)]
  stacked = _updates(optim.lamb(1e-2, weight_decay=0.01, stacked={"w": True}), _stack(layers),
                [_stack(g) for g in grads])
  whole = _updates(optim.lamb(1e-2, weight_decay=0.01), _stack(layers), [_stack(g) for g in grads])
  theirs = _updates(optax.lamb(1e-2, weight_decay=0.01), _stack(layers), [_stack(g) for g in grads])
  for s in range(2):
    want = np.stack([np.asarray(per_layer[i][s]["w"]) for i in range(3)])
    np.testing.assert_allclose(np.asarray(stacked[s]["w"]), want, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(np.asarray(whole[s]["w"]), np.asarray(theirs[s]["w"]))
  assert not np.allclose(np.asarray(whole[1]["w"]), want, rtol=1e-3)
  assert (jax.tree_util.tree_structure(optim.lamb(1e-2).init(layers[0])) ==
          jax.tree_util.tree_structure(optax.lamb(1e-2).init(layers[0])))   # checkpoints alike


@pytest.mark.parametrize("name", ["stable_adamw", "lamb"])
def test_fine_tuning_a_scanned_encoder_updates_each_layer_as_its_own_tensor(tmp_path, name):
  """The fine-tuning job hands its optimizer the stacked leaves (`scan_layers`): one update of
  the scanned model equals the unrolled model's, layer by layer."""
  import copy
  from bert_jax import families
  from bert_jax.tasks import registry
  from experiments import glue
  from tests import finetuning_fixtures as fx
  checkpoint = fx.write_checkpoint(str(tmp_path / "ckpt"), num_hidden_layers=3)
  glue_dir = fx.write_glue_dir(str(tmp_path / "glue"))
  bert_config = fx.tiny_bert_config(num_hidden_layers=3)

  def stack(tree):   # the unrolled model's tree in the scanned layout
    tree = copy.deepcopy(jax.tree_util.tree_map(np.asarray, tree))
    families.of(bert_config).stack_layers(tree["bert"]["encoder"], bert_config)
    return tree

  def optimizer(scan):
    config = glue.get_config("task=mrpc,quick")
    config.data.glue_dir, config.init_checkpoint, config.max_seq_length = glue_dir, checkpoint, 16
    config.optimizer.name, config.model.scan_layers = name, scan
    job = registry.job(config)
    return job.train_step.keywords["tx"], job.init_state().params

  tx_unrolled, params = optimizer(False)
  tx_scanned, scanned_params = optimizer(True)
  assert jax.tree_util.tree_structure(scanned_params) == jax.tree_util.tree_structure(
      stack(params))
  rng = np.random.default_rng(0)
  steps = [jax.tree_util.tree_map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype),
                                  params) for _ in range(2)]
  # Step 2: a spike in layer 0 alone (StableAdamW clips from its second step on).
  steps[1]["bert"]["encoder"]["layer_0"] = jax.tree_util.tree_map(
      lambda g: 50.0 * g, steps[1]["bert"]["encoder"]["layer_0"])
  unrolled_state, scanned_state = tx_unrolled.init(params), tx_scanned.init(stack(params))
  for grads in steps:
    want, unrolled_state = tx_unrolled.update(grads, unrolled_state, params)
    got, scanned_state = tx_scanned.update(stack(grads), scanned_state, stack(params))
    for a, b in zip(jax.tree_util.tree_leaves(stack(want)), jax.tree_util.tree_leaves(got)):
      np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-8)
