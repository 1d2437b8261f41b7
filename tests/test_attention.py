"""The GPU attention path (`jax.nn.dot_product_attention`, cuDNN where shapes allow) computes what
the XLA einsum path computes. No GPU here: the same call with implementation='xla' is checked on
CPU, so on a GPU only the kernel behind it changes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import kernels, layers, ops, post_ln
from bert_jax.model.config import BertConfig

B, S = 3, 12


def _config(**overrides):
  fields = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=S)
  fields.update(overrides)
  return BertConfig.create(**fields)


def _masks():
  rng = np.random.RandomState(0)
  lengths = np.array([S, 7, 3])
  padding = (np.arange(S)[None] < lengths[:, None]).astype(np.int32)       # [B, S]
  segment = np.where(np.arange(S)[None] < 5, 1, 2) * padding               # two packed pairs
  block = (segment[:, :, None] == segment[:, None, :]) & (segment[:, :, None] > 0)  # [B, S, S]
  ids = rng.randint(5, 50, size=(B, S)) * padding
  return ids, {"padding": padding, "block_diagonal": block.astype(np.int32)}


@pytest.mark.slow
@pytest.mark.parametrize("mask_kind", ["padding", "block_diagonal"])
@pytest.mark.parametrize("causal", [False, True])
def test_dot_product_attention_path_equals_the_xla_path(monkeypatch, mask_kind, causal):
  config = _config(causal_attention=causal)
  ids, masks = _masks()
  model = post_ln.BertModel(config)
  params = layers.init_params(model, jax.random.PRNGKey(0), seq_len=S)

  # A fixed random projection: sum(out ** 2) would be constant under the final LayerNorm, leaving
  # gradients of pure rounding noise to compare.
  weights = np.random.RandomState(1).randn(B, S, config.hidden_size).astype(np.float32)

  def loss(params):
    out = model.apply({"params": params}, ids, masks[mask_kind])["sequence_output"]  # [B, S, H]
    # Rows that are all padding attend to nothing real; compare the real positions only.
    real = np.asarray(masks["padding"], np.float32)[..., None]
    return jnp.sum(out * real * weights)

  reference, reference_grads = jax.value_and_grad(loss)(params)
  assert layers.attention_implementation(config, deterministic=True) is None  # CPU: XLA path

  calls = []

  def forced(c, deterministic):
    calls.append(deterministic)
    return "xla"

  monkeypatch.setattr(post_ln, "attention_implementation", forced)
  fused, fused_grads = jax.value_and_grad(loss)(params)
  assert calls, "the dot_product_attention path was not taken"
  np.testing.assert_allclose(fused, reference, rtol=1e-5)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(fused_grads),
                          jax.tree_util.tree_leaves(reference_grads)):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6, err_msg=jax.tree_util.keystr(path))


def test_fused_attention_matches_softmax_attention():
  rng = np.random.RandomState(1)
  q, k, v = (jnp.asarray(rng.randn(B, S, 2, 8), jnp.float32) for _ in range(3))
  bias = layers.attention_bias(jnp.asarray(_masks()[1]["padding"]), causal=False)  # [B,1,1,S]
  out = layers.fused_attention(q, k, v, bias, "xla")
  logits = jnp.einsum("bqnd,bknd->bnqk", q, k) / np.sqrt(8) + bias
  expected = jnp.einsum("bnqk,bknd->bqnd", jax.nn.softmax(logits, axis=-1), v)
  assert out.shape == (B, S, 2, 8)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_cudnn_is_chosen_only_where_it_applies(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  choose = layers.attention_implementation
  bf16 = _config(dtype="bfloat16")
  assert choose(bf16, deterministic=True) == "cudnn"
  # Attention-probability dropout while training: cuDNN's kernel has none, keep XLA.
  assert choose(bf16, deterministic=False) is None
  assert choose(_config(dtype="bfloat16", attention_probs_dropout_prob=0.0),
                deterministic=False) == "cudnn"
  assert choose(_config(), deterministic=True) is None                       # float32
  assert choose(_config(dtype="bfloat16", hidden_size=36, num_attention_heads=3),
                deterministic=True) is None                                 # head_dim 12
  assert choose(_config(dtype="bfloat16", hidden_size=272, num_attention_heads=1),
                deterministic=True) is None                                 # head_dim 272
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert choose(bf16, deterministic=True) is None


@pytest.mark.parametrize("attention", [ops.xla_attention, kernels.einsum_attention],
                         ids=["tuned", "textbook"])
def test_xla_attention_is_softmax_attention_with_dropout_on_the_probabilities(attention):
  rng = np.random.RandomState(2)
  q, k, v = (jnp.asarray(rng.randn(B, S, 2, 8), jnp.float32) for _ in range(3))   # [B, S, N, D]
  bias = layers.attention_bias(jnp.asarray(_masks()[1]["block_diagonal"]), causal=True)
  mask = jnp.asarray(rng.rand(B, 2, S, S) < 0.8, jnp.float32) / 0.8              # [B, N, S, S]
  out = attention(q, k, v, bias, lambda probs: probs * mask)
  logits = jnp.einsum("bqnd,bknd->bnqk", q, k) / np.sqrt(8) + bias
  probs = jax.nn.softmax(logits, axis=-1) * mask
  expected = jnp.einsum("bnqk,bknd->bqnd", probs, v)
  assert out.shape == (B, S, 2, 8)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_xla_attention_logits_in_the_compute_dtype_are_rounded_then_softmaxed_in_float32():
  rng = np.random.RandomState(3)
  q, k, v = (jnp.asarray(2 * rng.randn(B, S, 2, 16), jnp.bfloat16) for _ in range(3))
  bias = layers.attention_bias(jnp.asarray(_masks()[1]["block_diagonal"]), causal=False)
  keep = lambda probs: probs
  scaled_q = q / jnp.sqrt(16).astype(jnp.bfloat16)
  f32 = lambda a: np.asarray(a, np.float64)
  reference = jnp.einsum("bqnd,bknd->bnqk", f32(scaled_q), f32(k))               # exact logits
  rounded = reference.astype(jnp.bfloat16)                                         # bf16 output
  expect = lambda logits: jnp.einsum(
      "bnqk,bknd->bqnd", jax.nn.softmax(jnp.asarray(logits, jnp.float32) + bias, axis=-1)
      .astype(jnp.bfloat16).astype(jnp.float32), f32(v).astype(np.float32))
  low = ops.xla_attention(q, k, v, bias, keep, float32_logits=False)
  high = ops.xla_attention(q, k, v, bias, keep)
  assert low.dtype == high.dtype == jnp.bfloat16
  np.testing.assert_allclose(f32(low), expect(rounded), rtol=2e-2, atol=2e-2)
  # Float32 logits track the exact ones more closely than logits rounded to bfloat16.
  error = lambda out: np.abs(f32(out) - np.asarray(expect(reference))).mean()
  assert error(high) < error(low)


def test_the_config_switch_reaches_the_attention_of_a_bfloat16_model(monkeypatch):
  ids, masks = _masks()
  seen = []
  original = ops.xla_attention
  # kernels.select reads ops.xla_attention when the model is traced (kernels="auto": tuned on CPU).
  monkeypatch.setattr(ops, "xla_attention",
                      lambda *args: seen.append(args[-1]) or original(*args))
  outputs = []
  for float32_logits in (True, False):
    model = post_ln.BertModel(_config(dtype="bfloat16", float32_attention_logits=float32_logits))
    params = layers.init_params(model, jax.random.PRNGKey(0), seq_len=S)
    seen.clear()
    outputs.append(np.asarray(model.apply({"params": params}, ids, masks["padding"])
                              ["sequence_output"], np.float32))
    assert seen == [float32_logits] * 2     # each layer
  # (Compiled for CPU, XLA may keep the product in float32 anyway: it allows excess precision.)
  np.testing.assert_allclose(outputs[0], outputs[1], atol=0.1)
