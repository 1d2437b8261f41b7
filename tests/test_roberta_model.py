"""The RoBERTa family (bert_jax/families/roberta): transformers' RoBERTa and XLM-RoBERTa read with
every output within 1e-5 in float32 (all layers, masked-LM logits, padding and pairs), written back
bit for bit, its rules (positions from pad_token_id + 1, one token type) and clear errors."""
import json
import os

import numpy as np
import pytest

from bert_jax import families
from bert_jax.io import checkpoints
from bert_jax.model.config import BertConfig
from bert_jax.text import pairs, tokenization
from tests import family_fixtures

transformers = pytest.importorskip("transformers", reason="RoBERTa is checked against transformers")
torch = pytest.importorskip("torch", reason="transformers needs torch")

TEXTS_A = ["The quick brown fox jumps over the lazy dog.", "Hello world, again!",
           "Numbers like 3.14 appear."]
TEXTS_B = ["It jumps.", None, "\"Where are you going?\" asked the child."]


@pytest.fixture(scope="module", params=["roberta", "xlm-roberta"])
def checkpoint(request, tmp_path_factory):
  return family_fixtures.WRITERS[request.param](str(tmp_path_factory.mktemp(request.param)))


def _ours_and_theirs(directory, scan_layers=False):
  config, params = checkpoints.load_pretrained(directory)
  config = config.replace(scan_layers=scan_layers)
  tokenizer = tokenization.create_tokenizer(None, None, False,
                                            os.path.join(directory, "tokenizer.json"))
  rows = pairs.encode_pairs(tokenizer, TEXTS_A, TEXTS_B, 40)
  model = families.of(config).pretraining_model(config, use_nsp=False)
  ours = model.apply({"params": checkpoints.to_model_layout(params, config)}, rows["input_ids"],
                     rows["input_mask"], rows["segment_ids"], output_hidden_states=True)
  hf = transformers.AutoModelForMaskedLM.from_pretrained(directory).eval()
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(rows["input_ids"], dtype=torch.long),
                attention_mask=torch.tensor(rows["input_mask"], dtype=torch.long),
                output_hidden_states=True)
  return config, rows, ours, theirs


def test_every_output_equals_transformers(checkpoint):
  config, rows, ours, theirs = _ours_and_theirs(checkpoint)
  assert config.architecture == "roberta" and config.huggingface_type in ("roberta",
                                                                          "xlm-roberta")
  mask = rows["input_mask"][..., None]
  assert len(theirs.hidden_states) == ours["hidden_states"].shape[0]
  for layer, state in enumerate(theirs.hidden_states):
    np.testing.assert_allclose(np.asarray(ours["hidden_states"][layer]) * mask,
                               state.numpy() * mask, atol=1e-5, rtol=0, err_msg=f"layer {layer}")
  np.testing.assert_allclose(np.asarray(ours["mlm_logits"]) * mask, theirs.logits.numpy() * mask,
                             atol=1e-5, rtol=0)


def test_scanned_layers_compute_the_same(checkpoint):
  _, rows, unrolled, _ = _ours_and_theirs(checkpoint)
  _, _, scanned, _ = _ours_and_theirs(checkpoint, scan_layers=True)
  np.testing.assert_allclose(np.asarray(scanned["mlm_logits"]), np.asarray(unrolled["mlm_logits"]),
                             atol=1e-5, rtol=0)


def test_export_is_bit_exact_and_loads_with_no_missing_key(checkpoint, tmp_path):
  config, params = checkpoints.load_pretrained(checkpoint)
  tokenizer = tokenization.create_tokenizer(None, None, False,
                                            os.path.join(checkpoint, "tokenizer.json"))
  output = str(tmp_path / "out")
  architecture = checkpoints.export_huggingface(config, params, output, tokenizer=tokenizer)
  prefix = "XLMRoberta" if config.huggingface_type == "xlm-roberta" else "Roberta"
  assert architecture == f"{prefix}ForMaskedLM"
  from safetensors.numpy import load_file
  source = load_file(os.path.join(checkpoint, "model.safetensors"))
  written = load_file(os.path.join(output, "model.safetensors"))
  for key, value in source.items():
    np.testing.assert_array_equal(written[key], value, err_msg=key)
  model, info = transformers.AutoModelForMaskedLM.from_pretrained(output, output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  assert type(model).__name__ == architecture
  with open(os.path.join(output, "config.json")) as f:
    written_config = json.load(f)
  assert (written_config["pad_token_id"], written_config["bos_token_id"],
          written_config["eos_token_id"]) == (tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id)
  # And read back: the same config.
  assert checkpoints.load_pretrained_config(output) == config.replace(scan_layers=False)


def test_positions_and_token_types_are_robertas(checkpoint):
  """The position table holds max_position_embeddings - 2 tokens (numbered from pad + 1); a
  pair's second segment is not a token type; pairs are <s> A </s></s> B </s>."""
  config = checkpoints.load_pretrained_config(checkpoint)
  family = families.of(config)
  assert family.max_positions(config) == config.max_position_embeddings - 2
  with pytest.raises(ValueError, match=r"max_seq_length=65 exceeds the position table.*64 "
                                       "positions"):
    family.check_length(config, 65, checkpoint)
  assert not family.token_types and family.objectives == ("mlm",)
  tokenizer = tokenization.create_tokenizer(None, None, False,
                                            os.path.join(checkpoint, "tokenizer.json"))
  row = pairs.encode_pairs(tokenizer, ["a b"], ["c"], 16)["input_ids"][0]
  assert list(row).count(tokenizer.sep_id) == 3 and row[-1] == tokenizer.pad_id


def test_an_untied_decoder_is_a_clear_error(checkpoint, tmp_path):
  from safetensors.numpy import load_file, save_file
  state = load_file(os.path.join(checkpoint, "model.safetensors"))
  state["lm_head.decoder.weight"] = state["roberta.embeddings.word_embeddings.weight"] + 1.0
  broken = tmp_path / "untied"
  broken.mkdir()
  save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
  for name in ("config.json", "tokenizer.json"):
    (broken / name).write_bytes(open(os.path.join(checkpoint, name), "rb").read())
  with pytest.raises(ValueError, match="lm_head.decoder.weight differs from the token "
                                       "embeddings"):
    checkpoints.load_pretrained(str(broken))


def test_named_sizes_and_config_files():
  base = BertConfig.named("roberta-base")
  assert (base.num_hidden_layers, base.hidden_size, base.vocab_size,
          base.max_position_embeddings, base.type_vocab_size) == (12, 768, 50265, 514, 1)
  xlmr = BertConfig.named("xlm-roberta-large")
  assert (xlmr.num_hidden_layers, xlmr.vocab_size, xlmr.huggingface_type) == (
      24, 250002, "xlm-roberta")
  assert BertConfig.from_json_string(base.to_json_string()) == base
  with pytest.raises(ValueError, match="pad_token_id"):
    BertConfig.named("roberta-base", vocab_size=1, pad_token_id=1)
