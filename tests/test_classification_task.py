"""Output kinds as objects (predict's records, the export's outputs and transformers class, raw
input formats) and the classification base: a GLUE-like task defined here, as a spec on
generated CSV data, fine-tunes, predicts and describes its export without editing glue.py."""
import csv
import dataclasses
import json
import os

import numpy as np
import pytest

from bert_jax.tasks.framework import classification, output_kinds
from bert_jax.tasks.framework.classification import ClassificationSpec
from bert_jax.tasks.tools import prediction
from tests import finetuning_fixtures as fx


class _Task:
  """What the kinds read of a task: its labels and (tagging, span) its predictions."""

  def __init__(self, labels=(), predictions=None, threshold=None):
    self.labels = labels
    self._predictions = predictions
    self._threshold = threshold

  def predict(self, examples, features, outputs):
    return self._predictions

  def null_threshold(self, directory):
    return self._threshold


class _Sentence:
  def __init__(self, words):
    self.words = words


def test_each_kind_makes_its_records():
  logits = np.array([[0.0, 2.0], [1.0, -1.0]], np.float32)
  records = output_kinds.CLASSIFICATION.records(_Task(("no", "yes")), [0, 1], None,
                                                {"logits": logits}, None)
  assert [r["label"] for r in records] == ["yes", "no"]
  assert records[0]["probability"] == pytest.approx(1 / (1 + np.exp(-2.0)))
  assert sorted(records[0]["probabilities"]) == ["no", "yes"]
  assert output_kinds.REGRESSION.records(_Task(), [0], None, {"logits": np.array([[2.5]])},
                                         None) == [{"score": 2.5}]
  choice, = output_kinds.MULTIPLE_CHOICE.records(_Task(), [0], None,
                                                 {"logits": np.array([[0.0, 3.0, 1.0, 0.0]])},
                                                 None)
  assert choice["choice"] == 1 and len(choice["probabilities"]) == 4
  tagged, = output_kinds.TAGGING.records(
      _Task(predictions=[["B-PER", "I-PER", "O", "B-LOC"]]),
      [_Sentence(["Ada", "Lovelace", "in", "London"])], None, {}, None)
  assert tagged["entities"] == [{"type": "PER", "start": 0, "end": 2, "text": "Ada Lovelace"},
                                {"type": "LOC", "start": 3, "end": 4, "text": "London"}]
  span = {"text": "", "best_non_null": "Paris", "null_odds": -1.0,
          "nbest": [{"text": "Paris", "probability": 0.75, "start_logit": 1.0},
                    {"text": "", "probability": 0.25}]}
  task = _Task(predictions=[span], threshold=0.0)
  settings = output_kinds.SPAN.prediction_settings(task, "best")
  answer, = output_kinds.SPAN.records(task, [0], None, {}, settings)
  assert answer == {"answer": "Paris", "probability": 0.75, "null_odds": -1.0,
                    "nbest": [{"text": "Paris", "probability": 0.75},
                              {"text": "", "probability": 0.25}]}
  with pytest.raises(NotImplementedError):
    output_kinds.ENCODER.records(task, [0], None, {}, None)


def test_kinds_are_objects_a_name_resolves_to():
  assert output_kinds.resolve("span") is output_kinds.SPAN
  assert output_kinds.resolve(output_kinds.TAGGING) is output_kinds.TAGGING
  with pytest.raises(ValueError, match="Unknown output kind 'spans'"):
    output_kinds.resolve("spans")
  # Whole-file input formats come from the kind, so does the transformers class.
  assert prediction.detect_format("dev.json", output_kinds.SPAN) == "squad_json"
  assert prediction.detect_format("dev.json", "classification") == "lines"
  assert prediction.detect_format("dev.jsonl", output_kinds.SPAN) == "jsonl"
  assert prediction.FORMATS == ("lines", "jsonl", "squad_json")
  assert output_kinds.whose_file_format("squad_json") == "SQuAD"
  assert {k.name: k.hf_head for k in output_kinds.TASK_KINDS} == {
      "classification": "sequence_classification", "regression": "sequence_classification",
      "multiple_choice": "multiple_choice", "tagging": "token_classification",
      "span": "question_answering"}
  assert output_kinds.REGRESSION.hf_config(()) == {"num_labels": 1, "problem_type": "regression"}
  assert output_kinds.ENCODER.output_names({"bert": {}}) == ("sequence_output",)


# ------------------------------------------------------------------------ the classification base


SPEC = ClassificationSpec(
    name="toy_sentiment", labels=("negative", "positive"), metrics=("accuracy", "f1"),
    columns=("review", None, "label"), test_columns=("id", "review", None),
    files=(("train", "train.csv"), ("dev", "dev.csv"), ("test", "test.csv")),
    delimiter=",", quotechar='"', positive_label="positive")

# The file a GLUE-like task is: its spec on the classification base (registered below by adding
# a folder to bert_jax/tasks/datasets' search path, as tests/test_registry.py does).
TOY_TASK_FILE = '''
"""A GLUE-like task: a spec on the classification base (CSV files, one sentence)."""
from bert_jax.tasks.framework.classification import ClassificationSpec, ClassificationTask


class ToySentimentTask(ClassificationTask):
  spec = ClassificationSpec(
      name="toy_sentiment", labels=("negative", "positive"), metrics=("accuracy", "f1"),
      columns=("review", None, "label"), test_columns=("id", "review", None),
      files=(("train", "train.csv"), ("dev", "dev.csv"), ("test", "test.csv")),
      delimiter=",", quotechar='"', positive_label="positive")


TASK = ToySentimentTask
'''


def _write_csv_data(root, sizes=(("train", 16), ("dev", 8), ("test", 4))):
  """Reviews with commas, quotes and a line break inside quoted fields."""
  os.makedirs(root, exist_ok=True)
  rng = np.random.default_rng(0)
  for split, n in sizes:
    with open(os.path.join(root, f"{split}.csv"), "w", encoding="utf-8", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(["id", "review"] + ([] if split == "test" else ["label"]))
      for i in range(n):
        good = bool(rng.integers(0, 2))
        review = f'{fx.sentence(rng)}, "{"good" if good else "bad"}" film'
        if i == 1:
          review += "\nthe end"
        writer.writerow([f"r{i}", review] + ([] if split == "test" else
                                             ["positive" if good else "negative"]))
  return root


def test_a_csv_spec_reads_quoted_fields_and_names_bad_rows(tmp_path):
  root = _write_csv_data(str(tmp_path / "data"))
  examples, skipped = classification.read_table(SPEC, os.path.join(root, "dev.csv"), True)
  assert (len(examples), skipped) == (8, 0)
  assert examples[1].text_a.endswith('" film\nthe end') and '"' in examples[0].text_a
  assert [e.guid for e in examples] == [str(i) for i in range(8)]
  test, _ = classification.read_table(SPEC, os.path.join(root, "test.csv"), False)
  assert [e.guid for e in test] == ["r0", "r1", "r2", "r3"] and test[0].label is None
  bad = tmp_path / "bad.csv"
  bad.write_text('id,review,label\nr0,"fine, ok",positive\nr1,"two\nlines",neutral\n'
                 'r2,a,positive,extra\n', encoding="utf-8")
  with pytest.raises(classification.DataError, match=r"bad\.csv:3: label 'neutral' is not one"):
    classification.read_table(SPEC, str(bad), True)
  with pytest.raises(classification.DataError,
                     match=r"bad\.csv:5: expected 3 comma-separated columns, got 4"):
    classification.read_table(dataclasses.replace(SPEC, labels=("positive", "neutral")),
                              str(bad), True)
  with pytest.raises(ValueError, match=r"metrics \['auc'\]"):
    ClassificationSpec(name="x", labels=("a", "b"), metrics=("auc",), columns=(0, None, 1))


def test_a_glue_like_task_is_a_spec(fine_tuned_runs, tmp_path, monkeypatch):
  """A new task made of a spec (and the config its experiment file would hold) fine-tunes
  through `config.task`, and `bert_jax.predict` and the export read its best/."""
  from bert_jax import tasks
  from bert_jax.tasks import datasets, registry
  from bert_jax.tasks.tools import fine_tuned, serving
  from experiments import finetuning_defaults
  folder = tmp_path / "more_tasks"
  folder.mkdir()
  (folder / "toy_sentiment.py").write_text(TOY_TASK_FILE, encoding="utf-8")
  monkeypatch.setattr(datasets, "__path__", list(datasets.__path__) + [str(folder)])
  assert "toy_sentiment" in registry.finetuning_tasks()

  # experiments/toy_sentiment.py would hold these lines.
  config = finetuning_defaults.get_config()
  config.task = "toy_sentiment"
  config.data.data_dir = _write_csv_data(str(tmp_path / "data"))
  finetuning_defaults.quick(config)
  config.init_checkpoint = fine_tuned_runs["encoder"]   # the tiny random encoder
  config.max_seq_length, config.num_train_epochs = 16, 1.0
  workdir = str(tmp_path / "run")
  results = tasks.run(config, workdir)
  assert results["task"] == "toy_sentiment" and results["best_metric"] == "accuracy"
  assert set(results["dev"]) >= {"accuracy", "f1"}
  with open(os.path.join(workdir, "dev_predictions.tsv"), encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t") for line in f]
  assert rows[0] == ["index", "prediction", "label"] and len(rows) == 9
  with open(os.path.join(workdir, "test_predictions.tsv"), encoding="utf-8") as f:
    assert [line.split("\t")[0] for line in f][1:] == ["r0", "r1", "r2", "r3"]

  # predict on the dev reviews as JSON lines: the run's own dev predictions.
  dev, _ = classification.read_table(SPEC, os.path.join(config.data.data_dir, "dev.csv"), True)
  source = tmp_path / "reviews.jsonl"
  source.write_text("".join(json.dumps({"text": e.text_a}) + "\n" for e in dev),
                    encoding="utf-8")
  model = fine_tuned.load(workdir)
  assert model.output_kind is output_kinds.CLASSIFICATION and model.kind == "classification"
  counts = prediction.predict_file(model, str(source), str(tmp_path / "out.jsonl"),
                                   progress=False)
  assert (counts.predicted, counts.bad) == (len(dev), 0)
  with open(tmp_path / "out.jsonl", encoding="utf-8") as f:
    out = [json.loads(line) for line in f]
  assert [o["label"] for o in out] == [r[1] for r in rows[1:]]
  with pytest.raises(ValueError, match="format squad_json is for SQuAD models"):
    prediction.predict_file(model, str(source), str(tmp_path / "x.jsonl"), fmt="squad_json")

  # The export's signature: the kind's outputs, the spec's labels.
  description = serving.signature_description(serving.load(workdir), "huggingface", None)
  assert (description["kind"], description["task"]) == ("classification", "toy_sentiment")
  assert description["labels"] == ["negative", "positive"]
  assert list(description["outputs"]) == ["logits"]
  assert description["tokenizer"]["input_format"] == "[CLS] A [SEP]"
