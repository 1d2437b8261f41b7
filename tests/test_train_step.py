"""The pure train step: schedule, weight-decay mask, non-finite skip, gradient accumulation."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.runtime import optim
from bert_jax.tasks.jobs import pretraining
from experiments import pretraining_defaults

B, S, P, V = 8, 16, 4, 97


def tiny_config(**overrides):
  c = pretraining_defaults.get_config("tiny")
  c.model.update(vocab_size=V, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                 num_hidden_layers=2, max_position_embeddings=S,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  c.max_seq_length, c.max_predictions_per_seq, c.global_batch_size = S, P, B
  c.num_train_steps, c.warmup_steps, c.learning_rate = 10, 2, 1e-3
  for k, v in overrides.items():
    c[k] = v
  return c


def synthetic_batch(seed=0, batch=B):
  rng = np.random.RandomState(seed)
  lengths = rng.randint(6, S + 1, size=batch)
  mask = (np.arange(S)[None] < lengths[:, None]).astype(np.int32)
  ids = rng.randint(5, V, size=(batch, S)) * mask
  positions = np.sort(np.stack([rng.choice(np.arange(1, l - 1), P, replace=False)
                                for l in lengths]), axis=1)
  weights = np.ones((batch, P), np.float32)
  weights[::3, -1] = 0.0  # some padded predictions
  return {"input_ids": ids, "input_mask": mask,
          "segment_ids": (np.arange(S)[None] >= lengths[:, None] // 2).astype(np.int32) * mask,
          "masked_lm_positions": positions.astype(np.int32),
          "masked_lm_ids": rng.randint(5, V, size=(batch, P)).astype(np.int32),
          "masked_lm_weights": weights,
          "next_sentence_labels": rng.randint(0, 2, size=(batch, 1)).astype(np.int32)}


def make_step(config):
  model = pretraining.build_model(config)
  tx, schedule = optim.create_optimizer(config, config.num_train_steps)
  state = pretraining.create_train_state(config, model, tx, jax.random.PRNGKey(0))
  step = jax.jit(functools.partial(pretraining.train_step, model=model, tx=tx,
                                   objective=config.objective, schedule=schedule,
                                   grad_accum_steps=config.grad_accum_steps))
  return state, step


def test_schedule_is_the_original():
  s = optim.bert_schedule(1e-4, warmup_steps=10, num_train_steps=100)
  assert float(s(0)) == 0.0
  np.testing.assert_allclose(float(s(5)), 0.5e-4, rtol=1e-6)
  # After warm-up: the decay computed over all steps, as the original polynomial_decay.
  np.testing.assert_allclose(float(s(10)), 1e-4 * 0.9, rtol=1e-6)
  np.testing.assert_allclose(float(s(100)), 0.0, atol=1e-12)


def test_weight_decay_skips_layer_norm_and_biases():
  config = tiny_config()
  params = pretraining.create_train_state(
      config, pretraining.build_model(config), optim.create_optimizer(config, 10)[0],
      jax.random.PRNGKey(0)).params
  mask = optim.decay_mask(params)
  enc = mask["bert"]["encoder"]["layer_0"]
  assert enc["attention"]["self"]["query"]["kernel"] is True
  assert enc["attention"]["self"]["query"]["bias"] is False
  assert enc["output"]["LayerNorm"]["scale"] is False
  assert mask["cls"]["predictions"]["output_bias"] is False
  assert mask["bert"]["embeddings"]["word_embeddings"]["embedding"] is True


def test_step_learns_and_is_deterministic():
  config = tiny_config()
  state, step = make_step(config)
  batch = synthetic_batch()
  rng = jax.random.PRNGKey(1)
  s1, m1 = step(state, batch, rng)
  s1b, m1b = step(state, batch, rng)
  assert float(m1["loss"]) == float(m1b["loss"])
  losses = [float(m1["loss"])]
  s = s1
  for _ in range(6):
    s, m = step(s, batch, rng)
    losses.append(float(m["loss"]))
  assert losses[-1] < losses[0]
  assert int(s.step) == 7
  for key in ("mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "grad_norm",
              "param_norm", "learning_rate"):
    assert np.isfinite(float(m[key])), key


def test_non_finite_step_is_skipped_and_counted():
  config = tiny_config()
  state, step = make_step(config)
  state, _ = step(state, synthetic_batch(), jax.random.PRNGKey(0))
  poisoned = jax.tree_util.tree_map(np.copy, state.params)
  # A NaN in the NSP head makes the loss NaN without touching the encoder.
  poisoned["cls"]["seq_relationship"]["bias"] = np.array([np.nan, 0.0], np.float32)
  bad_state = state.replace(params=poisoned)
  after, metrics = step(bad_state, synthetic_batch(1), jax.random.PRNGKey(0))
  assert float(metrics["skipped"]) == 1.0
  assert int(after.consecutive_skips) == 1 and int(after.total_skips) == 1
  assert int(after.step) == int(state.step) + 1
  for a, b in zip(jax.tree_util.tree_leaves(after.params), jax.tree_util.tree_leaves(poisoned)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for a, b in zip(jax.tree_util.tree_leaves(after.opt_state),
                  jax.tree_util.tree_leaves(bad_state.opt_state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The skip did not advance the optimizer's schedule: the next step applies (and logs) the
  # rate the skipped step would have had, not the one of its own step number.
  _, schedule = optim.create_optimizer(config, config.num_train_steps)
  clean = after.replace(params=state.params)
  _, next_metrics = step(clean, synthetic_batch(2), jax.random.PRNGKey(0))
  assert float(next_metrics["learning_rate"]) == float(metrics["learning_rate"]) == float(
      schedule(1))
  assert float(schedule(1)) != float(schedule(2))


@pytest.mark.parametrize("objective", ["mlm_nsp", "ltr"])
def test_gradient_accumulation_equals_the_large_batch(objective):
  batch = synthetic_batch(3)
  results = []
  for accum in (1, 4):
    config = tiny_config(grad_accum_steps=accum, objective=objective)
    state, step = make_step(config)
    new_state, metrics = step(state, batch, jax.random.PRNGKey(0))
    results.append((new_state, metrics))
  (a, ma), (b, mb) = results
  np.testing.assert_allclose(float(ma["loss"]), float(mb["loss"]), rtol=1e-5)
  np.testing.assert_allclose(float(ma["grad_norm"]), float(mb["grad_norm"]), rtol=1e-4)
  for x, y in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-6)


def test_ablation_objectives():
  batch = synthetic_batch(4)
  for objective, has_nsp in (("mlm", False), ("ltr", False), ("mlm_nsp", True)):
    config = tiny_config(objective=objective)
    state, step = make_step(config)
    assert ("seq_relationship" in state.params["cls"]) == has_nsp
    _, metrics = step(state, batch, jax.random.PRNGKey(0))
    assert ("nsp_loss" in metrics) == has_nsp
    assert np.isfinite(float(metrics["loss"]))
  assert pretraining.bert_config_from(tiny_config(objective="ltr")).causal_attention


def test_ltr_targets_are_next_tokens():
  batch = {"input_ids": jnp.array([[1, 7, 8, 9, 2, 0]]),
           "input_mask": jnp.array([[1, 1, 1, 1, 1, 0]])}
  labels, weights = pretraining.ltr_targets(batch)
  np.testing.assert_array_equal(labels, [[7, 8, 9, 2, 0, 0]])
  np.testing.assert_array_equal(weights, [[1, 1, 1, 1, 0, 0]])


def test_weighted_cross_entropy_matches_the_gather_and_argmax_definition():
  """The loss equals -log_softmax[label] and argmax accuracy, gradients included."""
  rng = np.random.RandomState(0)
  logits = jnp.asarray(rng.randn(3, 5, 40).astype(np.float32) * 4)    # [B, P, V]
  labels = jnp.asarray(rng.randint(0, 40, size=(3, 5)))
  labels = labels.at[0, 0].set(int(jnp.argmax(logits[0, 0])))         # at least one correct
  weights = jnp.asarray(rng.rand(3, 5).astype(np.float32))

  def reference(logits):
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    return jnp.sum(nll * weights)

  nll, correct, total = pretraining.weighted_cross_entropy(logits, labels, weights)
  np.testing.assert_allclose(nll, reference(logits), rtol=1e-6)
  expected_correct = jnp.sum((jnp.argmax(logits, -1) == labels) * weights)
  np.testing.assert_allclose(correct, expected_correct, rtol=1e-6)
  assert float(expected_correct) > 0
  np.testing.assert_allclose(total, jnp.sum(weights), rtol=1e-6)
  ours = jax.grad(lambda x: pretraining.weighted_cross_entropy(x, labels, weights)[0])(logits)
  np.testing.assert_allclose(ours, jax.grad(reference)(logits), rtol=1e-5, atol=1e-7)
