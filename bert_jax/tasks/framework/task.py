r"""The task protocol: everything task-specific about fine-tuning, one class per task.

A task is a subclass of `Task`, made from the experiment config (`GlueTask(config)`), in its own
file `bert_jax/tasks/datasets/<config.task>.py` exposed as `TASK` (that file is all the registry,
`tasks.registry`, needs to find it). The fine-tuning loop, prediction, serving and the compile
report know nothing else about it. A sentence or sentence-pair classification (or regression)
task from TSV/CSV files is a `classification.ClassificationSpec` on `ClassificationTask`
(`bert_jax/tasks/framework/classification.py`; GLUE's nine tasks are such specs).

    class MrpcTask(Task):
      best_metric = "f1"                  # key of metrics() that selects the checkpoint
      output_kind = output_kinds.CLASSIFICATION   # what the head's outputs mean to a user
      labels = ("0", "1")                 # the label names that index the logits
      name = "mrpc"                       # results.json's "task"
      def read_examples(self, split): ...                       # split -> [examples]
      def make_features(self, examples, tokenizer, split): ...  # -> Features
      def make_head(self): return heads.ClassificationHead(2)
      def loss(self, outputs, batch): return heads.classification_loss(outputs, batch)
      def predict(self, examples, features, outputs): ...       # one prediction per example
      def metrics(self, examples, predictions): ...             # -> {"f1": .., "accuracy": ..}
      def write_predictions(self, workdir, split, examples, predictions): ...  # -> [paths]
      def parse_input(self, record, guid): ...    # a raw input line -> example (predict)

* `make_features` returns `Features(arrays, example_index, meta)`: `arrays` are fixed-shape numpy
  arrays with one leading row axis (the model inputs `input_ids`, `input_mask`, `segment_ids`
  [rows, S] or [rows, C, S] for multiple choice, plus the labels the loss reads);
  `example_index` [rows] says which example a row belongs to (several rows per example: SQuAD's
  windows); `meta` is anything `predict` needs and the loop never touches (token maps).
  Test splits (no labels) must still give every array `loss` would read (zeros are fine); the loop
  computes a loss only on `eval_splits`.
* `make_head()` returns a Flax module called as `head(encoder_outputs, batch, deterministic)`;
  see `bert_jax.model.heads`. Its parameters are `head/...`; they are the only ones not loaded from
  `config.init_checkpoint` (`new_params` regexes; everything else must match the checkpoint or the
  run stops with the names).
* `loss(outputs, batch)` -> (row_loss [B], row_weight [B]). `row_weight`, if not None, is a
  function giving the same weights from the batch alone (the step normalises by their global sum
  before any micro-batch runs); None: one per row.
* `predict(examples, features, outputs)` gets the head outputs of *every* row of the split, in
  row order (numpy, leading axis rows): SQuAD-style post-processing over all windows of an
  example lives there. `metrics(examples, predictions)` -> {name: float}.
* `write_predictions(workdir, split, examples, predictions)` writes the task's files for any
  eval or test split and returns their paths.
* `output_kind`: an `output_kinds.OutputKind` (CLASSIFICATION, REGRESSION, MULTIPLE_CHOICE,
  TAGGING, SPAN or a new one): predict's output records, the SavedModel's outputs and the
  transformers class of the exports come from it (`bert_jax/tasks/framework/output_kinds.py`).
* `parse_input(record, guid)`: one line of raw input for `python -m bert_jax.predict`, as
  {"columns": [tab-separated texts]} or a JSON object, -> an example `make_features` takes;
  `BadInput` says what is wrong with the line (`text_field` and `columns` check the usual cases).
  `read_input_file(path, fmt)`: the examples of a whole file in one of the kind's
  `file_formats` (SQuAD's JSON file), as (id, example).
* Length buckets (`config.length_bucket` = N > 0): each batch's token axis is cut to the
  smallest multiple of N that holds its longest row, and evaluation runs rows shortest first.
  The model inputs are cut; so are the feature arrays named in `token_features` (token axis last,
  e.g. NER's `label_ids`). Head outputs named in `token_outputs` ([rows, S, ...], e.g. span
  logits) come back padded to the features' length with `finetuning.CUT_TOKEN_OUTPUT` at the
  positions that were cut (padding: no real token is ever there).
* `output_hidden_states=True` passes all layers to the head (`hidden_states` [L+1, B, S, H]);
  `freeze_encoder=True` trains the head only (the feature-based approach, spec section 5.3): the
  encoder runs without dropout and gets no gradient or update.
"""
import abc
import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from bert_jax.tasks.framework import output_kinds

MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids")


@dataclasses.dataclass
class Features:
  """Fixed-shape arrays of one split (leading axis: rows) and what predict() needs besides."""
  arrays: Dict[str, np.ndarray]
  example_index: np.ndarray          # [rows] int: the example each row was made from
  meta: Any = None                   # task-specific (e.g. SQuAD token -> word maps); loop ignores

  def __post_init__(self):
    rows = {k: v.shape[0] for k, v in self.arrays.items()}
    if len(set(rows.values()) | {len(self.example_index)}) != 1:
      raise ValueError(f"Features: arrays disagree on the number of rows: {rows}, "
                       f"example_index has {len(self.example_index)}")
    for name in MODEL_INPUTS:
      if name not in self.arrays:
        raise ValueError(f"Features: missing model input {name!r} (have {sorted(self.arrays)})")

  @property
  def num_rows(self) -> int:
    return len(self.example_index)


class BadInput(ValueError):
  """One input line that cannot become an example (the message says why)."""


class Task(abc.ABC):
  """Everything task-specific about fine-tuning; see the module docstring."""
  name: str = ""
  best_metric: str = ""
  eval_splits: Tuple[str, ...] = ("dev",)
  test_splits: Tuple[str, ...] = ()
  train_split: str = "train"
  higher_is_better: bool = True
  output_hidden_states: bool = False
  freeze_encoder: bool = False
  new_params: Tuple[str, ...] = (r"head/.*",)
  row_weight: Optional[Callable[[Dict], Any]] = None
  token_features: Tuple[str, ...] = ()
  token_outputs: Tuple[str, ...] = ()
  # What the head's outputs mean to a user (`bert_jax.predict`, `bert_jax.export`): an
  # `output_kinds.OutputKind` (a built-in one may be given by name), the label names that index
  # the logits, and how text becomes the inputs.
  output_kind: Optional[output_kinds.OutputKind] = None
  labels: Tuple[str, ...] = ()
  input_format: str = ""

  def __new__(cls, *args, **kwargs):
    del args, kwargs
    if cls is Task:
      raise TypeError("Task is the protocol a task class implements (class MyTask(Task), see "
                      "bert_jax.tasks.framework.task); a task made of plain functions, as "
                      "Task(name=..., read_examples=...) was, is FunctionTask(...)")
    return super().__new__(cls)

  def __init__(self, config=None):
    self.config = config

  @abc.abstractmethod
  def read_examples(self, split: str) -> Sequence[Any]:
    """The examples of a split (any objects)."""

  def shape_examples(self) -> Sequence[Any]:
    """A few training examples whose features have every shape a step takes, for compiling the
    step without the task's data (`--compile_for`): by default the first 4 of the training
    split; a task whose data may be absent makes its own."""
    return list(self.read_examples(self.train_split))[:4]

  @abc.abstractmethod
  def make_features(self, examples: Sequence[Any], tokenizer, split: str) -> Features:
    """The model's inputs (and the labels its loss reads) for these examples."""

  @abc.abstractmethod
  def make_head(self):
    """A fresh head: a Flax module called as head(encoder_outputs, batch, deterministic)."""

  @abc.abstractmethod
  def loss(self, outputs: Dict, batch: Dict):
    """(row_loss [B], row_weight [B]) of the head's outputs on a batch."""

  @abc.abstractmethod
  def predict(self, examples: Sequence[Any], features: Features,
              outputs: Dict[str, np.ndarray]) -> List[Any]:
    """One prediction per example from the head outputs of every row of the split."""

  @abc.abstractmethod
  def metrics(self, examples: Sequence[Any], predictions: List[Any]) -> Dict[str, float]:
    """The task's metrics of the predictions."""

  @abc.abstractmethod
  def write_predictions(self, workdir: str, split: str, examples: Sequence[Any],
                        predictions: List[Any]) -> List[str]:
    """The task's prediction files of a split; returns their paths."""

  def parse_input(self, record: Dict, guid: str) -> Any:
    """A raw input record ({"columns": [...]} or a JSON object) -> an example."""
    del record, guid
    raise NotImplementedError(f"Task {self.name} does not read raw input")

  def read_input_file(self, path: str, fmt: str) -> Iterable[Tuple[str, Any]]:
    """(id, example) of every example of a whole input file in `fmt`, one of the
    `file_formats` of the task's output kind (`squad_json`)."""
    del path
    raise NotImplementedError(f"Task {self.name} does not read {fmt} files")

  def null_threshold(self, directory: str) -> Optional[float]:
    """Span tasks that may answer "no answer": the threshold on the null odds a fine-tuned
    model in `directory` (best/) predicts with; None: every question has an answer."""
    del directory
    return None

  def signature_notes(self, directory: str) -> Dict[str, Any]:
    """What else a serving user needs to know of this task (signature.json), from the config
    and the fine-tuned model in `directory`."""
    del directory
    return {}


class FunctionTask(Task):
  """A task made of plain functions, one per abstract method of `Task`; keyword arguments set
  any other attribute `Task` declares (`eval_splits=("dev", "test")`, `output_kind=...`)."""

  def __init__(self, name: str, read_examples: Callable, make_features: Callable,
               make_head: Callable, loss: Callable, predict: Callable, metrics: Callable,
               write_predictions: Callable, best_metric: str, config=None, **attributes):
    super().__init__(config)
    # Task's annotations are the one list of its attributes, so they are not repeated here.
    unknown = sorted(set(attributes) - set(Task.__annotations__))
    if unknown:
      raise TypeError(f"FunctionTask: {unknown} are not attributes of Task (expected some of "
                      f"{sorted(Task.__annotations__)})")
    # Set on the instance, each function shadows the abstract method of the same name.
    vars(self).update(attributes, name=name, read_examples=read_examples,
                      make_features=make_features, make_head=make_head, loss=loss,
                      predict=predict, metrics=metrics, write_predictions=write_predictions,
                      best_metric=best_metric)


# Its functions are given to each instance, so no method is left to a subclass.
FunctionTask.__abstractmethods__ = frozenset()


# ----------------------------------------------------------------------------------- raw input


def text_field(record: Dict, *keys: str) -> str:
  """The first of `keys` in a JSON record: a non-empty string, else BadInput."""
  for key in keys:
    if key in record:
      if not isinstance(record[key], str):
        raise BadInput(f'"{key}" must be a string')
      if not record[key].strip():
        raise BadInput(f'"{key}" is empty')
      return record[key]
  raise BadInput("missing " + " or ".join(f'"{k}"' for k in keys))


def columns(record: Dict, names: Sequence[str]) -> List[str]:
  """The record's tab-separated columns, exactly len(names) of them, none empty."""
  values = record["columns"]
  if len(names) == 1:   # a single text: tabs are just whitespace in it
    values = ["\t".join(values)]
  if len(values) != len(names):
    raise BadInput(f"expected {len(names)} tab-separated columns ({', '.join(names)}), "
                   f"got {len(values)}")
  for name, value in zip(names, values):
    if not value.strip():
      raise BadInput(f"{name} is empty")
  return values
