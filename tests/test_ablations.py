"""experiments/ablations.py:quick: every piece of the ablation study runs, in one command, and
an interrupted study continues without redoing finished work."""
import json
import os

import pytest

from bert_jax import tasks
from bert_jax.tasks.jobs import ablations
from experiments import ablations as experiment
from tests import finetuning_fixtures as ftx


def _config(tmp_path):
  config = experiment.get_config("quick")
  config.glue.data.glue_dir = ftx.write_glue_dir(str(tmp_path / "glue_data"))
  return config


def _flat(config) -> dict:
  return {f"{k}.{kk}" if isinstance(v, dict) else k: (vv if isinstance(v, dict) else v)
          for k, v in config.to_dict().items()
          for kk, vv in (v.items() if isinstance(v, dict) else [(None, None)])}


def test_variants_change_only_what_they_ablate(tmp_path):
  config = _config(tmp_path)
  base = _flat(ablations.pretraining_config(config, "mlm_nsp"))
  for name, variant in ablations.VARIANTS.items():
    flat = _flat(ablations.pretraining_config(config, name))
    changed = {k for k in base.keys() | flat.keys() if base.get(k) != flat.get(k)}
    if variant.modern_block is None:
      assert changed == set(variant.overrides), name
    else:   # the model block is the ModernBERT family's, the rest as the overrides say
      assert {k for k in changed if not k.startswith("model.")} == set(variant.overrides), name


def test_the_modern_parts_keep_the_base_models_size():
  config = experiment.get_config("study=modern")
  names = ablations.variant_names(config)
  assert names[0] == "mlm_nsp" and names[-1] == "modern_recipe" and len(names) == 9
  assert [ev.key for ev in ablations.common_evals(config)] == ["eval_pairs", "eval_text"]
  base = config.pretraining.model
  block = ablations.pretraining_config(config, "modern_block")
  assert block.objective == "mlm" and block.data.instances == "contiguous"
  model = block.model
  assert model.architecture == "modernbert"
  assert (model.num_hidden_layers, model.hidden_size, model.num_attention_heads,
          model.vocab_size) == (base.num_hidden_layers, base.hidden_size,
                                base.num_attention_heads, base.vocab_size)
  assert model.intermediate_size == 320 and model.glu   # BERT-tiny's MLP weights: 512 -> 2/3
  assert model.local_attention == config.pretraining.max_seq_length // 2
  assert model.global_rope_theta == model.local_rope_theta == 10_000.0
  no_glu = ablations.pretraining_config(config, "modern_block_no_glu").model
  assert not no_glu.glu and no_glu.intermediate_size == base.intermediate_size
  assert ablations.pretraining_config(config, "modern_block_global").model.local_attention == 0
  # Only the named part changes: 30% masking keeps NSP and BERT's block.
  mask_30 = ablations.pretraining_config(config, "mask_30")
  assert mask_30.objective == "mlm_nsp" and "architecture" not in mask_30.model
  assert mask_30.data.masked_lm_prob == 0.30 and mask_30.max_predictions_per_seq == 40
  recipe = ablations.pretraining_config(config, "modern_recipe")
  assert (recipe.optimizer.name, recipe.schedule.name, recipe.data.masked_lm_prob,
          recipe.model.architecture) == ("stable_adamw", "wsd", 0.30, "modernbert")


def test_unknown_names_are_refused_naming_the_field(tmp_path):
  config = _config(tmp_path)
  config.variants = "mlm_nsp,modern_blok"
  with pytest.raises(ValueError, match="config.variants: unknown"):
    ablations.variant_names(config)
  config.common_evals = "pairs,txt"
  with pytest.raises(ValueError, match="config.common_evals: unknown"):
    ablations.common_evals(config)


@pytest.mark.slow
def test_quick_study_writes_the_table_and_resumes(tmp_path):
  config = _config(tmp_path)
  workdir = tmp_path / "study"
  results = tasks.run(config, str(workdir))
  assert list(results) == ["mlm_nsp", "ltr_no_nsp"]
  for name, result in results.items():
    scores = result["glue"]["mrpc"]["scores"]
    assert len(scores) == 2 and all(0 <= s <= 100 for s in scores)
    # The spread is the sample std of the seeds' scores (two seeds: half their distance x sqrt 2).
    assert result["glue"]["mrpc"]["std"] == pytest.approx(abs(scores[0] - scores[1]) / 2 ** 0.5)
    assert 0 <= result["pretraining_eval"]["mlm_accuracy"] <= 1
    # MLM variants are also scored on one masking for all (every target [MASK]): the evaluation
    # of the final checkpoint, logged as step 0 of its own workdir.
    if name == "ltr_no_nsp":
      assert "common_masking_eval" not in result
    else:
      common = result["common_masking_eval"]
      assert common["step"] == 0 and 0 <= common["mlm_accuracy"] <= 1
      assert common["mlm_loss"] != result["pretraining_eval"]["mlm_loss"]  # other targets
    # The C.2 variants (and BERT itself) get the NER probe; the LTR model does not.
    assert ("ner_feature_based_f1" in result) == (name != "ltr_no_nsp")
  # The LTR variant was fine-tuned left to right, as it was pre-trained.
  ltr_glue = json.load(open(workdir / "ltr_no_nsp" / "glue" / "mrpc" / "seed_0" / "results.json"))
  assert ltr_glue["init_checkpoint"].endswith(os.path.join("ltr_no_nsp", "pretraining"))
  table = (workdir / "ablations.md").read_text()
  assert "| mlm_nsp |" in table and "MRPC 86.7" in table and "NER feature-based 94.0" not in table
  assert "(next token)" in table and "held-out MLM acc, all [MASK]" in table

  # Same command again: everything is read back, nothing is trained again.
  metrics = (workdir / "mlm_nsp" / "pretraining" / "metrics.jsonl").read_text()
  again = tasks.run(config, str(workdir))
  assert again == json.loads(json.dumps(results))
  assert (workdir / "mlm_nsp" / "pretraining" / "metrics.jsonl").read_text() == metrics


@pytest.mark.slow
def test_quick_modern_study_scores_every_row_on_the_same_held_out_positions(tmp_path):
  config = experiment.get_config("study=modern,quick")
  config.glue.data.glue_dir = ftx.write_glue_dir(str(tmp_path / "glue_data"))
  workdir = tmp_path / "study"
  results = tasks.run(config, str(workdir))
  assert list(results) == ["mlm_nsp", "modern_recipe"]
  # One vocabulary (learned once, copied beside the contiguous records), the held-out documents
  # in both forms.
  data, contiguous = workdir / "data", workdir / "contiguous" / "data"
  assert (contiguous / "vocab.txt").read_text() == (data / "vocab.txt").read_text()
  assert (contiguous / "eval.txt").read_text() == (data / "eval.txt").read_text()
  assert (contiguous / "eval.tfrecord").read_bytes() != (data / "eval.tfrecord").read_bytes()
  for key in ("eval_pairs", "eval_text"):
    bert, modern = results["mlm_nsp"][key], results["modern_recipe"][key]
    assert bert["step"] == modern["step"] == 0
    assert 0 <= bert["mlm_accuracy"] <= 1 and 0 <= modern["mlm_accuracy"] <= 1
    assert "nsp_accuracy" not in bert     # the masked LM alone
  # The two forms are other instances: other losses from the same model.
  assert results["mlm_nsp"]["eval_pairs"]["mlm_loss"] != results["mlm_nsp"]["eval_text"]["mlm_loss"]
  # The modern row trained on contiguous text at 30%, BERT's on pairs with NSP.
  written = json.load(open(workdir / "modern_recipe" / "pretraining" / "bert_config.json"))
  assert written["architecture"] == "modernbert"
  assert list((workdir / "contiguous" / "data").glob("*.tfrecord*"))
  assert "nsp_accuracy" in results["mlm_nsp"]["pretraining_eval"]
  assert "nsp_accuracy" not in results["modern_recipe"]["pretraining_eval"]
  table = (workdir / "ablations.md").read_text()
  assert "| modern_recipe | all of the above" in table
  assert "held-out MLM acc at 15%, pairs" in table and "held-out MLM acc at 15%, text" in table
