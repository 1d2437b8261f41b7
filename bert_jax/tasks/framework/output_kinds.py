r"""Output kinds: what a task's head outputs mean to a user, one object per kind.

A task names its kind as an object (`Task.output_kind = output_kinds.CLASSIFICATION`), and the
tools that run on a finished model ask that object, never the kind's name:

* `bert_jax.predict` (`tasks/tools/prediction.py`): the whole-file input formats the kind reads
  besides `lines` and `jsonl` (`file_formats`; the task reads them, `Task.read_input_file`; each
  line of the others becomes an example by the task's `Task.parse_input`), and `records`: one
  JSON object per example from the head outputs of its rows (`prediction_settings`: what the
  records need from `best/`, read once per run);
* `bert_jax.export` (`tasks/tools/serving.py`): the SavedModel signature's outputs in order
  (`outputs`: name -> shape in words and meaning; `serve`: raw head outputs -> those outputs),
  whether the inputs have a choices axis (`choices`), and the Hugging Face export
  (`hf_head`, `hf_outputs`, `hf_shapes`, `hf_config`).

kind: predict's records; SavedModel outputs; transformers class
* `CLASSIFICATION`: label, probability, probabilities; logits, probabilities [B, K];
  BertForSequenceClassification
* `REGRESSION`: score; score [B]; BertForSequenceClassification (num_labels=1)
* `MULTIPLE_CHOICE`: choice, probabilities [C]; logits, probabilities [B, C];
  BertForMultipleChoice
* `TAGGING`: words, tags, entities; logits, probabilities [B, S, K]; BertForTokenClassification
* `SPAN`: answer, probability, nbest (null_odds); start_logits, end_logits [B, S];
  BertForQuestionAnswering
* `ENCODER` (a checkpoint without a task): -; sequence_output, pooled_output; BertModel
* `EMBEDDING` (a sentence-embedding model: an encoder and its pooling): -; sentence_embedding,
  sequence_output; BertModel (and sentence-transformers' modules)

What the kinds read of a task: `labels` (the names that index the logits); a tagging task's
examples have `words` and its `predict` gives one tag per word; a span task's `predict` gives
per example {"text", "nbest": [{"text", "probability"}], "null_odds", "best_non_null"} and its
`null_threshold(best/)` says when to answer "" (no answer).

A new kind is a subclass of `OutputKind` whose instance a task gives as its `output_kind`;
nothing else lists it. A built-in kind may also be given by its name (`resolve`).

Shape letters: B batch, C choices, S sequence, K labels.
"""
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

# One output of the SavedModel: its shape in words or model sizes ("batch", "length", "labels" =
# len(labels), "choices" = C, "hidden" = H) and what it means.
Output = Tuple[Sequence[str], str]


class OutputKind:
  """One output kind (see the module docstring); the built-in ones are the instances below."""
  name: str = ""
  # The SavedModel's outputs in signature order.
  outputs: Mapping[str, Output] = {}
  # The head of the Hugging Face export (`bert_jax.families.base.HEADS`: each family names its
  # transformers class, `Family.huggingface_class`, and where the pooler goes), our output names
  # -> its output's (an output not there, such as a softmax, is not part of its models), and
  # signature.json shapes that differ there (by its output name).
  hf_head: str = ""
  hf_outputs: Mapping[str, str] = {}
  hf_shapes: Mapping[str, Sequence[Any]] = {}
  has_head: bool = True          # False: an encoder alone
  choices: bool = False          # inputs [B, C, S], C = len(labels)
  # predict's input formats read whole (beside `lines` and `jsonl`): format -> (the file name
  # ending that selects it, whose models read it).
  file_formats: Mapping[str, Tuple[str, str]] = {}

  def __repr__(self) -> str:
    return f"OutputKind({self.name!r})"

  # ----------------------------------------------------------------------------- serving

  def output_names(self, params: Dict) -> Tuple[str, ...]:
    """The outputs a model with these parameters has (in signature order)."""
    del params
    return tuple(self.outputs)

  def serve(self, raw: Dict[str, Any], names: Sequence[str]) -> Dict[str, Any]:
    """The SavedModel's outputs `names` from the model's raw float32 outputs (JAX arrays)."""
    return {name: raw[name] for name in names}

  def hf_config(self, labels: Sequence[str]) -> Dict[str, Any]:
    """Fields of the transformers config.json (None: left out)."""
    del labels
    return {}

  # ----------------------------------------------------------------------------- predict

  def prediction_settings(self, task, directory: str) -> Any:
    """What `records` needs from the fine-tuned model in `directory` (best/), read once."""
    del task, directory
    return None

  def records(self, task, examples: Sequence[Any], features, outputs: Dict[str, np.ndarray],
              settings: Any) -> List[Dict]:
    """One output record per example from the head outputs of all their rows."""
    raise NotImplementedError(f"output kind {self.name!r} has no prediction records")


def softmax(logits: np.ndarray) -> np.ndarray:
  """Softmax over the last axis in float64."""
  x = np.asarray(logits, np.float64)
  x = np.exp(x - x.max(axis=-1, keepdims=True))
  return x / x.sum(axis=-1, keepdims=True)


def _logits_and_probabilities(raw: Dict[str, Any]) -> Dict[str, Any]:
  import jax
  logits = raw["logits"]                                  # [B, K], [B, C] or [B, S, K]
  return {"logits": logits, "probabilities": jax.nn.softmax(logits, axis=-1)}


class ClassificationKind(OutputKind):
  name = "classification"
  outputs = {
      "logits": (["batch", "labels"],
                 "unnormalised score of each label (index = position in labels)"),
      "probabilities": (["batch", "labels"], "softmax of logits over the labels")}
  hf_head = "sequence_classification"
  hf_outputs = {"logits": "logits"}

  def serve(self, raw, names):
    return _logits_and_probabilities(raw)

  def hf_config(self, labels):
    labels = list(labels)
    return dict(num_labels=len(labels), id2label={str(i): l for i, l in enumerate(labels)},
                label2id={l: i for i, l in enumerate(labels)},
                problem_type="single_label_classification")

  def records(self, task, examples, features, outputs, settings):
    labels = task.labels
    probs = softmax(outputs["logits"])                                        # [N, K]
    return [{"label": labels[int(p.argmax())], "probability": float(p.max()),
             "probabilities": {label: float(x) for label, x in zip(labels, p)}} for p in probs]


class RegressionKind(OutputKind):
  name = "regression"
  outputs = {"score": (["batch"], "the predicted value")}
  hf_head = "sequence_classification"
  hf_outputs = {"score": "logits"}
  hf_shapes = {"logits": ["batch", 1]}

  def serve(self, raw, names):
    return {"score": raw["logits"][..., 0]}                   # [B]

  def hf_config(self, labels):
    return dict(num_labels=1, problem_type="regression")

  def records(self, task, examples, features, outputs, settings):
    return [{"score": float(x)} for x in outputs["logits"][:, 0]]


class MultipleChoiceKind(OutputKind):
  name = "multiple_choice"
  outputs = {
      "logits": (["batch", "choices"], "score of each choice"),
      "probabilities": (["batch", "choices"], "softmax of logits over the choices")}
  hf_head = "multiple_choice"
  hf_outputs = {"logits": "logits"}
  choices = True

  def serve(self, raw, names):
    return _logits_and_probabilities(raw)

  def records(self, task, examples, features, outputs, settings):
    probs = softmax(outputs["logits"])                                        # [N, C]
    return [{"choice": int(p.argmax()), "probabilities": [float(x) for x in p]} for p in probs]


class TaggingKind(OutputKind):
  name = "tagging"
  outputs = {
      "logits": (["batch", "length", "labels"],
                 "score of each label at every token; a word's label is read at its first "
                 "WordPiece (other positions are not trained)"),
      "probabilities": (["batch", "length", "labels"],
                        "softmax of logits over the labels at every token")}
  hf_head = "token_classification"
  hf_outputs = {"logits": "logits"}

  def serve(self, raw, names):
    return _logits_and_probabilities(raw)

  def hf_config(self, labels):
    labels = list(labels)
    return dict(num_labels=len(labels), id2label={str(i): l for i, l in enumerate(labels)},
                label2id={l: i for i, l in enumerate(labels)}, problem_type=None)

  def records(self, task, examples, features, outputs, settings):
    predictions = task.predict(examples, features, outputs)
    return [{"words": e.words, "tags": list(tags), "entities": entities(e.words, tags)}
            for e, tags in zip(examples, predictions)]


class SpanKind(OutputKind):
  name = "span"
  outputs = {
      "start_logits": (["batch", "length"],
                       "score of each token as the answer's first (0 = [CLS]: no answer)"),
      "end_logits": (["batch", "length"],
                     "score of each token as the answer's last (0 = [CLS]: no answer)")}
  hf_head = "question_answering"
  hf_outputs = {"start_logits": "start_logits", "end_logits": "end_logits"}
  file_formats = {"squad_json": (".json", "SQuAD")}

  def prediction_settings(self, task, directory):
    return task.null_threshold(directory)      # None: every question has an answer

  def records(self, task, examples, features, outputs, settings):
    null_threshold = settings
    records = []
    for p in task.predict(examples, features, outputs):
      answer, nbest = p["text"], p["nbest"]
      if p["null_odds"] is not None and null_threshold is not None:
        answer = "" if p["null_odds"] > null_threshold else p["best_non_null"]
      probability = next((n["probability"] for n in nbest if n["text"] == answer), 0.0)
      record = {"answer": answer, "probability": probability,
                "nbest": [{"text": n["text"], "probability": n["probability"]} for n in nbest]}
      if p["null_odds"] is not None:
        record["null_odds"] = p["null_odds"]
      records.append(record)
    return records


class EncoderKind(OutputKind):
  """A pre-trained checkpoint exported without a head (no task, no predict)."""
  name = "encoder"
  outputs = {
      "sequence_output": (["batch", "length", "hidden"], "final hidden state of every token"),
      "pooled_output": (["batch", "hidden"],
                        "the pooler (dense + tanh) on the [CLS] hidden state")}
  hf_head = "encoder"
  hf_outputs = {"sequence_output": "last_hidden_state", "pooled_output": "pooler_output"}
  has_head = False

  def output_names(self, params):
    if "pooler" not in params["bert"]:
      return ("sequence_output",)    # a checkpoint saved without its pooler
    return tuple(self.outputs)


class EmbeddingKind(OutputKind):
  """A sentence-embedding model (`bert_jax/tasks/tools/embedding.py`): the encoder, its tokens'
  states pooled (no task, no predict)."""
  name = "embedding"
  outputs = {
      "sentence_embedding": (["batch", "hidden"],
                             "the sentence vector: the last layer pooled as signature.json's "
                             "embedding says (pooling, and unit length when normalised)"),
      "sequence_output": (["batch", "length", "hidden"], "final hidden state of every token")}
  hf_head = "encoder"
  hf_outputs = {"sequence_output": "last_hidden_state"}
  has_head = False


CLASSIFICATION = ClassificationKind()
REGRESSION = RegressionKind()
MULTIPLE_CHOICE = MultipleChoiceKind()
TAGGING = TaggingKind()
SPAN = SpanKind()
ENCODER = EncoderKind()
EMBEDDING = EmbeddingKind()

# The kinds of the project's tasks, and every built-in kind by name (a task may name one).
TASK_KINDS = (CLASSIFICATION, REGRESSION, MULTIPLE_CHOICE, TAGGING, SPAN)
BUILT_IN = {kind.name: kind for kind in TASK_KINDS + (ENCODER, EMBEDDING)}


def resolve(kind: Union[str, OutputKind, None]) -> OutputKind:
  """The kind object of a task's `output_kind` (an `OutputKind`, or a built-in kind's name)."""
  if isinstance(kind, OutputKind):
    return kind
  if isinstance(kind, str) and kind in BUILT_IN:
    return BUILT_IN[kind]
  raise ValueError(f"Unknown output kind {kind!r}: expected an output_kinds.OutputKind or the "
                   f"name of one of {sorted(BUILT_IN)}")


def whose_file_format(fmt: str) -> Optional[str]:
  """Whose models read the whole-file input format `fmt` (of a built-in kind), else None."""
  for kind in BUILT_IN.values():
    if fmt in kind.file_formats:
      return kind.file_formats[fmt][1]
  return None


# ----------------------------------------------------------------------------------- entities


def _split_tag(tag: str) -> Tuple[str, str]:
  if tag == "O":
    return "O", "_"
  prefix, _, kind = tag.partition("-")
  return prefix, kind or "_"


def _end_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
  return (prev_tag in ("E", "S") or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
          or (prev_tag not in ("O", ".") and prev_type != type_))


def _start_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
  return (tag in ("B", "S") or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
          or (tag not in ("O", ".") and prev_type != type_))


def get_entities(tags: Sequence[str]) -> List[Tuple[str, int, int]]:
  """(type, first, last) of every entity of one sentence, by conlleval's chunk rules
  (IOB1, IOB2 and IOBES all work; an I- after O or after another type starts an entity)."""
  chunks = []
  prev_tag, prev_type, begin = "O", "", 0
  for i, tag in enumerate(list(tags) + ["O"]):
    t, kind = _split_tag(tag)
    if _end_of_chunk(prev_tag, t, prev_type, kind):
      chunks.append((prev_type, begin, i - 1))
    if _start_of_chunk(prev_tag, t, prev_type, kind):
      begin = i
    prev_tag, prev_type = t, kind
  return chunks


def entities(words: Sequence[str], tags: Sequence[str]) -> List[Dict]:
  """predict's entities of a tagged sentence: {"type", "start", "end" (word indices, end
  exclusive), "text"}."""
  return [{"type": kind, "start": first, "end": last + 1, "text": " ".join(words[first:last + 1])}
          for kind, first, last in get_entities(tags)]
