"""config.model.attention='splash': the Pallas TPU splash-attention kernel, run here in Pallas'
interpret mode, computes what the XLA path computes: outputs at every real position and the
gradients of q, k, v and of a whole tiny encoder, with padding and with packed rows."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import families
from bert_jax.model import layers, ops, splash
from bert_jax.model.config import BertConfig

B, S, N, D = 2, 128, 2, 8      # the kernel's block is 128 positions


def _masks():
  lengths = np.array([S, 77])
  padding = (np.arange(S)[None] < lengths[:, None]).astype(np.int32)        # [B, S]
  pair = np.where(np.arange(S)[None] < 50, 1, 2) * padding                  # two packed pairs
  block = (pair[:, :, None] == pair[:, None, :]) & (pair[:, :, None] > 0)   # [B, S, S]
  return padding, {"padding": padding, "packed": block.astype(np.int32)}


def test_segment_ids_from_both_mask_forms():
  padding, masks = _masks()
  np.testing.assert_array_equal(splash.segment_ids(jnp.asarray(masks["padding"])), padding)
  packed = np.asarray(splash.segment_ids(jnp.asarray(masks["packed"])))
  assert set(np.unique(packed[1])) == {0, 1, 51}   # first pair, second pair (starts at 50), pad
  assert (packed[1, 77:] == 0).all() and (packed[1, :50] == 1).all()


@pytest.mark.parametrize("mask_kind", ["padding", "packed"])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_equals_the_xla_path_with_gradients(mask_kind, causal):
  padding, masks = _masks()
  rng = np.random.RandomState(0)
  q, k, v = (jnp.asarray(rng.randn(B, S, N, D), jnp.float32) for _ in range(3))
  weights = jnp.asarray(rng.randn(B, S, N, D), jnp.float32) * padding[..., None, None]
  bias = layers.attention_bias(jnp.asarray(masks[mask_kind]), causal)
  segments = splash.segment_ids(jnp.asarray(masks[mask_kind]))

  def xla(q, k, v):
    return jnp.sum(ops.xla_attention(q, k, v, bias, lambda p: p) * weights)

  def kernel(q, k, v):
    return jnp.sum(splash.splash_attention(q, k, v, segments, causal) * weights)

  expected, expected_grads = jax.value_and_grad(xla, argnums=(0, 1, 2))(q, k, v)
  got, grads = jax.value_and_grad(kernel, argnums=(0, 1, 2))(q, k, v)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  for name, a, b in zip("qkv", grads, expected_grads):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)



def test_one_kernel_shape_serves_every_trace():
  """A train step's jit and then an evaluation step's (another trace, another batch size) ask
  for the kernel of one shape. Its block tables were once cached as the first trace's tracers
  (UnexpectedTracerError at a pre-training run's first evaluation)."""
  padding, _ = _masks()
  segments = splash.segment_ids(jnp.asarray(padding))
  rng = np.random.RandomState(0)
  heads = 3                                 # a shape no other test asks for: a trace asks first
  q, k, v = (jnp.asarray(rng.randn(B, S, heads, D), jnp.float32) for _ in range(3))
  real = padding[..., None, None]
  train = jax.jit(jax.value_and_grad(
      lambda q, k, v: jnp.sum(splash.splash_attention(q, k, v, segments) * real)))
  evaluate = jax.jit(lambda q, k, v, segments: splash.splash_attention(q, k, v, segments))
  train(q, k, v)
  rows = np.array([0, 1, 1])                # 3 rows: a batch size the train trace never saw
  got = evaluate(q[rows], k[rows], v[rows], segments[rows])
  bias = layers.attention_bias(jnp.asarray(padding[rows]), False)
  expected = ops.xla_attention(q[rows], k[rows], v[rows], bias, lambda p: p)
  np.testing.assert_allclose(got * real[rows], expected * real[rows], rtol=1e-5, atol=1e-6)


# Sliding-window attention (ModernBERT's local layers: window = local_attention // 2).
SW, WINDOW = 256, 64


def _windowed_inputs():
  """q, k, v [B, SW, N, D] and segment ids [B, SW]: row 0 two packed segments then padding,
  row 1 one segment then padding."""
  rng = np.random.RandomState(3)
  q, k, v = (jnp.asarray(rng.randn(B, SW, N, D), jnp.float32) for _ in range(3))
  position = np.arange(SW)
  segments = np.stack([np.where(position < 90, 1, 2) * (position < 230),
                       (position < 177).astype(np.int64)]).astype(np.int32)   # [B, SW]
  return q, k, v, jnp.asarray(segments)


def _banded_reference(q, k, v, segments, window, causal):
  """Plain softmax attention: query i sees key j of its own segment with |i - j| <= window (and
  j <= i if causal). Padding (segment 0) sees padding, as the kernel does (module docstring)."""
  position = jnp.arange(q.shape[1])
  offset = position[:, None] - position[None, :]                           # i - j  [S, S]
  allowed = (jnp.abs(offset) <= window) & ((offset >= 0) if causal else True)
  allowed = allowed[None] & (segments[:, :, None] == segments[:, None, :])  # [B, S, S]
  logits = jnp.einsum("bqnd,bknd->bnqk", q, k) / np.sqrt(q.shape[-1])
  logits = jnp.where(allowed[:, None], logits, -1e30)
  return jnp.einsum("bnqk,bknd->bqnd", jax.nn.softmax(logits, axis=-1), v)


@pytest.mark.parametrize("causal", [False, True])
def test_a_window_equals_banded_attention_with_gradients(causal):
  q, k, v, segments = _windowed_inputs()
  weights = jnp.asarray(np.random.RandomState(4).randn(B, SW, N, D), jnp.float32)

  def reference(q, k, v):
    return jnp.sum(_banded_reference(q, k, v, segments, WINDOW, causal) * weights)

  def kernel(q, k, v):
    return jnp.sum(splash.splash_attention(q, k, v, segments, causal, window=WINDOW) * weights)

  expected, expected_grads = jax.value_and_grad(reference, argnums=(0, 1, 2))(q, k, v)
  got, grads = jax.value_and_grad(kernel, argnums=(0, 1, 2))(q, k, v)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  out = splash.splash_attention(q, k, v, segments, causal, window=WINDOW)
  np.testing.assert_allclose(out, _banded_reference(q, k, v, segments, WINDOW, causal),
                             rtol=1e-4, atol=1e-5)
  for name, a, b in zip("qkv", grads, expected_grads):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)
  # The window matters here: the full-segment kernel computes something else.
  full = splash.splash_attention(q, k, v, segments, causal)
  assert not np.allclose(out, full, atol=1e-3)


@pytest.mark.parametrize("window", [None, WINDOW])
def test_rotary_positions_turned_inside_the_kernels_equal_turning_before_them(window):
  """`rotary`: q and k come in unturned and unscaled and the three kernels turn them by their
  positions (restarting in each packed segment), the backward ones turning dq and dk back:
  the values and gradients of rotating with the model's `apply_rotary` first."""
  from bert_jax.families.modernbert import model as modern
  q, k, v, segments = _windowed_inputs()
  ids = np.asarray(segments)
  starts = np.maximum.accumulate(np.where(np.diff(ids, prepend=-1, axis=1) != 0,
                                          np.arange(SW)[None], 0), axis=1)
  positions = jnp.asarray(np.arange(SW)[None] - starts, jnp.int32)             # [B, SW]
  assert int(positions[0, 90]) == 0 and int(positions[0, 89]) == 89
  theta = 160_000.0
  weights = jnp.asarray(np.random.RandomState(6).randn(B, N, SW, D), jnp.float32)
  heads_first = lambda t: t.transpose(0, 2, 1, 3)                              # [B, N, S, D]

  def turned_before(q, k, v):
    cos, sin = modern.rotary_tables(positions, D, theta)
    q, k = (modern.apply_rotary(t, cos, sin, heads_first=True) for t in (q, k))
    return jnp.sum(splash.splash_attention_heads_first(q, k, v, segments, window=window)
                   * weights)

  def turned_inside(q, k, v):
    rotary = splash.Rotary(positions, jnp.asarray(modern.rotary_frequencies(D, theta)))
    return jnp.sum(splash.splash_attention_heads_first(q, k, v, segments, window=window,
                                                       rotary=rotary) * weights)

  q, k, v = (heads_first(t) for t in (q, k, v))
  expected, expected_grads = jax.value_and_grad(turned_before, argnums=(0, 1, 2))(q, k, v)
  got, grads = jax.value_and_grad(turned_inside, argnums=(0, 1, 2))(q, k, v)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  for name, a, b in zip("qkv", grads, expected_grads):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)
  # Turning matters: without it the kernel computes something else.
  unturned = jax.grad(lambda q: jnp.sum(splash.splash_attention_heads_first(
      q, k, v, segments, window=window) * weights))(q)
  assert not np.allclose(unturned, grads[0], atol=1e-3)


def test_a_window_skips_the_blocks_outside_the_band():
  """At 1,024 positions and window 64 the kernel takes 128-position blocks and visits 3 key
  blocks per query block, not 8; the FLOPs count only the band."""
  kernel = splash._kernel(N, 1024, False, True, 64)
  assert kernel.kwargs["block_sizes"].block_q == 128
  assert kernel.fwd_mask_info.block_mask.shape[-2:] == (8, 3)
  full = splash.attention_flops(2, N, 1024, D)
  assert splash.attention_flops(2, N, 1024, D, window=64) == full * 129 / 1024
  assert splash.attention_flops(2, N, 128, D, window=64) == full * 128 / 1024 / 8   # min(S, .)
  assert splash.attention_flops(2, N, 1024, D, causal=True, window=64) == full * 65 / 1024
  assert splash.attention_flops(2, N, 1024, D, causal=True) == full / 2

def _config(attention, **overrides):
  fields = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=S, attention=attention,
                attention_probs_dropout_prob=0.0)
  fields.update(overrides)
  return BertConfig.create(**fields)


def _modern_config(attention):
  """A ModernBERT-family encoder whose local layers (1 and 2) see 16 keys on each side."""
  return BertConfig.named("modernbert-base", num_hidden_layers=4, hidden_size=32,
                          num_attention_heads=2, intermediate_size=48, vocab_size=64,
                          local_attention=32, pad_token_id=0, attention=attention)


@pytest.mark.parametrize("mask_kind,family", [
    ("padding", "bert"), ("packed", "bert"), ("packed", "modernbert"),
    # the slowest (27 s on 2 cores); packed rows with padding cover the modern encoder here
    pytest.param("padding", "modernbert", marks=pytest.mark.slow)])
def test_a_whole_encoder_with_splash_equals_xla(mask_kind, family):
  padding, masks = _masks()
  ids = np.random.RandomState(1).randint(5, 60, size=(B, S)) * padding
  weights = np.random.RandomState(2).randn(B, S, 32).astype(np.float32) * padding[..., None]
  # Packed rows restart their rotary positions at each sequence (the second starts at 50).
  positions = np.where(np.arange(S) < 50, np.arange(S), np.arange(S) - 50)[None].repeat(B, 0)
  results = {}
  for attention in ("xla", "splash"):
    config = _config(attention) if family == "bert" else _modern_config(attention)
    model = families.of(config).encoder(config)
    params = layers.init_params(model, jax.random.PRNGKey(0), seq_len=S)

    def loss(params):
      out = model.apply({"params": params}, ids, masks[mask_kind],
                        position_ids=positions if family == "modernbert" and
                        mask_kind == "packed" else None)["sequence_output"]
      return jnp.sum(out * weights)   # real positions only (see bert_jax/model/splash.py)

    results[attention] = jax.value_and_grad(loss)(params)
  (expected, expected_grads), (got, grads) = results["xla"], results["splash"]
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads),
                          jax.tree_util.tree_leaves(expected_grads)):
    # Float32 sums in another order (the kernel's blocks; the CPU's vector width): an element
    # that cancels to near zero keeps an error of the size of its largest terms, so the absolute
    # tolerance scales with the leaf's magnitude (embedding gradients reach ~1e3 here).
    atol = 2e-6 * max(1.0, float(np.abs(b).max()))
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=atol, err_msg=jax.tree_util.keystr(path))


def test_what_splash_cannot_do_is_a_clear_error():
  with pytest.raises(ValueError, match="attention_probs_dropout_prob=0"):
    layers.attention_kind(_config("splash", attention_probs_dropout_prob=0.1),
                            deterministic=False, seq_len=S)
  with pytest.raises(ValueError, match="multiple of 128"):
    layers.attention_kind(_config("splash"), deterministic=True, seq_len=96)
  # Evaluation has no dropout: the kernel applies.
  assert layers.attention_kind(_config("splash", attention_probs_dropout_prob=0.1),
                                 deterministic=True, seq_len=S) == "splash"
  with pytest.raises(ValueError):
    _config("flash")


def test_auto_takes_the_backends_kernel_where_it_applies():
  from bert_jax.model import kernels
  config = _config("auto")
  assert layers.attention_kind(config, deterministic=False, seq_len=S) == "xla"   # CPU
  with kernels.compiling_for("tpu"):
    assert layers.attention_kind(config, deterministic=False, seq_len=S) == "splash"
    assert layers.attention_kind(config, deterministic=False, seq_len=96) == "xla"
    dropout = _config("auto", attention_probs_dropout_prob=0.1)
    assert layers.attention_kind(dropout, deterministic=False, seq_len=S) == "xla"
    assert layers.attention_kind(_config("xla"), deterministic=True, seq_len=S) == "xla"


_UNDER_A_MESH = """
import json, os
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from bert_jax import families
from bert_jax.model import layers, ops, splash
from bert_jax.parallel import sharding, strategies
from tests.test_train_step import tiny_config
mesh = sharding.create_mesh(tiny_config(model_parallelism=2))           # data 4 x model 2
rng = np.random.RandomState(0)
q, k, v = (rng.randn(8, 128, 4, 8).astype(np.float32) for _ in range(3))
padding = (np.arange(128)[None] < rng.randint(60, 129, size=(8, 1))).astype(np.int32)
on_mesh = NamedSharding(mesh, P("data", None, "model", None))
loss = lambda f: (lambda q, k, v: jnp.sum(f(q, k, v) ** 2))
kernel = lambda q, k, v: splash.splash_attention(q, k, v, splash.segment_ids(padding))
bias = layers.attention_bias(jnp.asarray(padding), False)
reference = lambda q, k, v: ops.xla_attention(q, k, v, bias, lambda p: p)
real = padding[:, :, None, None]
step = strategies.UnderMesh(jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(
    kernel(q, k, v) * real), argnums=(0, 1, 2)), in_shardings=(on_mesh,) * 3), mesh)
expected = jax.value_and_grad(lambda q, k, v: jnp.sum(reference(q, k, v) * real),
                              argnums=(0, 1, 2))(q, k, v)
got = step(q, k, v)
hlo = step.lower(q, k, v).as_text()
print(json.dumps({"value": [float(got[0]), float(expected[0])],
                  "grad_diff": max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                                   for a, b in zip(got[1], expected[1])),
                  "shard_map": "shard_map" in hlo or "manual" in hlo}))
"""


def test_under_a_data_and_model_mesh_the_kernel_runs_per_device():
  """8 simulated devices (a subprocess): the kernel under `shard_map`, batch along `data`, heads
  along `model`, as the jit strategy traces a step (`strategies.UnderMesh`)."""
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu", PYTHONPATH=root)
  run = subprocess.run([sys.executable, "-c", _UNDER_A_MESH], capture_output=True, text=True,
                       env=env, cwd=root, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  report = json.loads(run.stdout.strip().splitlines()[-1])
  assert report["shard_map"]
  np.testing.assert_allclose(*report["value"], rtol=1e-5)
  assert report["grad_diff"] < 1e-4



def test_compiled_for_a_tpu_the_kernels_read_one_value_per_position_as_one_row():
  """Lowered and compiled by the TPU compiler (libtpu on this CPU: Mosaic compiles the kernels),
  the forward, dq and dkv kernels take their segment ids as a [1, S] row and lay them down in
  vector memory, and the backward kernels the logsumexp and `di` as [N, 1, S]: no [S, 128] int32
  and no [N, 8, S] float32 array broadcast in HBM feeds them (the library's form: 8.4 and 6.3 MB
  per layer each at 16 x 1,024 tokens, 12 heads)."""
  pytest.importorskip("libtpu", reason="the TPU compiler comes with pip install 'jax[tpu]'")
  from bert_jax.model import kernels
  from bert_jax.parallel import hlo_profile, topologies
  device = jax.sharding.SingleDeviceSharding(topologies.slice_devices("v5litepod-4")[0])
  shape = jax.ShapeDtypeStruct((1, 256, 2, 128), jnp.bfloat16, sharding=device)   # [B, S, N, D]
  ids = jax.ShapeDtypeStruct((1, 256), jnp.int32, sharding=device)

  def loss(q, k, v, segments):
    return jnp.sum(splash.splash_attention(q, k, v, segments).astype(jnp.float32))

  with kernels.compiling_for("tpu"):
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape, ids).compile(
        ).as_text()
  computations = hlo_profile.parse(text)
  shapes = {op.name: re.sub(r"\{[^}]*\}", "", op.shape)
            for c in computations.values() for op in c.operations}
  calls = [op for c in computations.values() for op in c.operations
           if op.opcode == "custom-call" and op.target == "tpu_custom_call"]
  assert len(calls) == 3                                           # forward, dq, dkv
  for call in calls:
    operands = [shapes[o] for o in call.operands]
    assert "s32[1,256]" in operands, operands
    assert "s32[256,128]" not in operands and "f32[2,8,256]" not in operands, operands
