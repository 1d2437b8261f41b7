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


def test_variants_change_only_what_they_ablate(tmp_path):
  config = _config(tmp_path)
  base = ablations.pretraining_config(config, "mlm_nsp").to_dict()
  for name, (_, overrides) in ablations.VARIANTS.items():
    variant = ablations.pretraining_config(config, name).to_dict()
    changed = {f"{k}.{kk}" if isinstance(v, dict) else k
               for k, v in variant.items()
               for kk in (v if isinstance(v, dict) else [None])
               if (base[k][kk] if isinstance(v, dict) else base[k]) != (
                   v[kk] if isinstance(v, dict) else v)}
    assert changed == set(overrides), name


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
