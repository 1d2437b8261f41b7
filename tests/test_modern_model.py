"""The ModernBERT family (`bert_jax/model/modern.py`) against transformers' ModernBERT.

transformers writes a small random `ModernBertForMaskedLM` (the test makes it: nothing is
downloaded); `load_pretrained` reads it and the hidden states and MLM logits must equal
transformers' in float32 within 1e-5, on inputs longer than the window, with padding, on the
banded path (short rows) and the blocked one (long rows). Our export loads back into
transformers with the same outputs. The blocked local attention equals the band of the full
matrix with packed segments, values and gradients; the scanned layout equals the per-layer one.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (test extra) runs the reference model")
transformers = pytest.importorskip("transformers", reason="transformers is the reference model")

from bert_jax.io import checkpoints  # noqa: E402
from bert_jax import families  # noqa: E402
from bert_jax.model import layers, local_attention  # noqa: E402
from bert_jax.families.modernbert import model as modern  # noqa: E402
from bert_jax.model.config import BertConfig  # noqa: E402

TOL = 1e-5
VOCAB = 96


def _reference_config(**overrides):
  fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=4,
                num_attention_heads=4, local_attention=8, global_attn_every_n_layers=3,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
                max_position_embeddings=1024)
  fields.update(overrides)
  return transformers.ModernBertConfig(**fields)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """A random ModernBertForMaskedLM as transformers saves it, and the model itself."""
  torch.manual_seed(0)
  model = transformers.ModernBertForMaskedLM(_reference_config()).eval()
  # transformers initialises the norms to 1 and the decoder bias to 0: perturb them, so that a
  # misplaced norm or bias cannot pass unnoticed.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or name == "decoder.bias":
        p.add_(0.1 * torch.randn_like(p))
  directory = str(tmp_path_factory.mktemp("modernbert") / "hf")
  model.save_pretrained(directory)
  return directory, model


def _batch(seq_len, padded=7, seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, VOCAB, size=(2, seq_len))
  mask = np.ones((2, seq_len), np.int64)
  mask[1, seq_len - padded:] = 0
  ids[1, seq_len - padded:] = 0
  return ids, mask


def _transformers_outputs(model, ids, mask):
  with torch.no_grad():
    encoded = model.model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    logits = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
  return encoded.last_hidden_state.numpy(), logits.numpy()


@pytest.mark.parametrize("seq_len", [40, 1030])   # banded; blocked (>= 8 blocks of 128)
def test_loaded_model_equals_transformers(reference, seq_len):
  directory, model = reference
  config, params = checkpoints.load_pretrained(directory)
  assert config.architecture == "modernbert"
  assert config.local_attention == 8 and config.window == 4
  assert [config.is_global_layer(i) for i in range(4)] == [True, False, False, True]
  assert local_attention.use_blocks(seq_len, config.window) == (seq_len >= 1024)
  ids, mask = _batch(seq_len)
  hidden, logits = _transformers_outputs(model, ids, mask)
  ours = families.of(config).pretraining_model(config, use_nsp=False).apply(
      {"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  real = mask.astype(bool)   # padded positions' outputs are read by nothing
  np.testing.assert_allclose(np.asarray(ours["sequence_output"])[real], hidden[real], atol=TOL)
  np.testing.assert_allclose(np.asarray(ours["mlm_logits"])[real], logits[real], atol=TOL)


def test_masked_positions_give_the_full_logits_there(reference):
  directory, _ = reference
  config, params = checkpoints.load_pretrained(directory)
  ids, mask = _batch(40)
  model = families.of(config).pretraining_model(config, use_nsp=False)
  full = model.apply({"params": params}, ids, mask)["mlm_logits"]
  positions = np.array([[0, 5, 30], [1, 2, 20]])
  sparse = model.apply({"params": params}, ids, mask, masked_lm_positions=positions)["mlm_logits"]
  np.testing.assert_allclose(sparse, np.take_along_axis(np.asarray(full), positions[..., None],
                                                        axis=1), atol=1e-6)


def test_export_loads_in_transformers_with_the_same_outputs(tmp_path):
  config = BertConfig.named("modernbert-base", num_hidden_layers=4, hidden_size=64,
                            num_attention_heads=4, intermediate_size=80, vocab_size=VOCAB,
                            local_attention=8, pad_token_id=0, max_position_embeddings=1024)
  model = families.of(config).pretraining_model(config, use_nsp=False)
  params = layers.init_params(model, jax.random.PRNGKey(1))
  params = jax.tree_util.tree_map(lambda p: p + 0.05 * np.random.RandomState(0).standard_normal(
      p.shape).astype(np.float32), params)     # non-trivial norms and biases
  out = str(tmp_path / "export")
  checkpoints.export_huggingface(config, params, out)
  written = json.loads(open(os.path.join(out, "config.json")).read())
  assert written["architectures"] == ["ModernBertForMaskedLM"]
  assert written["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention",
                                    "full_attention"]
  hf = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
  assert type(hf).__name__ == "ModernBertForMaskedLM"
  ids, mask = _batch(40)
  hidden, logits = _transformers_outputs(hf, ids, mask)
  ours = model.apply({"params": params}, ids, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(ours["sequence_output"])[real], hidden[real], atol=TOL)
  np.testing.assert_allclose(np.asarray(ours["mlm_logits"])[real], logits[real], atol=TOL)
  # And back: the export reads as what was written.
  config_back, params_back = checkpoints.load_pretrained(out)
  assert config_back.to_dict(include_runtime=False) == config.to_dict(include_runtime=False)
  for a, b in zip(jax.tree_util.tree_leaves(params_back), jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(a, b)


def test_encoder_export_is_a_modernbert_model(tmp_path):
  config = BertConfig.named("modernbert-base", num_hidden_layers=2, hidden_size=32,
                            num_attention_heads=2, intermediate_size=48, vocab_size=VOCAB,
                            pad_token_id=0)
  params = layers.init_params(families.of(config).encoder(config, add_pooling_layer=False),
                                jax.random.PRNGKey(0))
  out = str(tmp_path / "encoder")
  checkpoints.export_huggingface(config, {"bert": params}, out)
  hf = transformers.AutoModel.from_pretrained(out).eval()
  assert type(hf).__name__ == "ModernBertModel"
  ids, mask = _batch(24, padded=3)
  with torch.no_grad():
    hidden = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
  ours = families.of(config).encoder(config, add_pooling_layer=False).apply(
      {"params": params}, ids, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(ours["sequence_output"])[real], hidden.numpy()[real],
                             atol=TOL)


def _band_reference(q, k, v, segments, window):
  """Softmax attention with the band and same-segment mask over the full [S, S] logits."""
  seq_len = q.shape[1]
  pos = np.arange(seq_len)
  band = np.abs(pos[:, None] - pos[None, :]) <= window
  seg_q, seg_k = segments[:, :, None], segments[:, None, :]
  allowed = band[None] & (seg_k > 0) & ((seg_q == seg_k) | (seg_q == 0))     # [B, S, S]
  logits = jnp.einsum("bqnd,bknd->bnqk", q, k) / np.sqrt(q.shape[-1])
  logits = jnp.where(allowed[:, None], logits, -1e9)
  return jnp.einsum("bnqk,bknd->bqnd", jax.nn.softmax(logits, axis=-1), v)


def test_blocked_local_attention_equals_the_band_of_the_full_matrix():
  rng = np.random.RandomState(0)
  batch, seq_len, heads, dim, window = 2, 600, 2, 8, 64     # 600: not a multiple of the block
  q, k, v = (jnp.asarray(rng.standard_normal((batch, seq_len, heads, dim)), jnp.float32)
             for _ in range(3))
  segments = np.ones((batch, seq_len), np.int32)
  segments[0, 250:] = 2          # two packed sequences
  segments[1, 570:] = 0          # padding
  blocked = lambda q, k, v: local_attention.blocked_attention(q, k, v, jnp.asarray(segments),
                                                              window, lambda p: p)
  reference = lambda q, k, v: _band_reference(q, k, v, segments, window)
  np.testing.assert_allclose(blocked(q, k, v), reference(q, k, v), atol=2e-6)
  weights = jnp.asarray(rng.standard_normal((batch, seq_len, heads, dim)), jnp.float32)
  grads = [jax.grad(lambda *x, f=f: jnp.sum(f(*x) * weights), argnums=(0, 1, 2))(q, k, v)
           for f in (blocked, reference)]
  for ours, theirs in zip(*grads):
    np.testing.assert_allclose(ours, theirs, atol=2e-5)


def test_local_layers_take_blocks_by_attention_path_and_length():
  """XLA: blocks from 8 blocks per row (1,024 tokens with a 64-token window). cuDNN: the band as
  its bias up to CUDNN_BAND_MAX_TOKENS (faster there on a GPU), blocks past it (cuDNN through jax
  has no two-sided window: the band would be the whole [S, S]). Splash: never (its own mask)."""
  window, limit = 64, local_attention.CUDNN_BAND_MAX_TOKENS
  assert [local_attention.use_blocks(n, window) for n in (1023, 1024, 8192)] == [False, True, True]
  assert [local_attention.use_blocks(n, window, "cudnn")
          for n in (512, limit, limit + 128, 8192)] == [False, False, True, True]
  assert not local_attention.use_blocks(8192, window, "splash")
  config = BertConfig.named("modernbert-base", num_hidden_layers=3, hidden_size=64,
                            num_attention_heads=2, intermediate_size=96, vocab_size=128,
                            local_attention=128, pad_token_id=0)
  mask = jnp.ones((1, 8192), jnp.int32)
  cudnn = modern.attention_context(config, mask, None, "cudnn", 8192)
  assert cudnn.blocked and cudnn.local_bias is None and cudnn.global_bias is not None
  short = modern.attention_context(config, mask[:, :1024], None, "cudnn", 1024)
  assert not short.blocked and short.local_bias.shape == (1, 1, 1024, 1024)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("heads_first", [False, True])
def test_rotary_positions_on_tpu_swap_the_halves_by_a_product(dtype, heads_first):
  """Traced for a TPU, the rotation swaps each head's halves by a product with a permutation
  instead of slices: the same values and gradients, bit for bit, as the sliced form (which
  is transformers' x cos + rotate_half(x) sin, tested against it above)."""
  from bert_jax.model import kernels
  rng = np.random.RandomState(5)
  shape = (2, 3, 16, 8) if heads_first else (2, 16, 3, 8)                     # D = 8
  x = jnp.asarray(rng.randn(*shape), dtype)
  g = jnp.asarray(rng.randn(*shape), dtype)
  cos, sin = modern.rotary_tables(jnp.arange(16)[None], 8, 10_000.0)

  def rotated(x):
    return modern.apply_rotary(x, cos, sin, heads_first)

  def run():
    out, pullback = jax.vjp(rotated, x)
    return out, pullback(g)[0]

  sliced = run()
  with kernels.compiling_for("tpu"):
    by_product = run()
  for a, b in zip(by_product, sliced):
    assert a.dtype == dtype
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_scanned_layers_equal_per_layer(reference, tmp_path):
  directory, _ = reference
  config, params = checkpoints.load_pretrained(directory)
  scanned_config = config.replace(scan_layers=True)
  scanned = checkpoints.to_model_layout(jax.tree_util.tree_map(np.copy, params), scanned_config)
  assert "layer_0" in scanned["bert"]["encoder"] and "layer" in scanned["bert"]["encoder"]
  ids, mask = _batch(40)
  a = families.of(config).pretraining_model(config, use_nsp=False).apply(
      {"params": params}, ids, mask,
                                                              output_hidden_states=True)
  b = families.of(scanned_config).pretraining_model(scanned_config, use_nsp=False).apply(
      {"params": scanned}, ids, mask, output_hidden_states=True)
  for key in ("mlm_logits", "hidden_states"):
    np.testing.assert_allclose(a[key], b[key], atol=1e-6)
  # The scanned tree is written in the per-layer layout (what exports and checkpoints hold).
  checkpoints.save_pretrained(scanned_config, scanned, str(tmp_path / "own"))
  _, back = checkpoints.load_pretrained(str(tmp_path / "own"))
  for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(a, b)


def test_scan_needs_whole_periods():
  config = BertConfig.named("modernbert-base", num_hidden_layers=3, hidden_size=32,
                            num_attention_heads=2, intermediate_size=48, vocab_size=VOCAB,
                            pad_token_id=0, scan_layers=True)
  with pytest.raises(ValueError, match="num_hidden_layers - 1 must divide"):
    layers.init_params(families.of(config).encoder(config), jax.random.PRNGKey(0))


def test_named_sizes_have_transformers_parameter_counts():
  for size, hf_fields in (("modernbert-base", dict(num_hidden_layers=22, hidden_size=768,
                                                   intermediate_size=1152,
                                                   num_attention_heads=12)),
                          ("modernbert-large", dict(num_hidden_layers=28, hidden_size=1024,
                                                    intermediate_size=2624,
                                                    num_attention_heads=16))):
    config = BertConfig.named(size)
    assert config.vocab_size % 64 == 0
    shapes = checkpoints.expected_shapes(config)   # with a classifier's (optional) pooler
    ours = sum(int(np.prod(s)) for k, s in shapes.items() if not k.startswith("bert/pooler/"))
    with torch.device("meta"):
      hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**hf_fields))
    # transformers counts the tied decoder weight once, as we do.
    theirs = sum(p.numel() for p in hf.parameters())
    assert ours == theirs, size


def test_bert_configs_write_what_they_wrote():
  values = BertConfig.named("tiny").to_dict(include_runtime=False)
  assert "architecture" not in values and "global_rope_theta" not in values
  with pytest.raises(ValueError, match="architecture"):
    BertConfig(architecture="gpt")
  with pytest.raises(ValueError, match="local_attention"):
    BertConfig.named("modernbert-base", local_attention=7)


def test_attention_output_dropout_is_its_own_rate_and_reads_back(tmp_path):
  """The probabilities' rate and the attention output's apart: with the probabilities at 0 the
  output's rate alone changes a training forward; transformers' one `attention_dropout` reads
  into both; an export reads back both rates; an older config (one rate) keeps it for both."""
  config = BertConfig.named("modernbert-base", num_hidden_layers=1, hidden_size=32,
                            num_attention_heads=2, intermediate_size=48, vocab_size=VOCAB,
                            local_attention=8, pad_token_id=0, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, attention_output_dropout_prob=0.5)
  model = families.of(config).encoder(config)
  ids, mask = _batch(16)
  params = layers.init_params(model, jax.random.PRNGKey(0))

  def forward(c, deterministic):
    out = families.of(c).encoder(c).apply(
        {"params": params}, ids, mask, deterministic=deterministic,
        rngs={"dropout": jax.random.PRNGKey(3)})
    return np.asarray(out[0] if isinstance(out, tuple) else out["sequence_output"])

  quiet = forward(config, True)
  assert not np.allclose(forward(config, False), quiet)
  no_output_dropout = BertConfig.from_dict(dict(config.to_dict(),
                                                attention_output_dropout_prob=0.0))
  np.testing.assert_allclose(forward(no_output_dropout, False), quiet, atol=1e-6)

  values = _reference_config(attention_dropout=0.2).to_dict()
  read = families.for_huggingface(values, "config.json").config_from_huggingface(values, "c")
  assert (read.attention_probs_dropout_prob, read.attention_output_dropout_prob) == (0.2, 0.2)

  out = str(tmp_path / "export")
  checkpoints.export_huggingface(config, params, out)
  written = json.loads(open(os.path.join(out, "config.json")).read())
  assert written["attention_dropout"] == 0.0   # transformers' one rate: the probabilities'
  back, _ = checkpoints.load_pretrained(out)
  assert (back.attention_probs_dropout_prob, back.attention_output_dropout_prob) == (0.0, 0.5)

  older = {k: v for k, v in config.to_dict().items() if k != "attention_output_dropout_prob"}
  older["attention_probs_dropout_prob"] = 0.1
  assert BertConfig.from_dict(older).attention_output_dropout_prob == 0.1


@pytest.mark.parametrize("seq_len", [96, 1100])   # local layers banded; by blocks
def test_a_row_of_packed_documents_equals_transformers_on_each_document_alone(reference,
                                                                             seq_len):
  """Documents as sequences (`create_pretraining_data --instances=documents`): the row the
  writer packs, read as the pre-training job reads it (the block-diagonal mask of its
  sequence_ids, its restarting position_ids), gives every document the hidden states and logits
  transformers' ModernBERT gives it alone, in the local layers (windows longer than a document's
  edge would reach across) and the global ones."""
  from data_pipelines import create_pretraining_data, packing
  directory, model = reference
  config, params = checkpoints.load_pretrained(directory)
  rng = np.random.RandomState(1)
  lengths = [seq_len // 2 - 2, seq_len // 3 - 2, seq_len // 8 - 2]   # fit one row together
  documents = [[list(rng.randint(3, VOCAB, size=n))] for n in lengths]
  row = create_pretraining_data.documents_arrays(documents, seq_len, cls_id=1, sep_id=2)
  assert len(row["input_ids"]) == 1 and row["sequence_ids"].max() == 3
  batch = {k: jnp.asarray(v, jnp.int32) for k, v in row.items()}
  ours = families.of(config).pretraining_model(config, use_nsp=False).apply(
      {"params": params}, batch["input_ids"], packing.attention_mask(batch),
      position_ids=batch["position_ids"])
  for k in (1, 2, 3):
    span = row["sequence_ids"][0] == k
    alone = row["input_ids"][:, span]                                  # [1, n]: [CLS] doc [SEP]
    hidden, logits = _transformers_outputs(model, alone, np.ones_like(alone))
    np.testing.assert_allclose(np.asarray(ours["sequence_output"])[0, span], hidden[0], atol=TOL)
    np.testing.assert_allclose(np.asarray(ours["mlm_logits"])[0, span], logits[0], atol=TOL)
