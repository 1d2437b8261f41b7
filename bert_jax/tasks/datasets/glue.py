"""GLUE: the nine tasks as one `Task` class (`config.task=glue`), official metrics, and
leaderboard submission files.

Data comes from the folder layout the official download script writes (`config.data.glue_dir`
with `CoLA/`, `SST-2/`, `MRPC/`, `STS-B/`, `QQP/`, `MNLI/`, `QNLI/`, `RTE/`, `WNLI/`,
`diagnostic/diagnostic.tsv`), or from tensorflow-datasets `glue/<task>`
(`config.data.source="tfds"`). Columns are found by the header names of each file (CoLA's
train/dev files have no header: by position, as the original `run_classifier.py`). A row with the
wrong number of columns or a label outside the task's label set stops the run with `file:line`;
QQP's files are known to hold a few broken rows, which are skipped and counted instead.

Metrics (scikit-learn / scipy, on the whole dev set): CoLA Matthews correlation; SST-2, MNLI
matched and mismatched, QNLI, RTE, WNLI accuracy; MRPC and QQP F1 (positive class "1") and
accuracy; STS-B Pearson and Spearman (regression, one output, MSE). Values are fractions in
[-1, 1]; the GLUE score table shows them x100.

Files written (WORKDIR): `dev_predictions.tsv` (`index  prediction  label`; MNLI's mismatched dev
set: `dev_mismatched_predictions.tsv`) and the leaderboard's test file for the task
(`CoLA.tsv`, `SST-2.tsv`, `MRPC.tsv`, `STS-B.tsv`, `QQP.tsv`, `MNLI-m.tsv`, `MNLI-mm.tsv`,
`QNLI.tsv`, `RTE.tsv`, `WNLI.tsv`, and `AX.tsv` from the MNLI model): `index<TAB>prediction` with
the leaderboard's label strings.
"""
import dataclasses
import json
from typing import Dict, List, Optional, Sequence, Tuple, Union

import ml_collections
import numpy as np
from absl import logging

from bert_jax.io import filesystem
from bert_jax.tasks.framework import finetuning
from bert_jax.tasks.framework.task import Task, columns, text_field
from bert_jax.runtime import config_names
from bert_jax.text import pairs
from bert_jax.model import heads

Column = Union[str, int]      # a header name, or a position for files without a header


@dataclasses.dataclass(frozen=True)
class GlueExample:
  guid: str                   # the file's index/id column (what the submission file needs)
  text_a: str
  text_b: Optional[str]
  label: Optional[Union[str, float]]   # None on test splits


@dataclasses.dataclass(frozen=True)
class GlueSpec:
  """Where one task's data lives and what its labels and metrics are."""
  name: str                   # also the TFDS config name: glue/<name>
  folder: str
  labels: Tuple[str, ...]     # () = regression (STS-B)
  metrics: Tuple[str, ...]    # the first one selects the best checkpoint
  columns: Tuple[Optional[Column], Optional[Column], Column]         # text_a, text_b, label
  test_columns: Tuple[Column, Optional[Column], Optional[Column]]   # index, text_a, text_b
  tfds_text: Tuple[str, Optional[str]]
  eval_splits: Tuple[str, ...] = ("dev",)
  test_splits: Tuple[str, ...] = ("test",)
  files: Tuple[Tuple[str, str], ...] = (("train", "train.tsv"), ("dev", "dev.tsv"),
                                         ("test", "test.tsv"))
  submissions: Tuple[Tuple[str, str], ...] = ()
  tfds_splits: Tuple[Tuple[str, str, str], ...] = ()   # (our split, tfds config, tfds split)
  labelled_header: bool = True
  skip_malformed: bool = False

  @property
  def is_regression(self) -> bool:
    return not self.labels


_PAIR = ("sentence1", "sentence2")
_NLI_LABELS = ("entailment", "not_entailment")


def _tfds_default(name):
  return (("train", name, "train"), ("dev", name, "validation"), ("test", name, "test"))


GLUE_TASKS: Dict[str, GlueSpec] = {s.name: s for s in [
    GlueSpec("cola", "CoLA", ("0", "1"), ("matthews_corr",), (3, None, 1),
             ("index", "sentence", None), ("sentence", None), labelled_header=False,
             submissions=(("test", "CoLA.tsv"),), tfds_splits=_tfds_default("cola")),
    GlueSpec("sst2", "SST-2", ("0", "1"), ("accuracy",), ("sentence", None, "label"),
             ("index", "sentence", None), ("sentence", None),
             submissions=(("test", "SST-2.tsv"),), tfds_splits=_tfds_default("sst2")),
    GlueSpec("mrpc", "MRPC", ("0", "1"), ("f1", "accuracy"), ("#1 String", "#2 String", "Quality"),
             ("index", "#1 String", "#2 String"), _PAIR,
             submissions=(("test", "MRPC.tsv"),), tfds_splits=_tfds_default("mrpc")),
    GlueSpec("stsb", "STS-B", (), ("pearson", "spearman"), _PAIR + ("score",),
             ("index",) + _PAIR, _PAIR,
             submissions=(("test", "STS-B.tsv"),), tfds_splits=_tfds_default("stsb")),
    GlueSpec("qqp", "QQP", ("0", "1"), ("f1", "accuracy"),
             ("question1", "question2", "is_duplicate"), ("id", "question1", "question2"),
             ("question1", "question2"), skip_malformed=True,
             submissions=(("test", "QQP.tsv"),), tfds_splits=_tfds_default("qqp")),
    GlueSpec("mnli", "MNLI", ("contradiction", "entailment", "neutral"), ("accuracy",),
             _PAIR + ("gold_label",), ("index",) + _PAIR, ("premise", "hypothesis"),
             eval_splits=("dev", "dev_mismatched"),
             test_splits=("test", "test_mismatched", "ax"),
             files=(("train", "train.tsv"), ("dev", "dev_matched.tsv"),
                    ("dev_mismatched", "dev_mismatched.tsv"), ("test", "test_matched.tsv"),
                    ("test_mismatched", "test_mismatched.tsv"),
                    ("ax", "../diagnostic/diagnostic.tsv")),
             submissions=(("test", "MNLI-m.tsv"), ("test_mismatched", "MNLI-mm.tsv"),
                          ("ax", "AX.tsv")),
             tfds_splits=(("train", "mnli", "train"), ("dev", "mnli", "validation_matched"),
                          ("dev_mismatched", "mnli", "validation_mismatched"),
                          ("test", "mnli", "test_matched"),
                          ("test_mismatched", "mnli", "test_mismatched"),
                          ("ax", "ax", "test"))),
    GlueSpec("qnli", "QNLI", _NLI_LABELS, ("accuracy",), ("question", "sentence", "label"),
             ("index", "question", "sentence"), ("question", "sentence"),
             submissions=(("test", "QNLI.tsv"),), tfds_splits=_tfds_default("qnli")),
    GlueSpec("rte", "RTE", _NLI_LABELS, ("accuracy",), _PAIR + ("label",), ("index",) + _PAIR,
             _PAIR, submissions=(("test", "RTE.tsv"),), tfds_splits=_tfds_default("rte")),
    GlueSpec("wnli", "WNLI", ("0", "1"), ("accuracy",), _PAIR + ("label",), ("index",) + _PAIR,
             _PAIR, submissions=(("test", "WNLI.tsv"),), tfds_splits=_tfds_default("wnli")),
]}

# The diagnostic set's columns (predicted with the MNLI model).
_AX_COLUMNS = ("index",) + _PAIR


def spec_for(name: str) -> GlueSpec:
  key = name.lower().replace("-", "")
  if key not in GLUE_TASKS:
    raise ValueError(f"Unknown GLUE task {name!r}; expected one of {sorted(GLUE_TASKS)}")
  return GLUE_TASKS[key]


# ----------------------------------------------------------------------------------- readers


class GlueDataError(ValueError):
  """A GLUE file that does not have the official layout (names the file and line)."""


def _column_index(columns: Sequence[Optional[Column]], header: Optional[List[str]],
                  path: str) -> List[Optional[int]]:
  if header is None:
    return list(columns)
  missing = [c for c in columns if c is not None and c not in header]
  if missing:
    raise GlueDataError(f"{path}:1: header has no column(s) {missing} (header: {header})")
  return [None if c is None else header.index(c) for c in columns]


def _check_label(spec: GlueSpec, raw: str, where: str) -> Union[str, float]:
  if spec.is_regression:
    try:
      value = float(raw)
    except ValueError:
      raise GlueDataError(f"{where}: score {raw!r} is not a number") from None
    if not 0.0 <= value <= 5.0:
      raise GlueDataError(f"{where}: score {value} is outside [0, 5]")
    return value
  if raw not in spec.labels:
    raise GlueDataError(f"{where}: label {raw!r} is not one of {list(spec.labels)}")
  return raw


def read_tsv(spec: GlueSpec, path: str, labelled: bool) -> List[GlueExample]:
  """Examples of one official GLUE TSV file; every row is checked (see the module docstring)."""
  if not filesystem.exists(path):
    raise FileNotFoundError(f"GLUE file not found: {path} (is --config.data.glue_dir the folder "
                            f"the GLUE download script wrote, with {spec.folder}/ inside?)")
  has_header = spec.labelled_header or not labelled
  if labelled:
    wanted = spec.columns
  elif filesystem.basename(path) == "diagnostic.tsv":
    wanted = _AX_COLUMNS
  else:
    wanted = spec.test_columns
  examples, skipped = [], 0
  # utf-8-sig: MRPC's files start with a byte-order mark, as GLUE ships them.
  with filesystem.open(path, encoding="utf-8-sig") as f:
    header = f.readline().rstrip("\r\n").split("\t") if has_header else None
    index = _column_index(wanted, header, path)
    width = len(header) if header else None
    for line_no, line in enumerate(f, start=2 if has_header else 1):
      line = line.rstrip("\r\n")
      if not line.strip():
        continue
      row = line.split("\t")
      where = f"{path}:{line_no}"
      if width is None:
        width = len(row)   # headerless (CoLA): the first row sets the width
        if max(i for i in index if i is not None) >= width:
          raise GlueDataError(f"{where}: expected at least {max(index) + 1} columns, got {width}")
      if len(row) != width:
        if spec.skip_malformed:
          skipped += 1
          continue
        raise GlueDataError(f"{where}: expected {width} tab-separated columns, got {len(row)}")
      cell = lambda i: None if i is None else row[i]
      if labelled:
        a, b, label = (cell(i) for i in index)
        # guid: the example's position in the file (dev_predictions.tsv's index column).
        examples.append(GlueExample(str(len(examples)), a, b, _check_label(spec, label, where)))
      else:
        guid, a, b = (cell(i) for i in index)
        examples.append(GlueExample(guid, a, b, None))
  if skipped:
    logging.warning("%s: skipped %d malformed rows (known in the official %s files)", path,
                    skipped, spec.folder)
    print(f"{path}: skipped {skipped} malformed rows", flush=True)
  return examples


def read_tfds(spec: GlueSpec, split: str, data_dir: Optional[str]) -> List[GlueExample]:
  """Examples of tensorflow-datasets `glue/<config>`; test splits have label -1 there."""
  import tensorflow_datasets as tfds
  table = {ours: (cfg, theirs) for ours, cfg, theirs in spec.tfds_splits}
  if split not in table:
    raise ValueError(f"GLUE {spec.name}: no TFDS split for {split!r}")
  cfg, theirs = table[split]
  dataset, info = tfds.load(f"glue/{cfg}", split=theirs, data_dir=data_dir or None,
                            with_info=True, shuffle_files=False)
  names = getattr(info.features["label"], "names", None)
  key_a, key_b = spec.tfds_text
  examples = []
  for ex in tfds.as_numpy(dataset):
    text = lambda k: None if k is None else ex[k].decode("utf-8")
    raw = ex["label"]
    if spec.is_regression:
      label = None if raw < 0 else float(raw)
    elif int(raw) < 0:
      label = None
    else:  # TFDS names for NLI tasks; our "0"/"1" strings are the TFDS class index
      label = names[int(raw)] if names[int(raw)] in spec.labels else str(int(raw))
      if label not in spec.labels:
        raise GlueDataError(f"glue/{cfg} {theirs} idx {ex['idx']}: label {label!r} is not one "
                            f"of {list(spec.labels)}")
    examples.append(GlueExample(str(int(ex["idx"])), text(key_a), text(key_b), label))
  examples.sort(key=lambda e: int(e.guid))
  return examples


def read_examples(spec: GlueSpec, data: ml_collections.ConfigDict, split: str
                  ) -> List[GlueExample]:
  labelled = split in ("train",) + spec.eval_splits
  if data.source == "tfds":
    return read_tfds(spec, split, data.get("tfds_data_dir"))
  if data.source != "tsv":
    raise ValueError(f"config.data.source={data.source!r}: expected 'tsv' or 'tfds'")
  if not data.glue_dir:
    raise ValueError("config.data.glue_dir is empty: the folder the GLUE download script wrote "
                     "(or use --config.data.source=tfds)")
  files = dict(spec.files)
  return read_tsv(spec, filesystem.normpath(filesystem.join(data.glue_dir, spec.folder,
                                                            files[split])), labelled)


# ----------------------------------------------------------------------------------- metrics


def compute_metrics(spec: GlueSpec, labels: Sequence, predictions: Sequence) -> Dict[str, float]:
  """The official metrics of the task (fractions)."""
  from scipy import stats
  from sklearn import metrics as skm
  if spec.is_regression:
    y, p = np.asarray(labels, np.float64), np.asarray(predictions, np.float64)
    return {"pearson": float(stats.pearsonr(p, y)[0]), "spearman": float(stats.spearmanr(p, y)[0])}
  y, p = list(labels), list(predictions)
  out = {}
  for name in spec.metrics:
    if name == "accuracy":
      out[name] = float(skm.accuracy_score(y, p))
    elif name == "f1":
      out[name] = float(skm.f1_score(y, p, pos_label="1", labels=list(spec.labels),
                                     zero_division=0.0))
    elif name == "matthews_corr":
      out[name] = float(skm.matthews_corrcoef(y, p))
    else:
      raise ValueError(f"unknown GLUE metric {name!r}")
  return out


def task_score(metrics: Dict[str, float], spec: GlueSpec) -> float:
  """The leaderboard's per-task score: the mean of the task's metrics (x100)."""
  return 100.0 * float(np.mean([metrics[m] for m in spec.metrics]))


# ----------------------------------------------------------------------------------- files


def _format(spec: GlueSpec, prediction) -> str:
  return f"{prediction:.3f}" if spec.is_regression else str(prediction)


def write_predictions(spec: GlueSpec, workdir: str, split: str, examples: Sequence[GlueExample],
                      predictions: Sequence) -> List[str]:
  """Dev splits: `<split>_predictions.tsv` with labels; test splits: the leaderboard file."""
  import jax
  submissions = dict(spec.submissions)
  if split in submissions:
    path = filesystem.join(workdir, submissions[split])
    lines = ["index\tprediction"] + [f"{e.guid}\t{_format(spec, p)}"
                                     for e, p in zip(examples, predictions)]
  else:
    path = filesystem.join(workdir, f"{split}_predictions.tsv")
    lines = ["index\tprediction\tlabel"] + [
        f"{e.guid}\t{_format(spec, p)}\t{_format(spec, e.label)}"
        for e, p in zip(examples, predictions)]
  if jax.process_index() == 0:
    filesystem.write_text(path, "\n".join(lines) + "\n")
  return [path]


# ----------------------------------------------------------------------------------- the task


def make_features(spec: GlueSpec, max_seq_length: int, examples: Sequence[GlueExample],
                  tokenizer, split: str) -> finetuning.Features:
  del split
  arrays = pairs.encode_pairs(tokenizer, [e.text_a for e in examples],
                                   [e.text_b for e in examples], max_seq_length)
  if spec.is_regression:
    arrays["label_values"] = np.array([e.label or 0.0 for e in examples], np.float32)
  else:
    label_id = {label: i for i, label in enumerate(spec.labels)}
    arrays["label_ids"] = np.array([label_id.get(e.label, 0) for e in examples], np.int32)
  return finetuning.Features(arrays, np.arange(len(examples)))


def predict(spec: GlueSpec, examples, features, outputs) -> List:
  del examples, features
  logits = outputs["logits"]                                                 # [N, K]
  if spec.is_regression:
    return [float(x) for x in logits[:, 0]]
  return [spec.labels[i] for i in np.argmax(logits, axis=-1)]


class GlueTask(Task):
  """The GLUE task `config.data.glue_task` (config: experiments/glue.py)."""

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self.spec = spec = spec_for(config.data.glue_task)
    self.name = spec.name
    self.best_metric = spec.metrics[0]
    self.eval_splits, self.test_splits = spec.eval_splits, spec.test_splits
    self.output_kind = "regression" if spec.is_regression else "classification"
    self.labels = tuple(spec.labels)
    self.input_format = ("[CLS] A [SEP] B [SEP]" if spec.is_regression else
                         "one sentence: [CLS] A [SEP]; a pair: [CLS] A [SEP] B [SEP]")

  def read_examples(self, split):
    return read_examples(self.spec, self.config.data, split)

  def make_features(self, examples, tokenizer, split):
    return make_features(self.spec, self.config.max_seq_length, examples, tokenizer, split)

  def make_head(self):
    return heads.ClassificationHead(max(len(self.spec.labels), 1), self.config.head_dropout)

  def loss(self, outputs, batch):
    if self.spec.is_regression:
      return heads.regression_loss(outputs, batch)
    return heads.classification_loss(outputs, batch)

  def predict(self, examples, features, outputs):
    return predict(self.spec, examples, features, outputs)

  def metrics(self, examples, predictions):
    return compute_metrics(self.spec, [e.label for e in examples], predictions)

  def write_predictions(self, workdir, split, examples, predictions):
    return write_predictions(self.spec, workdir, split, examples, predictions)

  def parse_input(self, record, guid):
    """One sentence, or a pair: `text_a<TAB>text_b` / {"text_a": ..., "text_b": ...}."""
    is_pair = self.spec.columns[1] is not None
    if "columns" in record:
      texts = columns(record, ("text_a", "text_b") if is_pair else ("text",))
      text_a, text_b = texts[0], (texts[1] if is_pair else None)
    else:
      text_a = text_field(record, "text_a", "text")
      text_b = text_field(record, "text_b") if is_pair else None
    return GlueExample(guid, text_a, text_b, None)


TASK = GlueTask


def run(config: ml_collections.ConfigDict, workdir: str) -> Dict:
  """One GLUE task, `config.seeds` restarts (the `glue` runner)."""
  return finetuning.run_task(GlueTask, config, workdir)


# ----------------------------------------------------------------------------------- all tasks


def score_table(results: Dict[str, Dict]) -> str:
  """The GLUE dev score table (x100); the average counts MNLI once (matched/mismatched mean)."""
  rows, scores = [], []
  for name, result in results.items():
    spec = spec_for(name)
    dev = result["dev"]
    shown = "/".join(f"{100 * dev[m]:.1f}" for m in spec.metrics)
    score = task_score(dev, spec)
    if name == "mnli":
      mm = result["dev_mismatched"]
      shown = f"{100 * dev['accuracy']:.1f}/{100 * mm['accuracy']:.1f}"
      score = (score + task_score(mm, spec)) / 2
    scores.append(score)
    rows.append(f"| {spec.folder} | {'/'.join(spec.metrics)} | {shown} | {score:.1f} |")
  header = ["| task | metric | dev | score |", "|---|---|---|---|"]
  footer = [f"| **GLUE score (dev)** | mean of {len(scores)} | | **{np.mean(scores):.1f}** |"]
  return "\n".join(header + rows + footer)


def run_all(config: ml_collections.ConfigDict, workdir: str) -> Dict:
  """Every task of `config.glue_tasks` in WORKDIR/<task>; the submission files are collected in
  WORKDIR/submission/ (zip it for the leaderboard) and the score table goes to WORKDIR/glue.md."""
  submission_dir = filesystem.join(workdir, "submission")
  filesystem.makedirs(submission_dir)
  results = {}
  for name in [t.strip() for t in config.glue_tasks.split(",") if t.strip()]:
    task_config = config_names.replaced(config, {"task": "glue", "data.glue_task": name})
    task_dir = filesystem.join(workdir, name)
    results[name] = run(task_config, task_dir)
    for _, filename in spec_for(name).submissions:
      if filesystem.exists(filesystem.join(task_dir, filename)):
        filesystem.copy(filesystem.join(task_dir, filename),
                        filesystem.join(submission_dir, filename))
  table = score_table(results)
  print(table, flush=True)
  filesystem.write_text(filesystem.join(workdir, "glue.md"), table + "\n")
  filesystem.write_text(filesystem.join(workdir, finetuning.RESULTS_FILE),
                        json.dumps({"tasks": results, "table": table}, indent=2, sort_keys=True))
  return results
