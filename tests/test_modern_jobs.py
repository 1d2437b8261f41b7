"""A ModernBERT-family encoder through every job a user runs, as the BERT one goes:
`experiments/pretrain_modernbert.py` pretrain -> extend from its workdir -> decay; GLUE, NER,
SQuAD and SWAG fine-tuning from a checkpoint; prediction; the SavedModel and transformers
exports of a fine-tuned classifier (outputs equal); extract_features' last layer is the
encoder's output after the final norm."""
import importlib
import json
import os

import jax
import numpy as np
import pytest

from bert_jax.io import checkpoints
from bert_jax import families
from bert_jax.runtime.metric_writers import read_metrics
from bert_jax.tasks import registry
from bert_jax.tasks.tools import fine_tuned, serving
from tests import finetuning_fixtures as fx

MODERN = dict(architecture="modernbert", num_hidden_layers=4, local_attention=8, pad_token_id=0,
              max_position_embeddings=8192, type_vocab_size=1, layer_norm_eps=1e-5,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
              classifier_pooling="mean")


@pytest.fixture(scope="module")
def modern_checkpoint(tmp_path_factory):
  return fx.write_checkpoint(str(tmp_path_factory.mktemp("modern") / "ckpt"), **MODERN)


def _experiment(arg):
  return importlib.import_module("experiments.pretrain_modernbert").get_config(arg)


@pytest.mark.slow
def test_phases_each_start_from_the_one_before(tmp_path):
  pretrain = _experiment("phase=pretrain,quick")
  assert pretrain.model.architecture == "modernbert" and pretrain.objective == "mlm"
  assert pretrain.data.instances == "documents" and pretrain.data.masked_lm_prob == 0.30
  registry.run_job(pretrain, str(tmp_path / "pretrain"))
  previous = tmp_path / "pretrain"
  for phase in ("extend", "decay"):
    config = _experiment(f"phase={phase},quick")
    assert config.model.global_rope_theta == 160_000.0
    assert config.max_seq_length == 2 * pretrain.max_seq_length
    config.init_checkpoint = str(previous)
    result = registry.run_job(config, str(tmp_path / phase))
    train = read_metrics(str(tmp_path / phase), "train")
    assert train[-1]["step"] == config.num_train_steps and np.isfinite(result["loss"])
    previous = tmp_path / phase
  saved, _ = checkpoints.load_pretrained(str(previous))
  assert saved.architecture == "modernbert" and saved.global_rope_theta == 160_000.0


def test_the_full_size_recipes():
  base = _experiment("size=base")
  assert (base.model.num_hidden_layers, base.model.hidden_size, base.model.intermediate_size,
          base.model.num_attention_heads) == (22, 768, 1152, 12)
  assert base.max_seq_length == 1024 and base.model.global_rope_theta == 10_000.0
  large = _experiment("size=large,phase=extend")
  assert (large.model.num_hidden_layers, large.model.hidden_size) == (28, 1024)
  assert large.max_seq_length == 8192 and large.model.global_rope_theta == 160_000.0
  # The same tokens per step in both phases.
  assert large.global_batch_size * 8192 == _experiment("size=large").global_batch_size * 1024


@pytest.mark.parametrize("kind", ["mrpc", "ner", "squad", "swag"])
def test_fine_tuning_takes_a_modern_encoder(modern_checkpoint, tmp_path, kind):
  workdir = fx.fine_tune(str(tmp_path), kind, modern_checkpoint)
  results = json.loads(open(os.path.join(workdir, "results.json")).read())
  assert results, kind
  loaded = fine_tuned.load(os.path.join(workdir, "best"))
  assert loaded.bert_config.architecture == "modernbert"


@pytest.mark.slow
def test_classifier_exports_compute_what_it_predicts(modern_checkpoint, tmp_path):
  workdir = fx.fine_tune(str(tmp_path), "mrpc", modern_checkpoint)
  best = os.path.join(workdir, "best")
  servable = serving.load(best)
  tokenizer = serving.tokenizer_for(servable)
  ids = [tokenizer.cls_id] + tokenizer.convert_tokens_to_ids(["the", "cat", "sat"]) + [
      tokenizer.sep_id] + tokenizer.convert_tokens_to_ids(["a", "dog"]) + [tokenizer.sep_id]
  batch = {"input_ids": np.zeros((2, 16), np.int32), "input_mask": np.zeros((2, 16), np.int32),
           "segment_ids": np.zeros((2, 16), np.int32)}
  for row, length in ((0, len(ids)), (1, 4)):
    batch["input_ids"][row, :length] = ids[:length]
    batch["input_mask"][row, :length] = 1
  ours = np.asarray(jax.jit(serving.serving_function(servable))(
      servable.params, batch["input_ids"], batch["input_mask"], batch["segment_ids"])["logits"])

  tf = pytest.importorskip("tensorflow")
  serving.export(best, "saved_model", str(tmp_path / "sm"))
  loaded = tf.saved_model.load(str(tmp_path / "sm"))
  got = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in batch.items()})
  np.testing.assert_allclose(got["logits"].numpy(), ours, atol=1e-5)

  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  serving.export(best, "huggingface", str(tmp_path / "hf"))
  hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "hf"))
  assert type(hf).__name__ == "ModernBertForSequenceClassification"
  with torch.no_grad():
    logits = hf.eval()(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                       attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long)).logits
  np.testing.assert_allclose(logits.numpy(), ours, atol=1e-5)


def test_a_tagger_exports_as_transformers_token_classifier(modern_checkpoint, tmp_path):
  """ModernBERT's tagger applies the prediction head on every token, as transformers'
  ModernBertForTokenClassification does: the export computes its logits."""
  from tests.test_family_matrix import _fine_tune_and_export
  _fine_tune_and_export(lambda family: modern_checkpoint, tmp_path, "modernbert", "ner")


def test_last_feature_layer_is_after_the_final_norm(modern_checkpoint):
  config, params = checkpoints.load_pretrained(modern_checkpoint)
  ids = np.array([[2, 10, 11, 12, 3, 0]], np.int32)
  mask = (ids > 0).astype(np.int32)
  out = families.of(config).encoder(config, add_pooling_layer=False).apply(
      {"params": params["bert"]}, ids, mask, output_hidden_states=True)
  assert out["hidden_states"].shape[0] == config.num_hidden_layers + 1
  np.testing.assert_array_equal(out["hidden_states"][-1], out["sequence_output"])


def test_the_demos_modern_twin_shares_its_corpus_and_scoring():
  demo = importlib.import_module("experiments.pretrain_demo")
  bert, modern = demo.get_config(), demo.get_config("recipe=modern")
  assert modern.model.architecture == "modernbert" and modern.objective == "mlm"
  assert modern.data.masked_lm_prob == 0.30 and modern.optimizer.name == "stable_adamw"
  for field in ("prepare_demo_corpus", "holdout_every", "dupe_factor", "eval_masked_lm_prob"):
    assert modern.data[field] == bert.data[field], field
  assert (modern.model.vocab_size, modern.max_seq_length, modern.global_batch_size) == (
      bert.model.vocab_size, bert.max_seq_length, bert.global_batch_size)
  with pytest.raises(ValueError, match="recipe"):
    demo.get_config("recipe=gpt")


def test_the_demos_modern_twin_trains(tmp_path):
  config = importlib.import_module("experiments.pretrain_demo").get_config("recipe=modern,quick")
  config.num_train_steps, config.eval_every_steps = 2, 0
  result = registry.run_job(config, str(tmp_path))
  assert np.isfinite(result["loss"])
