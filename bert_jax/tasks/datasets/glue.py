"""GLUE: the nine tasks as specs of the classification base (`GlueSpec`, a
`framework.classification.ClassificationSpec`) run by one task class, `GlueTask`
(`config.task=glue`), with official metrics and leaderboard submission files.

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
from typing import Dict, List, Optional, Sequence, Tuple

import ml_collections
import numpy as np

from bert_jax.io import filesystem
from bert_jax.tasks.framework import classification, finetuning
from bert_jax.tasks.framework.classification import ClassificationSpec
from bert_jax.runtime import config_names

# GLUE's examples and data errors are those of every classification task.
GlueExample = classification.TextExample
GlueDataError = classification.DataError


@dataclasses.dataclass(frozen=True)
class GlueSpec(ClassificationSpec):
  """A GLUE task: its `ClassificationSpec` (files in `folder`), TFDS names and leaderboard files."""
  folder: str = ""
  tfds_text: Tuple[str, Optional[str]] = ("", None)    # the TFDS features of text_a, text_b
  submissions: Tuple[Tuple[str, str], ...] = ()         # (split, leaderboard file name)
  tfds_splits: Tuple[Tuple[str, str, str], ...] = ()   # (our split, tfds config, tfds split)


_PAIR = ("sentence1", "sentence2")
_NLI_LABELS = ("entailment", "not_entailment")


def _tfds_default(name):
  return (("train", name, "train"), ("dev", name, "validation"), ("test", name, "test"))


GLUE_TASKS: Dict[str, GlueSpec] = {s.name: s for s in [
    GlueSpec(name="cola", folder="CoLA", labels=("0", "1"), metrics=("matthews_corr",),
             columns=(3, None, 1), test_columns=("index", "sentence", None),
             tfds_text=("sentence", None), labelled_header=False,
             submissions=(("test", "CoLA.tsv"),), tfds_splits=_tfds_default("cola")),
    GlueSpec(name="sst2", folder="SST-2", labels=("0", "1"), metrics=("accuracy",),
             columns=("sentence", None, "label"), test_columns=("index", "sentence", None),
             tfds_text=("sentence", None),
             submissions=(("test", "SST-2.tsv"),), tfds_splits=_tfds_default("sst2")),
    GlueSpec(name="mrpc", folder="MRPC", labels=("0", "1"), metrics=("f1", "accuracy"),
             columns=("#1 String", "#2 String", "Quality"),
             test_columns=("index", "#1 String", "#2 String"), tfds_text=_PAIR,
             submissions=(("test", "MRPC.tsv"),), tfds_splits=_tfds_default("mrpc")),
    GlueSpec(name="stsb", folder="STS-B", labels=(), metrics=("pearson", "spearman"),
             columns=_PAIR + ("score",), test_columns=("index",) + _PAIR, tfds_text=_PAIR,
             score_range=(0.0, 5.0),
             submissions=(("test", "STS-B.tsv"),), tfds_splits=_tfds_default("stsb")),
    GlueSpec(name="qqp", folder="QQP", labels=("0", "1"), metrics=("f1", "accuracy"),
             columns=("question1", "question2", "is_duplicate"),
             test_columns=("id", "question1", "question2"),
             tfds_text=("question1", "question2"), skip_malformed=True,
             submissions=(("test", "QQP.tsv"),), tfds_splits=_tfds_default("qqp")),
    GlueSpec(name="mnli", folder="MNLI", labels=("contradiction", "entailment", "neutral"),
             metrics=("accuracy",), columns=_PAIR + ("gold_label",),
             test_columns=("index",) + _PAIR, tfds_text=("premise", "hypothesis"),
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
    GlueSpec(name="qnli", folder="QNLI", labels=_NLI_LABELS, metrics=("accuracy",),
             columns=("question", "sentence", "label"),
             test_columns=("index", "question", "sentence"), tfds_text=("question", "sentence"),
             submissions=(("test", "QNLI.tsv"),), tfds_splits=_tfds_default("qnli")),
    GlueSpec(name="rte", folder="RTE", labels=_NLI_LABELS, metrics=("accuracy",),
             columns=_PAIR + ("label",), test_columns=("index",) + _PAIR, tfds_text=_PAIR,
             submissions=(("test", "RTE.tsv"),), tfds_splits=_tfds_default("rte")),
    GlueSpec(name="wnli", folder="WNLI", labels=("0", "1"), metrics=("accuracy",),
             columns=_PAIR + ("label",), test_columns=("index",) + _PAIR, tfds_text=_PAIR,
             submissions=(("test", "WNLI.tsv"),), tfds_splits=_tfds_default("wnli")),
]}

# The diagnostic set's columns (predicted with the MNLI model).
_AX_COLUMNS = ("index",) + _PAIR


def spec_for(name: str) -> GlueSpec:
  """The `GlueSpec` of a GLUE task by name (`sst2`, `SST-2`, `mnli`, ...: case and hyphens
  ignored): its folder, columns, labels and metrics; an unknown name is a ValueError naming the
  tasks."""
  key = name.lower().replace("-", "")
  if key not in GLUE_TASKS:
    raise ValueError(f"Unknown GLUE task {name!r}; expected one of {sorted(GLUE_TASKS)}")
  return GLUE_TASKS[key]


# ----------------------------------------------------------------------------------- readers


def read_tsv(spec: GlueSpec, path: str, labelled: bool) -> List[GlueExample]:
  """Examples of one official GLUE TSV file; every row is checked (see the module docstring)."""
  if not filesystem.exists(path):
    raise FileNotFoundError(f"GLUE file not found: {path} (is --config.data.glue_dir the folder "
                            f"the GLUE download script wrote, with {spec.folder}/ inside?)")
  wanted = _AX_COLUMNS if not labelled and filesystem.basename(path) == "diagnostic.tsv" else None
  examples, skipped = classification.read_table(spec, path, labelled, wanted)
  classification.report_skipped(path, skipped, f"known in the official {spec.folder} files")
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


# The official metrics of a task (fractions): its spec's, as for every classification task.
compute_metrics = classification.compute_metrics


def task_score(metrics: Dict[str, float], spec: GlueSpec) -> float:
  """The leaderboard's per-task score: the mean of the task's metrics (x100)."""
  return 100.0 * float(np.mean([metrics[m] for m in spec.metrics]))


# ----------------------------------------------------------------------------------- files


def prediction_file(spec: GlueSpec, split: str) -> Tuple[str, bool]:
  """(file name, with the label column) of a split's predictions: a test split's leaderboard
  file, else `<split>_predictions.tsv` with labels."""
  submissions = dict(spec.submissions)
  if split in submissions:
    return submissions[split], False
  return f"{split}_predictions.tsv", True


def write_predictions(spec: GlueSpec, workdir: str, split: str, examples: Sequence[GlueExample],
                      predictions: Sequence) -> List[str]:
  """Dev splits: `<split>_predictions.tsv` with labels; test splits: the leaderboard file."""
  name, with_labels = prediction_file(spec, split)
  return [classification.write_table(spec, filesystem.join(workdir, name), examples,
                                     predictions, with_labels)]


# ----------------------------------------------------------------------------------- the task


class GlueTask(classification.ClassificationTask):
  """The GLUE task `config.data.glue_task` (config: experiments/glue.py): its spec, its data
  from the official folder layout or TFDS, its leaderboard files."""

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config, spec_for(config.data.glue_task))
    self.input_format = ("[CLS] A [SEP] B [SEP]" if self.spec.is_regression else
                         "one sentence: [CLS] A [SEP]; a pair: [CLS] A [SEP] B [SEP]")

  def read_examples(self, split):
    return read_examples(self.spec, self.config.data, split)

  def prediction_file(self, split):
    return prediction_file(self.spec, split)


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
