"""SWAG (multiple choice, spec section 5) as a `Task` (`config.task=swag`).

Data: the swagaf CSV files (`config.data.swag_dir` with `train.csv`, `val.csv`, `test.csv`;
columns `video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0..ending3, label`,
the test file without `label`). Each example becomes 4 rows of one [4, S] feature, pair
(sent1, sent2 + " " + ending_i) as in the released PyTorch port of the paper's setup; the
`MultipleChoiceHead` scores each pooled [CLS] with one vector and softmax runs over the choices.
Metric: accuracy. Files: `dev_predictions.tsv` (`index  prediction  label`) and
`test_predictions.tsv` (`index  prediction`), index = the `fold-ind` column, prediction 0-3.
"""
import csv
import dataclasses
from typing import Dict, List, Optional, Sequence

import ml_collections
import numpy as np

from bert_jax.io import filesystem
from bert_jax.tasks.framework import finetuning, output_kinds
from bert_jax.tasks.framework.task import BadInput, Task, columns, text_field
from bert_jax.text import pairs
from bert_jax.model import heads

NUM_CHOICES = 4
SPLIT_FILES = {"train": "train.csv", "dev": "val.csv", "test": "test.csv"}
_COLUMNS = ("fold-ind", "sent1", "sent2") + tuple(f"ending{i}" for i in range(NUM_CHOICES))


@dataclasses.dataclass(frozen=True)
class SwagExample:
  guid: str
  context: str                 # sent1
  start_ending: str            # sent2: the first words of every ending
  endings: Sequence[str]       # ending0..3
  label: Optional[int]         # None in the test file


class SwagDataError(ValueError):
  """A SWAG file that does not have the swagaf layout (names the file and line)."""


def read_csv(path: str, labelled: bool) -> List[SwagExample]:
  if not filesystem.exists(path):
    raise FileNotFoundError(f"SWAG file not found: {path} (expected the swagaf CSV files "
                            f"{sorted(SPLIT_FILES.values())} in --config.data.swag_dir)")
  examples = []
  with filesystem.open(path, encoding="utf-8", newline="") as f:
    reader = csv.DictReader(f)
    needed = _COLUMNS + (("label",) if labelled else ())
    missing = [c for c in needed if c not in (reader.fieldnames or ())]
    if missing:
      raise SwagDataError(f"{path}:1: header has no column(s) {missing} "
                          f"(header: {reader.fieldnames})")
    for row in reader:
      where = f"{path}:{reader.line_num}"
      if None in row or any(row[c] is None for c in needed):
        raise SwagDataError(f"{where}: expected {len(reader.fieldnames)} columns")
      label = None
      if labelled:
        if row["label"] not in [str(i) for i in range(NUM_CHOICES)]:
          raise SwagDataError(f"{where}: label {row['label']!r} is not one of 0-3")
        label = int(row["label"])
      examples.append(SwagExample(row["fold-ind"], row["sent1"], row["sent2"],
                                  [row[f"ending{i}"] for i in range(NUM_CHOICES)], label))
  return examples


def make_features(max_seq_length: int, examples: Sequence[SwagExample], tokenizer,
                  split: str) -> finetuning.Features:
  del split
  contexts = [e.context for e in examples for _ in range(NUM_CHOICES)]
  endings = [f"{e.start_ending} {ending}".strip() for e in examples for ending in e.endings]
  flat = pairs.encode_pairs(tokenizer, contexts, endings, max_seq_length)     # [N*4, S]
  arrays = {k: v.reshape(len(examples), NUM_CHOICES, max_seq_length)               # [N, 4, S]
            for k, v in flat.items()}
  arrays["label_ids"] = np.array([e.label or 0 for e in examples], np.int32)       # [N]
  return finetuning.Features(arrays, np.arange(len(examples)))


def accuracy(examples: Sequence[SwagExample], predictions: Sequence[int]) -> Dict[str, float]:
  from sklearn import metrics
  return {"accuracy": float(metrics.accuracy_score([e.label for e in examples], predictions))}


def write_predictions(workdir: str, split: str, examples: Sequence[SwagExample],
                      predictions: Sequence[int]) -> List[str]:
  import jax
  path = filesystem.join(workdir, f"{split}_predictions.tsv")
  if split == "test":
    lines = ["index\tprediction"] + [f"{e.guid}\t{p}" for e, p in zip(examples, predictions)]
  else:
    lines = ["index\tprediction\tlabel"] + [f"{e.guid}\t{p}\t{e.label}"
                                            for e, p in zip(examples, predictions)]
  if jax.process_index() == 0:
    filesystem.write_text(path, "\n".join(lines) + "\n")
  return [path]


class SwagTask(Task):
  """SWAG (config: experiments/swag.py)."""
  name = "swag"
  best_metric = "accuracy"
  eval_splits = ("dev",)
  test_splits = ("test",)
  output_kind = output_kinds.MULTIPLE_CHOICE
  labels = tuple(str(i) for i in range(NUM_CHOICES))
  input_format = "each choice c: [CLS] context [SEP] ending_c [SEP]"

  def read_examples(self, split):
    if not self.config.data.swag_dir:
      raise ValueError("config.data.swag_dir is empty: the folder with the swagaf CSV files")
    return read_csv(filesystem.join(self.config.data.swag_dir, SPLIT_FILES[split]),
                    split != "test")

  def make_features(self, examples, tokenizer, split):
    return make_features(self.config.max_seq_length, examples, tokenizer, split)

  def make_head(self):
    return heads.MultipleChoiceHead(self.config.head_dropout)

  def loss(self, outputs, batch):
    return heads.classification_loss(outputs, batch)      # softmax over the 4 choice scores

  def predict(self, examples, features, outputs):
    return [int(i) for i in np.argmax(outputs["logits"], -1)]

  def metrics(self, examples, predictions):
    return accuracy(examples, predictions)

  def write_predictions(self, workdir, split, examples, predictions):
    return write_predictions(workdir, split, examples, predictions)

  def parse_input(self, record, guid):
    """`context<TAB>ending0<TAB>...<TAB>ending3` / {"context": ..., "endings": [4 strings]}."""
    if "columns" in record:
      context, *endings = columns(record, ("context",) + tuple(
          f"ending{i}" for i in range(NUM_CHOICES)))
      start = ""
    else:
      context = text_field(record, "context")
      endings = record.get("endings")
      if (not isinstance(endings, list) or len(endings) != NUM_CHOICES
          or not all(isinstance(e, str) for e in endings)):
        raise BadInput(f'"endings" must be a list of {NUM_CHOICES} strings')
      start = record.get("start_ending", "")
    return SwagExample(guid, context, start, list(endings), None)


TASK = SwagTask


def run(config: ml_collections.ConfigDict, workdir: str) -> Dict:
  """The `swag` runner: `config.seeds` restarts of the fine-tuning loop."""
  return finetuning.run_task(SwagTask, config, workdir)
