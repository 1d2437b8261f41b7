"""Predictions of a fine-tuned model (`WORKDIR/best/`) on raw input, streamed.

Input, one example per line (`lines`: plain text or TSV, the columns tab-separated) or one JSON
object per line (`jsonl`); for SQuAD also the official JSON file (`squad_json`, read whole: JSON
does not stream). What a line holds depends on the task the model was fine-tuned on:

| task | `lines` | `jsonl` |
|---|---|---|
| GLUE, one sentence (SST-2, CoLA) | the sentence | `{"text": ...}` |
| GLUE, a pair (MRPC, STS-B, MNLI, ...) | `text_a<TAB>text_b` | `{"text_a": ..., "text_b": ...}` |
| NER | the sentence (words split at whitespace) | `{"words": [...]}` or `{"text": ...}` |
| SQuAD | `question<TAB>context` | `{"id": ..., "question": ..., "context": ...}` |
| SWAG | `context<TAB>ending0<TAB>...<TAB>ending3` | `{"context": ..., "endings": [4 strings]}` |

A JSON object's `"id"`, if any, is copied to its output line.

Output: one JSON line per example that could be read, in input order, with `"line"` (1-based
line number in the input; the question's index for `squad_json`) and:
- classification: `"label"`, `"probability"` (of that label), `"probabilities"` {label: p}
- regression: `"score"`
- multiple choice: `"choice"` (0-3), `"probabilities"` [4]
- tagging: `"words"`, `"tags"` (one per word), `"entities"` [{"type", "start", "end" (word
  indices, end exclusive), "text"}]
- span: `"answer"` (text of the context, "" = no answer for SQuAD v2.0 models), `"probability"`,
  `"nbest"` [{"text", "probability"}]; v2.0 models also `"null_odds"` (the run's tuned threshold
  from best/ decides "no answer").
A line that cannot be read is reported (`file:line: why`), counted and skipped.

Examples are processed in chunks of `chunk_size` (memory does not grow with the input), each
chunk's rows batched shortest first with length buckets.
"""
import dataclasses
import json
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from bert_jax import parallel
from bert_jax.io import filesystem
from bert_jax.parallel import sharding
from bert_jax.tasks import fine_tuned, finetuning

FORMATS = ("lines", "jsonl", "squad_json")
MAX_REPORTED = 20   # bad lines printed one by one; beyond that only counted


class BadInput(ValueError):
  """One input line that cannot become an example (the message says why)."""


# ----------------------------------------------------------------------------------- reading


def detect_format(path: str, kind: str) -> str:
  if path.endswith((".jsonl", ".ndjson")):
    return "jsonl"
  if path.endswith(".json") and kind == "span":
    return "squad_json"
  return "lines"


def _record(line: str, fmt: str):
  """A line as a record: {"columns": [...]} for `lines`, the parsed object for `jsonl`."""
  if fmt == "lines":
    return {"columns": line.split("\t")}
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    raise BadInput(f"not JSON ({e.msg} at column {e.colno})") from None
  if not isinstance(record, dict):
    raise BadInput(f"expected a JSON object, got {type(record).__name__}")
  return record


def _text(record: Dict, *keys: str) -> str:
  for key in keys:
    if key in record:
      if not isinstance(record[key], str):
        raise BadInput(f'"{key}" must be a string')
      if not record[key].strip():
        raise BadInput(f'"{key}" is empty')
      return record[key]
  raise BadInput("missing " + " or ".join(f'"{k}"' for k in keys))


def _columns(record: Dict, names: Sequence[str]) -> List[str]:
  """The record's tab-separated columns, exactly len(names) of them, none empty."""
  columns = record["columns"]
  if len(names) == 1:   # a single text: tabs are just whitespace in it
    columns = ["\t".join(columns)]
  if len(columns) != len(names):
    raise BadInput(f"expected {len(names)} tab-separated columns ({', '.join(names)}), "
                   f"got {len(columns)}")
  for name, value in zip(names, columns):
    if not value.strip():
      raise BadInput(f"{name} is empty")
  return columns


def _glue_example(config) -> Callable[[Dict, str], Any]:
  from bert_jax.tasks import glue
  spec = glue.spec_for(config.data.glue_task)
  is_pair = spec.columns[1] is not None

  def make(record, guid):
    if "columns" in record:
      texts = _columns(record, ("text_a", "text_b") if is_pair else ("text",))
      text_a, text_b = texts[0], (texts[1] if is_pair else None)
    else:
      text_a = _text(record, "text_a", "text")
      text_b = _text(record, "text_b") if is_pair else None
    return glue.GlueExample(guid, text_a, text_b, None)
  return make


def _ner_example(config) -> Callable[[Dict, str], Any]:
  from bert_jax.tasks import ner
  del config

  def make(record, guid):
    del guid
    if "columns" in record:
      words = " ".join(record["columns"]).split()
    elif "words" in record:
      words = record["words"]
      if not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words):
        raise BadInput('"words" must be a list of non-empty strings')
    else:
      words = _text(record, "text").split()
    if not words:
      raise BadInput("no words")
    return ner.Sentence(list(words), ["O"] * len(words), document=0)
  return make


def _squad_example(config) -> Callable[[Dict, str], Any]:
  from bert_jax.tasks import squad
  del config

  def make(record, guid):
    if "columns" in record:
      question, context = _columns(record, ("question", "context"))
    else:
      question, context = _text(record, "question"), _text(record, "context")
    return squad.SquadExample(str(record.get("id", guid)), question, context, [])
  return make


def _swag_example(config) -> Callable[[Dict, str], Any]:
  from bert_jax.tasks import swag
  del config

  def make(record, guid):
    if "columns" in record:
      context, *endings = _columns(record, ("context",) + tuple(
          f"ending{i}" for i in range(swag.NUM_CHOICES)))
      start = ""
    else:
      context = _text(record, "context")
      endings = record.get("endings")
      if (not isinstance(endings, list) or len(endings) != swag.NUM_CHOICES
          or not all(isinstance(e, str) for e in endings)):
        raise BadInput(f'"endings" must be a list of {swag.NUM_CHOICES} strings')
      start = record.get("start_ending", "")
    return swag.SwagExample(guid, context, start, list(endings), None)
  return make


# config.task -> (config -> make_example(record, guid)).
EXAMPLE_MAKERS = {"glue": _glue_example, "ner": _ner_example, "squad": _squad_example,
                  "swag": _swag_example}


@dataclasses.dataclass
class Counts:
  lines: int = 0          # examples offered (non-blank lines, or questions of a SQuAD file)
  predicted: int = 0
  bad: int = 0


def read_examples(path: str, fmt: str, make_example, counts: Counts,
                  report: Callable[[str], None]) -> Iterator[Tuple[Dict, Any]]:
  """(output fields, example) for every readable example of `path`, streamed; bad lines are
  reported as `path:line: why` and counted. Blank lines are not examples (not counted)."""
  if fmt == "squad_json":
    from bert_jax.tasks import squad
    for index, example in enumerate(squad.read_squad_json(path, is_training=False)):
      counts.lines += 1
      yield {"line": index + 1, "id": example.qas_id}, example
    return
  with filesystem.open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8").rstrip("\r\n")
      except UnicodeDecodeError as e:
        line, error = None, f"not UTF-8 (byte {e.start + 1})"
      if line is not None and not line.strip():
        continue
      counts.lines += 1
      try:
        if line is None:
          raise BadInput(error)
        record = _record(line, fmt)
        fields = {"line": number}
        if "id" in record:
          fields["id"] = record["id"]
        yield fields, make_example(record, str(record.get("id", number)))
      except BadInput as e:
        counts.bad += 1
        if counts.bad <= MAX_REPORTED:
          report(f"{path}:{number}: {e}")
        elif counts.bad == MAX_REPORTED + 1:
          report(f"{path}: more bad lines; only their count is reported from here on")


def _chunks(items: Iterator, size: int) -> Iterator[List]:
  chunk = []
  for item in items:
    chunk.append(item)
    if len(chunk) == size:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


# ----------------------------------------------------------------------------------- outputs


def _softmax(logits: np.ndarray) -> np.ndarray:
  x = np.asarray(logits, np.float64)
  x = np.exp(x - x.max(axis=-1, keepdims=True))
  return x / x.sum(axis=-1, keepdims=True)


def _entities(words: Sequence[str], tags: Sequence[str]) -> List[Dict]:
  from bert_jax.tasks import ner
  return [{"type": kind, "start": first, "end": last + 1, "text": " ".join(words[first:last + 1])}
          for kind, first, last in ner.get_entities(tags)]


def format_outputs(model: fine_tuned.FineTuned, examples: Sequence[Any],
                   features: finetuning.Features, outputs: Dict[str, np.ndarray],
                   null_threshold: Optional[float]) -> List[Dict]:
  """One output record per example (see the module docstring)."""
  kind, labels = model.kind, model.labels
  if kind == "classification":
    probs = _softmax(outputs["logits"])                                      # [N, K]
    return [{"label": labels[int(p.argmax())], "probability": float(p.max()),
             "probabilities": {label: float(x) for label, x in zip(labels, p)}} for p in probs]
  if kind == "regression":
    return [{"score": float(x)} for x in outputs["logits"][:, 0]]
  if kind == "multiple_choice":
    probs = _softmax(outputs["logits"])                                      # [N, 4]
    return [{"choice": int(p.argmax()), "probabilities": [float(x) for x in p]} for p in probs]
  predictions = model.task.predict(examples, features, outputs)
  if kind == "tagging":
    return [{"words": e.words, "tags": list(tags), "entities": _entities(e.words, tags)}
            for e, tags in zip(examples, predictions)]
  if kind == "span":
    records = []
    for p in predictions:
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
  raise ValueError(f"Unknown output kind {kind!r} (expected one of {finetuning.OUTPUT_KINDS})")


def _null_threshold(model: fine_tuned.FineTuned) -> Optional[float]:
  """SQuAD v2.0: the threshold tuned on dev and stored in best/, else the config's."""
  if model.config.task != "squad" or model.config.version != "2.0":
    return None
  from bert_jax.tasks import squad
  return squad.load_null_threshold(model.directory,
                                   default=model.config.null_score_diff_threshold)


# ----------------------------------------------------------------------------------- the run


def predict_file(model: fine_tuned.FineTuned, input_path: str, output_path: str,
                 fmt: str = "", batch_size: int = 32, chunk_size: int = 1024,
                 length_bucket: int = 16, progress: bool = True,
                 report: Callable[[str], None] = None) -> Counts:
  """Writes one JSON line per readable example of `input_path` to `output_path`."""
  if not filesystem.exists(input_path):
    raise FileNotFoundError(f"Input file not found: {input_path}")
  fmt = fmt or detect_format(input_path, model.kind)
  if fmt not in FORMATS:
    raise ValueError(f"format {fmt!r}: expected one of {FORMATS}")
  if fmt == "squad_json" and model.kind != "span":
    raise ValueError(f"format squad_json is for SQuAD models; {model.directory} is "
                     f"{model.task.name}")
  report = report or (lambda message: print(message, file=sys.stderr, flush=True))
  counts = Counts()
  make_example = EXAMPLE_MAKERS[model.config.task](model.config)
  par = parallel.create(model.config)
  predictor = finetuning.Predictor(model.model, model.task, batch_size, par.mesh,
                                   length_bucket=length_bucket)
  params = sharding.place(model.params, sharding.replicated(par.mesh))   # once, not per chunk
  null_threshold = _null_threshold(model)
  bar = _progress_bar(input_path, fmt, progress)
  with filesystem.open(output_path, "w") as out:
    for chunk in _chunks(read_examples(input_path, fmt, make_example, counts, report),
                         chunk_size):
      fields = [f for f, _ in chunk]
      examples = [e for _, e in chunk]
      features = model.task.make_features(examples, model.tokenizer, "predict")
      outputs, _ = predictor(params, features, with_loss=False)
      for f, record in zip(fields, format_outputs(model, examples, features, outputs,
                                                  null_threshold)):
        out.write(json.dumps(dict(f, **record), ensure_ascii=False) + "\n")
      counts.predicted += len(chunk)
      bar.update(len(chunk))
  bar.close()
  return counts


def _progress_bar(path: str, fmt: str, enabled: bool):
  """Examples done, against the input's line count when it is cheap to know (a local file)."""
  import tqdm
  total = None
  if enabled and fmt != "squad_json" and not filesystem.is_url(path):
    with open(path, "rb") as f:
      total = sum(1 for line in f if line.strip())
  return tqdm.tqdm(total=total, unit=" examples", disable=not enabled, file=sys.stderr,
                   mininterval=1.0)
