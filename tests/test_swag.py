"""SWAG: the swagaf CSV reader, bad rows, and a multiple-choice fine-tune end to end."""
import os

import numpy as np
import pytest

from bert_jax.tasks.datasets import swag
from bert_jax import tasks
from experiments import swag as swag_experiment
from tests import finetuning_fixtures as fx


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("swag")
  return dict(swag=fx.write_swag_dir(str(root / "swag"), dict(train=8, dev=5, test=3)),
              ckpt=fx.write_checkpoint(str(root / "ckpt")), root=root)


def test_reader_reads_the_swagaf_columns(data):
  examples = swag.read_csv(os.path.join(data["swag"], "val.csv"), labelled=True)
  assert len(examples) == 5
  first = examples[0]
  assert first.guid == "1000" and first.start_ending == "the man"
  assert len(first.endings) == 4 and first.label in range(4)
  test = swag.read_csv(os.path.join(data["swag"], "test.csv"), labelled=False)
  assert [e.label for e in test] == [None] * 3


def test_features_are_one_row_per_example_with_four_choices(data):
  from bert_jax.text import tokenization
  tokenizer = tokenization.FullTokenizer(os.path.join(data["ckpt"], "vocab.txt"))
  examples = swag.read_csv(os.path.join(data["swag"], "val.csv"), labelled=True)
  features = swag.make_features(24, examples, tokenizer, "dev")
  assert features.arrays["input_ids"].shape == (5, 4, 24)
  # Choice i is [CLS] sent1 [SEP] sent2 ending_i [SEP]: segment 1 covers "the man" + ending.
  ids, segments = features.arrays["input_ids"][0, 2], features.arrays["segment_ids"][0, 2]
  ending = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("the man " + examples[0].endings[2]))
  assert list(ids[segments == 1][:-1]) == ending
  np.testing.assert_array_equal(features.arrays["label_ids"], [e.label for e in examples])


def test_bad_label_names_file_and_line(data, tmp_path):
  path = tmp_path / "val.csv"
  lines = open(os.path.join(data["swag"], "val.csv"), encoding="utf-8").read().splitlines()
  lines[2] = lines[2].rsplit(",", 1)[0] + ",7"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  with pytest.raises(swag.SwagDataError, match=f"{path}:3: label '7' is not one of 0-3"):
    swag.read_csv(str(path), labelled=True)


def test_end_to_end(data):
  config = swag_experiment.get_config("quick")
  config.init_checkpoint, config.data.swag_dir = data["ckpt"], data["swag"]
  config.max_seq_length = 16
  workdir = str(data["root"] / "work")
  results = tasks.run(config, workdir)
  assert 0.0 <= results["dev"]["accuracy"] <= 1.0
  dev = [l.split("\t") for l in open(os.path.join(workdir, "dev_predictions.tsv")).read().split(
      "\n")[1:-1]]
  assert [r[0] for r in dev] == [str(1000 + i) for i in range(5)]
  assert {r[1] for r in dev} <= {"0", "1", "2", "3"}
  assert results["dev"]["accuracy"] == pytest.approx(np.mean([r[1] == r[2] for r in dev]))
  test = open(os.path.join(workdir, "test_predictions.tsv")).read().split("\n")
  assert test[0] == "index\tprediction" and len(test) == 5
