"""bert_jax.model.ops: each building block computes the function it replaces, gradients included;
bert_jax.model.kernels: the config option that picks them, and a whole model that computes the same
outputs and gradients with the tuned and the textbook forms."""
import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import kernels, layers, ops
from bert_jax.families.bert import model as bert_model
from bert_jax.model.config import BertConfig


def test_gelu_equals_the_exact_gelu_and_its_gradient():
  x = jnp.linspace(-12.0, 12.0, 20001)
  np.testing.assert_allclose(ops.gelu(x), jax.nn.gelu(x, approximate=False), atol=1e-6, rtol=1e-6)
  grad = jax.vmap(jax.grad(ops.gelu))(x)
  reference = jax.vmap(jax.grad(lambda t: jax.nn.gelu(t, approximate=False)))(x)
  np.testing.assert_allclose(grad, reference, atol=1e-6, rtol=1e-5)
  assert ops.gelu(jnp.ones(3, jnp.bfloat16)).dtype == jnp.bfloat16


# The tuned forms: 16-bit draws with the mask kept for the backward pass (CPU, GPU), and 32-bit
# draws made again in the backward pass (TPU).
DROPOUTS = [ops.Dropout, ops.RecomputedDropout]


@pytest.mark.parametrize("dropout", DROPOUTS)
@pytest.mark.parametrize("rate", [0.1, 0.25, 0.5])
def test_dropout_keeps_the_right_fraction_and_preserves_the_mean(rate, dropout):
  x = jnp.ones((64, 4, 128, 129))    # odd last axis: one word feeds two elements
  out = dropout(rate).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
  kept = np.asarray(out != 0)
  keep_probability = ops.keep_threshold(rate) / 65536
  assert abs(keep_probability - (1 - rate)) <= 1 / 65536
  # 4.2M Bernoulli draws: the standard error of the kept fraction is < 3e-4.
  assert abs(kept.mean() - keep_probability) < 1.5e-3
  # Survivors are scaled by the inverse of the realised keep probability: E[out] = x exactly.
  np.testing.assert_allclose(np.asarray(out)[kept], 1 / keep_probability, rtol=1e-6)
  assert abs(float(out.mean()) - 1.0) < 3e-3


@pytest.mark.parametrize("dropout", DROPOUTS)
def test_dropout_masks_are_independent_across_positions_and_keys(dropout):
  x = jnp.ones((256, 256))
  apply = lambda key: dropout(0.5).apply({}, x, deterministic=False,
                                             rngs={"dropout": jax.random.key(key)}) != 0
  a, b = np.asarray(apply(0)), np.asarray(apply(1))
  assert 0.45 < (a == b).mean() < 0.55                # different keys, different masks
  # The two 16-bit halves of one random word land side by side: they must not agree more
  # often than independent draws would.
  assert 0.45 < (a[:, 0::2] == a[:, 1::2]).mean() < 0.55
  np.testing.assert_array_equal(a, np.asarray(apply(0)))   # same key, same mask


@pytest.mark.parametrize("dropout", DROPOUTS)
def test_dropout_deterministic_and_edge_rates(dropout):
  x = jax.random.normal(jax.random.PRNGKey(0), (4, 8))
  rngs = {"dropout": jax.random.key(0)}
  np.testing.assert_array_equal(dropout(0.1).apply({}, x, deterministic=True), x)
  np.testing.assert_array_equal(dropout(0.0).apply({}, x, deterministic=False, rngs=rngs), x)
  np.testing.assert_array_equal(dropout(1.0).apply({}, x, deterministic=False, rngs=rngs), 0)
  # The flax interface: the 'dropout' RNG stream is required when not deterministic.
  with pytest.raises(Exception):
    dropout(0.1).apply({}, x, deterministic=False)


@pytest.mark.parametrize("dropout", DROPOUTS)
def test_dropout_gradient_is_the_mask_times_the_scale(dropout):
  x = jax.random.normal(jax.random.PRNGKey(0), (16, 33))
  rngs = {"dropout": jax.random.key(3)}
  f = lambda t: dropout(0.2).apply({}, t, deterministic=False, rngs=rngs)
  grad = jax.grad(lambda t: f(t).sum())(x)
  expected = (np.asarray(f(x)) != 0) * (65536 / ops.keep_threshold(0.2))
  np.testing.assert_allclose(grad, expected, rtol=1e-6)


@pytest.mark.parametrize("dropout", DROPOUTS)
def test_dropout_inside_a_module_uses_the_module_rng_stream(dropout):
  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      return dropout(0.5)(x, deterministic=False) + dropout(0.5)(x, deterministic=False)

  x = jnp.ones((64, 64))
  out = Net().apply({}, x, rngs={"dropout": jax.random.key(0)})
  # Two sibling modules draw different masks (each folds in its own path): sums of 0, 2 and 4.
  assert set(np.unique(np.round(np.asarray(out), 3))) == {0.0, 2.0, 4.0}


def test_recomputed_dropout_keeps_no_mask_for_the_backward_pass():
  """Its backward pass draws the mask again from the key: the residuals between the passes are
  the key alone (no [.., L] boolean), and under jit the gradient is still the forward's mask."""
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 128))
  rngs = {"dropout": jax.random.key(5)}
  f = lambda t: ops.RecomputedDropout(0.3).apply({}, t, deterministic=False, rngs=rngs)
  _, vjp = jax.vjp(f, x)
  residual_shapes = [np.shape(leaf) for leaf in jax.tree_util.tree_leaves(vjp)]
  assert all(np.prod(shape) < x.size for shape in residual_shapes), residual_shapes
  grad = jax.jit(jax.grad(lambda t: (f(t) * t).sum()))(x)
  out = np.asarray(f(x))
  np.testing.assert_allclose(grad, out + x * (out != 0) * (65536 / ops.keep_threshold(0.3)),
                             rtol=1e-5, atol=1e-6)


def test_add_bias_gradients_equal_the_broadcast_add():
  x = jax.random.normal(jax.random.PRNGKey(0), (4, 5, 7))
  bias = jax.random.normal(jax.random.PRNGKey(1), (7,))
  loss = lambda add: lambda x, b: (jnp.sin(add(x, b)) ** 2).sum()
  ours = jax.grad(loss(ops.add_bias), (0, 1))(x, bias)
  reference = jax.grad(loss(lambda x, b: x + b), (0, 1))(x, bias)
  for a, b in zip(ours, reference):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # Each gradient keeps its primal's dtype (bfloat16 logits + a float32 bias).
  grads = jax.grad(loss(ops.add_bias), (0, 1))(x.astype(jnp.bfloat16), bias)
  assert grads[0].dtype == jnp.bfloat16 and grads[1].dtype == jnp.float32


@pytest.mark.parametrize("transpose_wide_grad", [True, False], ids=["cpu_orientation", "plain"])
@pytest.mark.parametrize("shape", [(6, 8, 12, 5), (6, 8, 5, 12), (7, 12, 5), (4, 3, 2, 12, 5)])
def test_dense_dot_general_values_and_gradients_equal_lax_dot_general(shape, transpose_wide_grad):
  """[..., K] x [K, N] for K > N (the transposed kernel-gradient path, CPU) and K < N."""
  *lead, k, n = shape
  x = jax.random.normal(jax.random.PRNGKey(0), (*lead, k))
  kernel = jax.random.normal(jax.random.PRNGKey(1), (k, n))
  numbers = (((x.ndim - 1,), (0,)), ((), ()))
  dense = functools.partial(ops.dense_dot_general, transpose_wide_grad=transpose_wide_grad)
  loss = lambda dot: lambda x, w: (jnp.sin(dot(x, w, numbers)) ** 2).sum()
  np.testing.assert_allclose(dense(x, kernel, numbers),
                             jax.lax.dot_general(x, kernel, numbers), rtol=1e-6, atol=1e-6)
  ours = jax.jit(jax.grad(loss(dense), (0, 1)))(x, kernel)
  reference = jax.grad(loss(jax.lax.dot_general), (0, 1))(x, kernel)
  for a, b in zip(ours, reference):
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(6, 8, 12, 5), (7, 5, 12)])
def test_float32_products_round_once_and_keep_bfloat16(shape):
  """bfloat16 products through float32 results (the CPU form): each value is the float32-summed
  product rounded once to bfloat16, gradients included, and every dtype stays bfloat16."""
  *lead, k, n = shape
  x = jax.random.normal(jax.random.PRNGKey(0), (*lead, k)).astype(jnp.bfloat16)
  kernel = jax.random.normal(jax.random.PRNGKey(1), (k, n)).astype(jnp.bfloat16)
  numbers = (((x.ndim - 1,), (0,)), ((), ()))
  dense = functools.partial(ops.dense_dot_general, transpose_wide_grad=True,
                            float32_products=True)
  exact = lambda a, b: jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32))
  y = jax.jit(lambda x, w: dense(x, w, numbers))(x, kernel)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(y, np.float32),
                                np.asarray(exact(x, kernel).astype(jnp.bfloat16), np.float32))
  g = jax.random.normal(jax.random.PRNGKey(2), y.shape).astype(jnp.bfloat16)
  x_grad, kernel_grad = jax.jit(jax.vjp(lambda x, w: dense(x, w, numbers), x, kernel)[1])(g)
  assert x_grad.dtype == kernel_grad.dtype == jnp.bfloat16
  rows, g_rows = x.reshape(-1, k), g.reshape(-1, n)
  for ours, reference in ((x_grad, exact(g, kernel.T)), (kernel_grad, exact(rows.T, g_rows))):
    # One rounding of a float32 sum: within one bfloat16 ulp of the exact product.
    np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(reference),
                               rtol=2 ** -7, atol=1e-6)


def test_dense_dot_general_keeps_dtypes_and_passes_other_contractions_through():
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 4, 8)).astype(jnp.bfloat16)
  kernel = jax.random.normal(jax.random.PRNGKey(1), (8, 2)).astype(jnp.bfloat16)
  numbers = (((2,), (0,)), ((), ()))
  grads = jax.grad(lambda x, w: ops.dense_dot_general(x, w, numbers).astype(jnp.float32).sum(),
                   (0, 1))(x, kernel)
  assert grads[0].dtype == jnp.bfloat16 and grads[1].dtype == jnp.bfloat16
  # A batched contraction is not nn.Dense's: it goes to lax.dot_general as given.
  batched = (((2,), (1,)), ((0,), (0,)))
  y = jax.random.normal(jax.random.PRNGKey(2), (3, 8, 5))
  np.testing.assert_allclose(ops.dense_dot_general(x.astype(jnp.float32), y, batched),
                             jax.lax.dot_general(x.astype(jnp.float32), y, batched), rtol=1e-6)
  # And nn.Dense with it gives the same outputs and parameter gradients as without.
  inputs = jax.random.normal(jax.random.PRNGKey(3), (2, 3, 8))
  plain, ours = nn.Dense(4), nn.Dense(4, dot_general=kernels.select("tuned").dense_dot_general)
  params = plain.init(jax.random.PRNGKey(4), inputs)
  grad = lambda layer: jax.grad(lambda p: (layer.apply(p, inputs) ** 2).sum())(params)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         grad(ours), grad(plain))


def test_softmax_cross_entropy_is_minus_log_softmax_at_the_label_with_its_gradient():
  rng = np.random.RandomState(0)
  logits = jnp.asarray(rng.randn(4, 6, 50).astype(np.float32) * 5)               # [B, P, V]
  labels = jnp.asarray(rng.randint(0, 50, size=(4, 6)))
  labels = labels.at[0, 0].set(int(jnp.argmax(logits[0, 0])))
  g = jnp.asarray(rng.randn(4, 6).astype(np.float32))

  nll, label_is_max = ops.softmax_cross_entropy(logits, labels)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  reference = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
  np.testing.assert_allclose(nll, reference, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(label_is_max, jnp.argmax(logits, -1) == labels)
  assert float(label_is_max[0, 0]) == 1.0

  # The hand-written gradient, against autodiff of log_softmax, for an arbitrary cotangent.
  ours = jax.grad(lambda x: jnp.sum(ops.softmax_cross_entropy(x, labels)[0] * g))(logits)
  expected = jax.grad(lambda x: jnp.sum(
      -jnp.take_along_axis(jax.nn.log_softmax(x, -1), labels[..., None], -1)[..., 0] * g))(logits)
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)

  # bfloat16 logits: float32 arithmetic inside, a bfloat16 gradient out.
  low = logits.astype(jnp.bfloat16)
  np.testing.assert_allclose(ops.softmax_cross_entropy(low, labels)[0],
                             ops.softmax_cross_entropy(low.astype(jnp.float32), labels)[0])
  low_grad = jax.grad(lambda x: ops.softmax_cross_entropy(x, labels)[0].sum())(low)
  assert low_grad.dtype == jnp.bfloat16


def test_the_tpu_form_of_the_label_logit_is_the_gather():
  """`label_by_mask` (what `kernels.select` takes on TPU) reads the label's logit as a masked sum
  over the vocabulary: the same values and gradients as the gather, bit for bit."""
  rng = np.random.RandomState(1)
  logits = jnp.asarray(rng.randn(3, 5, 70).astype(np.float32) * 4)
  labels = jnp.asarray(rng.randint(0, 70, size=(3, 5)))
  g = jnp.asarray(rng.randn(3, 5).astype(np.float32))
  for masked, gathered in zip(ops.softmax_cross_entropy(logits, labels, label_by_mask=True),
                              ops.softmax_cross_entropy(logits, labels)):
    np.testing.assert_array_equal(masked, gathered)
  grad = lambda by_mask: jax.grad(lambda x: jnp.sum(
      ops.softmax_cross_entropy(x, labels, label_by_mask=by_mask)[0] * g))(logits)
  np.testing.assert_array_equal(grad(True), grad(False))
  assert kernels.select("auto", "tpu").softmax_cross_entropy.keywords == {"label_by_mask": True}
  assert kernels.select("auto", "cpu").softmax_cross_entropy is ops.softmax_cross_entropy


# ----------------------------------------------------------------------- the kernels option


def test_auto_is_every_tuned_form_on_cpu_and_the_measured_choice_elsewhere():
  assert jax.default_backend() == "cpu"
  assert kernels.textbook_parts("auto") == frozenset()
  auto = kernels.select("auto")
  assert auto.gelu is ops.gelu and auto.Dropout is ops.Dropout and auto.add_bias is ops.add_bias
  assert auto.attention is ops.xla_attention and auto.word_lookup is ops.word_lookup
  assert auto.softmax_cross_entropy is ops.softmax_cross_entropy
  assert auto.dense_dot_general.func is ops.dense_dot_general
  assert auto.dense_dot_general.keywords == {"transpose_wide_grad": True,   # CPU orientation
                                             "float32_products": True}
  assert kernels.textbook_parts("auto", "gpu") == {"plain_bias", "optax_xent"}
  assert kernels.select("auto", "gpu").dense_matmul.keywords == {"transpose_wide_grad": False,
                                                                 "float32_products": False}
  assert kernels.textbook_parts("auto", "tpu") == frozenset(                 # libtpu's bytes
      {"plain_bias", "autodiff_dense", "cast_then_gather"})
  assert kernels.select("auto", "tpu").Dropout is ops.Dropout   # BERT's; ModernBERT's below
  assert kernels.textbook_parts("textbook", "cpu") == set(kernels.PARTS)
  assert kernels.textbook_parts("tuned", "gpu") == frozenset()
  assert kernels.textbook_parts("tuned,plain_bias", "cpu") == {"plain_bias"}
  assert kernels.textbook_parts("jax_gelu", "gpu") == {"jax_gelu", "plain_bias", "optax_xent"}
  textbook = kernels.select("textbook")
  assert textbook.Dropout is nn.Dropout and textbook.dense_dot_general is jax.lax.dot_general


@pytest.mark.parametrize("spec", ["tuned,textbook", "fast", "auto,gelu"])
def test_an_unknown_kernels_choice_fails_on_the_config(spec):
  with pytest.raises(ValueError, match="BertConfig.kernels"):
    BertConfig(kernels=spec)


def test_kernels_is_a_runtime_field_that_round_trips(tmp_path):
  config = BertConfig.named("tiny", kernels="tuned,plain_bias,optax_xent")
  assert "kernels" in BertConfig.RUNTIME_FIELDS
  assert BertConfig.from_dict(config.to_dict()) == config
  config.to_json_file(str(tmp_path / "run.json"), include_runtime=True)
  assert BertConfig.from_json_file(str(tmp_path / "run.json")) == config
  # A checkpoint's bert_config.json does not carry it; reading one gives the default.
  config.to_json_file(str(tmp_path / "bert_config.json"))
  assert "kernels" not in json.loads((tmp_path / "bert_config.json").read_text())
  assert BertConfig.from_json_file(str(tmp_path / "bert_config.json")).kernels == "auto"


B, S, P, V = 3, 10, 4, 61


def _pretraining_loss_and_grads(spec: str, deterministic: bool = True):
  """Loss (MLM + NSP through the spec's cross-entropy) and parameter gradients of a tiny model."""
  config = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=48, max_position_embeddings=S, kernels=spec)
  model = bert_model.BertForPreTraining(config)
  params = layers.init_params(model, jax.random.PRNGKey(0), seq_len=S)
  rng = np.random.RandomState(0)
  ids = jnp.asarray(rng.randint(5, V, size=(B, S)))
  mask = jnp.asarray(np.arange(S)[None] < np.array([[S], [7], [5]]), jnp.int32)      # [B, S]
  segments = jnp.asarray(np.arange(S)[None] >= 3, jnp.int32) * mask
  positions = jnp.asarray(np.sort(np.stack([rng.choice(np.arange(1, 5), P, replace=False)
                                            for _ in range(B)]), axis=1))             # [B, P]
  labels = jnp.asarray(rng.randint(0, V, size=(B, P)))
  nsp_labels = jnp.asarray([0, 1, 1])
  xent = lambda logits, y: kernels.softmax_cross_entropy(logits, y, spec)[0]

  def loss(params):
    outputs = model.apply({"params": params}, ids, mask, segments, masked_lm_positions=positions,
                          deterministic=deterministic, rngs={"dropout": jax.random.PRNGKey(1)})
    return (jnp.mean(xent(outputs["mlm_logits"], labels)) +
            jnp.mean(xent(outputs["nsp_logits"], nsp_labels)),
            outputs["sequence_output"])                                             # [B, S, H]

  return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


@pytest.mark.parametrize("spec", ["textbook"] + list(kernels.PARTS))
def test_a_model_computes_the_same_outputs_and_gradients_with_textbook_and_tuned_forms(spec):
  (loss, out), grads = _pretraining_loss_and_grads(spec)
  (tuned_loss, tuned_out), tuned_grads = _pretraining_loss_and_grads("tuned")
  np.testing.assert_allclose(out, tuned_out, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(loss, tuned_loss, rtol=1e-6)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads),
                          jax.tree_util.tree_leaves(tuned_grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_a_textbook_model_trains_with_flax_dropout():
  """Dropout on: flax's Dropout draws other masks than ops.Dropout, so only the plumbing is
  compared (the 'dropout' RNG stream reaches it; the loss moves from the deterministic one)."""
  (loss, _), grads = _pretraining_loss_and_grads("textbook", deterministic=False)
  (deterministic_loss, _), _ = _pretraining_loss_and_grads("textbook")
  assert np.isfinite(loss) and loss != deterministic_loss
  assert all(np.isfinite(g).all() for g in jax.tree_util.tree_leaves(grads))


def test_the_modern_family_drops_out_with_the_recomputed_mask_on_tpu_only():
  """ModernBERT's [B, S, H] dropouts take `RecomputedDropout` where the tuned form is chosen on
  TPU (no mask in HBM), `Dropout` elsewhere, and flax's where the config asks for it."""
  from bert_jax.families.modernbert import model as modern
  config = BertConfig.named("modernbert-base")
  assert modern._dropout(config) is ops.Dropout
  with kernels.compiling_for("tpu"):
    assert modern._dropout(config) is ops.RecomputedDropout
    assert modern._dropout(config.replace(kernels="auto,flax_dropout")) is nn.Dropout
