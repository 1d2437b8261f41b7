r"""Sentence and sentence-pair classification (or regression) from TSV/CSV files: a task as a spec.

A GLUE-like task is a `ClassificationSpec` (its files, columns, labels and metrics) on
`ClassificationTask`, in its file `bert_jax/tasks/datasets/NAME.py`, plus its experiment file:

    from bert_jax.tasks.framework.classification import ClassificationSpec, ClassificationTask

    class SentimentTask(ClassificationTask):
      spec = ClassificationSpec(
          name="sentiment", labels=("negative", "positive"), metrics=("accuracy", "f1"),
          columns=("sentence", None, "label"),   # text_a, text_b (None: one sentence), label
          positive_label="positive")             # the class f1 is of

    TASK = SentimentTask

and `experiments/NAME.py` sets `c.task = "NAME"` and `c.data.data_dir` (the folder holding the
spec's `files`) on `finetuning_defaults.get_config()`. Fine-tuning, `bert_jax.predict` and
`bert_jax.export` then work as for GLUE, whose nine tasks are such specs (`glue.GlueSpec` adds
the official folder, the TFDS names and the leaderboard files).

What a spec says:
* `files`: split -> file name in `config.data.data_dir` (train.tsv, dev.tsv, test.tsv by
  default); the train and `eval_splits` files are labelled, the `test_splits` ones are not.
* `columns` (text_a, text_b, label) of the labelled files and `test_columns` (index, text_a,
  text_b) of the others: header names, or positions in files without a header row
  (`labelled_header=False`, `test_header=False`). An index of None: the row's position.
* `delimiter`, `quotechar`: TSV as GLUE ships it (tab, no quoting: each line one row) or CSV
  (`delimiter=",", quotechar='"'`: quoted fields may hold the delimiter and line breaks).
* `labels`: the label names in logits order; () is regression (one output, MSE loss), whose
  values may be checked against `score_range`.
* `metrics`: names in `METRICS` (accuracy, f1 of `positive_label`, matthews_corr; pearson,
  spearman); the first selects `best/`.
* `skip_malformed`: a row with the wrong number of columns is skipped and counted rather than
  stopping the run (GLUE's QQP).

Every row is checked: a wrong number of columns or a label outside the label set stops the run
naming `file:line` (`DataError`). The task: features `[CLS] A [SEP] (B [SEP])`
(`pairs.encode_pairs`), `heads.ClassificationHead` on the pooled [CLS], output kind
`output_kinds.CLASSIFICATION` (or `REGRESSION`), files `<split>_predictions.tsv` (`index
prediction label`; a test split `index  prediction`; regression values as %.3f), raw input for
predict `text_a<TAB>text_b` (or one sentence) per line or {"text_a": ..., "text_b": ...}
({"text": ...}) per JSON line.
"""
import csv
import dataclasses
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from absl import logging

from bert_jax.io import filesystem
from bert_jax.model import heads
from bert_jax.runtime.outputs import is_writer
from bert_jax.tasks.framework import output_kinds
from bert_jax.tasks.framework.task import Features, Task, columns, text_field
from bert_jax.text import pairs

Column = Union[str, int]      # a header name, or a position for files without a header


@dataclasses.dataclass(frozen=True)
class TextExample:
  """One sentence (text_b None) or pair, with its label (None where unlabelled)."""
  guid: str                   # the index column, else the row's position in its file
  text_a: str
  text_b: Optional[str]
  label: Optional[Union[str, float]]


class DataError(ValueError):
  """A data file that does not have its spec's layout (names the file and line)."""


# ----------------------------------------------------------------------------------- metrics


def _accuracy(spec, y, p):
  from sklearn import metrics
  return metrics.accuracy_score(y, p)


def _f1(spec, y, p):
  from sklearn import metrics
  return metrics.f1_score(y, p, pos_label=spec.positive_label, labels=list(spec.labels),
                          zero_division=0.0)


def _matthews_corr(spec, y, p):
  from sklearn import metrics
  return metrics.matthews_corrcoef(y, p)


def _pearson(spec, y, p):
  from scipy import stats
  return stats.pearsonr(p, y)[0]


def _spearman(spec, y, p):
  from scipy import stats
  return stats.spearmanr(p, y)[0]


# name -> function(spec, labels, predictions): labels and predictions are label names (lists),
# or float64 arrays for regression.
METRICS: Dict[str, Callable] = {
    "accuracy": _accuracy, "f1": _f1, "matthews_corr": _matthews_corr,
    "pearson": _pearson, "spearman": _spearman}


# ----------------------------------------------------------------------------------- the spec


@dataclasses.dataclass(frozen=True)
class ClassificationSpec:
  """A classification or regression task's data, labels and metrics (see the module docstring)."""
  name: str
  labels: Tuple[str, ...]     # () = regression
  metrics: Tuple[str, ...]    # names in METRICS; the first one selects the best checkpoint
  columns: Tuple[Optional[Column], Optional[Column], Column]         # text_a, text_b, label
  test_columns: Optional[Tuple[Optional[Column], Optional[Column], Optional[Column]]] = None
  files: Tuple[Tuple[str, str], ...] = (("train", "train.tsv"), ("dev", "dev.tsv"),
                                         ("test", "test.tsv"))
  eval_splits: Tuple[str, ...] = ("dev",)
  test_splits: Tuple[str, ...] = ("test",)
  labelled_header: bool = True
  test_header: bool = True
  delimiter: str = "\t"
  quotechar: Optional[str] = None
  skip_malformed: bool = False
  score_range: Optional[Tuple[float, float]] = None
  positive_label: str = "1"

  def __post_init__(self):
    unknown = [m for m in self.metrics if m not in METRICS]
    if unknown or not self.metrics:
      raise ValueError(f"{self.name}: metrics {list(self.metrics)}: expected some of "
                       f"{sorted(METRICS)}")

  @property
  def is_regression(self) -> bool:
    return not self.labels

  @property
  def is_pair(self) -> bool:
    return self.columns[1] is not None

  @property
  def unlabelled_columns(self) -> Tuple[Optional[Column], Optional[Column], Optional[Column]]:
    """index, text_a, text_b of the unlabelled files (default: the labelled files' texts)."""
    return self.test_columns or (None, self.columns[0], self.columns[1])


# ----------------------------------------------------------------------------------- reading


def _column_index(wanted: Sequence[Optional[Column]], header: Optional[List[str]],
                  path: str) -> List[Optional[int]]:
  if header is None:
    return list(wanted)
  missing = [c for c in wanted if c is not None and c not in header]
  if missing:
    raise DataError(f"{path}:1: header has no column(s) {missing} (header: {header})")
  return [None if c is None else header.index(c) for c in wanted]


def check_label(spec: ClassificationSpec, raw: str, where: str) -> Union[str, float]:
  """A label cell as the example's label: a label name, or a number for regression."""
  if spec.is_regression:
    try:
      value = float(raw)
    except ValueError:
      raise DataError(f"{where}: score {raw!r} is not a number") from None
    if spec.score_range is not None:
      low, high = spec.score_range
      if not low <= value <= high:
        raise DataError(f"{where}: score {value} is outside [{low:g}, {high:g}]")
    return value
  if raw not in spec.labels:
    raise DataError(f"{where}: label {raw!r} is not one of {list(spec.labels)}")
  return raw


def _rows(spec: ClassificationSpec, f) -> Iterator[Tuple[int, List[str]]]:
  """(line number, cells) of every row of an open file, the first one whatever it holds."""
  if spec.quotechar is None:   # one row per line
    for line_no, line in enumerate(f, start=1):
      yield line_no, line.rstrip("\r\n").split(spec.delimiter)
    return
  reader = csv.reader(f, delimiter=spec.delimiter, quotechar=spec.quotechar)
  line_no = 1
  for row in reader:
    yield line_no, row
    line_no = reader.line_num + 1


def _separated(delimiter: str) -> str:
  return {"\t": "tab-separated", ",": "comma-separated"}.get(delimiter,
                                                              f"{delimiter!r}-separated")


def read_table(spec: ClassificationSpec, path: str, labelled: bool,
               wanted: Optional[Sequence[Optional[Column]]] = None
               ) -> Tuple[List[TextExample], int]:
  """(examples, malformed rows skipped) of one file in the spec's layout; every row is checked.

  wanted: the columns to read instead of the spec's (text_a, text_b, label when labelled; index,
  text_a, text_b otherwise)."""
  has_header = spec.labelled_header if labelled else spec.test_header
  if wanted is None:
    wanted = spec.columns if labelled else spec.unlabelled_columns
  examples, skipped = [], 0
  # utf-8-sig: a file may start with a byte-order mark (MRPC's do, as GLUE ships them).
  quoted = {} if spec.quotechar is None else {"newline": ""}
  with filesystem.open(path, encoding="utf-8-sig", **quoted) as f:
    rows = _rows(spec, f)
    header = next(rows, (1, [""]))[1] if has_header else None
    index = _column_index(wanted, header, path)
    width = len(header) if header else None
    for line_no, row in rows:
      if not spec.delimiter.join(row).strip():
        continue
      where = f"{path}:{line_no}"
      if width is None:
        width = len(row)   # no header: the first row sets the width
        needed = max(i for i in index if i is not None) + 1
        if needed > width:
          raise DataError(f"{where}: expected at least {needed} columns, got {width}")
      if len(row) != width:
        if spec.skip_malformed:
          skipped += 1
          continue
        raise DataError(f"{where}: expected {width} {_separated(spec.delimiter)} columns, "
                        f"got {len(row)}")
      cell = lambda i: None if i is None else row[i]
      if labelled:
        a, b, label = (cell(i) for i in index)
        # guid: the example's position in the file (dev_predictions.tsv's index column).
        examples.append(TextExample(str(len(examples)), a, b, check_label(spec, label, where)))
      else:
        guid, a, b = (cell(i) for i in index)
        examples.append(TextExample(str(len(examples)) if guid is None else guid, a, b, None))
  return examples, skipped


def report_skipped(path: str, skipped: int, why: str = "") -> None:
  """Says how many malformed rows of `path` were skipped (none: nothing)."""
  if skipped:
    logging.warning("%s: skipped %d malformed rows%s", path, skipped, f" ({why})" if why else "")
    print(f"{path}: skipped {skipped} malformed rows", flush=True)


# ----------------------------------------------------------------------------------- the task


def compute_metrics(spec: ClassificationSpec, labels: Sequence,
                    predictions: Sequence) -> Dict[str, float]:
  """The spec's metrics (fractions) of predictions against labels."""
  if spec.is_regression:
    y, p = np.asarray(labels, np.float64), np.asarray(predictions, np.float64)
  else:
    y, p = list(labels), list(predictions)
  return {name: float(METRICS[name](spec, y, p)) for name in spec.metrics}


def format_value(spec: ClassificationSpec, value) -> str:
  """A label or value as the prediction files write it."""
  return f"{value:.3f}" if spec.is_regression else str(value)


def write_table(spec: ClassificationSpec, path: str, examples: Sequence[TextExample],
                predictions: Sequence, with_labels: bool) -> str:
  """`index  prediction (label)` per example, with a header line; returns the path."""
  if with_labels:
    lines = ["index\tprediction\tlabel"] + [
        f"{e.guid}\t{format_value(spec, p)}\t{format_value(spec, e.label)}"
        for e, p in zip(examples, predictions)]
  else:
    lines = ["index\tprediction"] + [f"{e.guid}\t{format_value(spec, p)}"
                                     for e, p in zip(examples, predictions)]
  if is_writer():
    filesystem.write_text(path, "\n".join(lines) + "\n")
  return path


def make_features(spec: ClassificationSpec, max_seq_length: int,
                  examples: Sequence[TextExample], tokenizer) -> Features:
  arrays = pairs.encode_pairs(tokenizer, [e.text_a for e in examples],
                              [e.text_b for e in examples], max_seq_length)
  if spec.is_regression:
    arrays["label_values"] = np.array([e.label or 0.0 for e in examples], np.float32)
  else:
    label_id = {label: i for i, label in enumerate(spec.labels)}
    arrays["label_ids"] = np.array([label_id.get(e.label, 0) for e in examples], np.int32)
  return Features(arrays, np.arange(len(examples)))


def predict(spec: ClassificationSpec, logits: np.ndarray) -> List:
  """Label names (argmax), or values for regression, of logits [N, K]."""
  if spec.is_regression:
    return [float(x) for x in logits[:, 0]]
  return [spec.labels[i] for i in np.argmax(logits, axis=-1)]


class ClassificationTask(Task):
  """A task that is a `ClassificationSpec`: the class attribute `spec`, or the one given."""
  spec: Optional[ClassificationSpec] = None

  def __init__(self, config, spec: Optional[ClassificationSpec] = None):
    super().__init__(config)
    spec = spec if spec is not None else type(self).spec
    if spec is None:
      raise TypeError(f"{type(self).__name__}: a ClassificationTask needs a spec (class "
                      "attribute spec = ClassificationSpec(...))")
    self.spec = spec
    self.name = spec.name
    self.best_metric = spec.metrics[0]
    self.eval_splits, self.test_splits = spec.eval_splits, spec.test_splits
    self.output_kind = (output_kinds.REGRESSION if spec.is_regression
                        else output_kinds.CLASSIFICATION)
    self.labels = tuple(spec.labels)
    self.input_format = "[CLS] A [SEP] B [SEP]" if spec.is_pair else "[CLS] A [SEP]"

  def data_file(self, split: str) -> str:
    """The file of a split: `config.data.data_dir` / the spec's file name."""
    files = dict(self.spec.files)
    data_dir = self.config.data.get("data_dir", "")
    if not data_dir:
      raise ValueError(f"config.data.data_dir is empty: the folder with {self.name}'s files "
                       f"{sorted(files.values())}")
    path = filesystem.join(data_dir, files[split])
    if not filesystem.exists(path):
      raise FileNotFoundError(f"{self.name} file not found: {path} (config.data.data_dir: the "
                              f"folder with {sorted(files.values())})")
    return path

  def read_examples(self, split):
    path = self.data_file(split)
    examples, skipped = read_table(self.spec, path, split in (self.train_split,)
                                   + self.spec.eval_splits)
    report_skipped(path, skipped)
    return examples

  def make_features(self, examples, tokenizer, split):
    del split
    return make_features(self.spec, self.config.max_seq_length, examples, tokenizer)

  def shape_examples(self):
    """Four made-up examples of the spec's layout (features are padded to max_seq_length, so
    their text does not change a shape): no data file read."""
    text = " ".join(["word"] * 8)
    label = self.spec.labels[0] if self.spec.labels else 0.0
    return [TextExample(str(i), text, text if self.spec.is_pair else None, label)
            for i in range(4)]

  def make_head(self):
    return heads.ClassificationHead(max(len(self.spec.labels), 1), self.config.head_dropout)

  def loss(self, outputs, batch):
    if self.spec.is_regression:
      return heads.regression_loss(outputs, batch)
    return heads.classification_loss(outputs, batch)

  def predict(self, examples, features, outputs):
    del examples, features
    return predict(self.spec, outputs["logits"])

  def metrics(self, examples, predictions):
    return compute_metrics(self.spec, [e.label for e in examples], predictions)

  def prediction_file(self, split: str) -> Tuple[str, bool]:
    """(file name in the workdir, whether it has the label column) of a split's predictions."""
    return f"{split}_predictions.tsv", split not in self.spec.test_splits

  def write_predictions(self, workdir, split, examples, predictions):
    name, with_labels = self.prediction_file(split)
    return [write_table(self.spec, filesystem.join(workdir, name), examples, predictions,
                        with_labels)]

  def parse_input(self, record, guid):
    """One sentence, or a pair: `text_a<TAB>text_b` / {"text_a": ..., "text_b": ...}."""
    is_pair = self.spec.is_pair
    if "columns" in record:
      texts = columns(record, ("text_a", "text_b") if is_pair else ("text",))
      text_a, text_b = texts[0], (texts[1] if is_pair else None)
    else:
      text_a = text_field(record, "text_a", "text")
      text_b = text_field(record, "text_b") if is_pair else None
    return TextExample(guid, text_a, text_b, None)
