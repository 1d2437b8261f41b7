"""Predictions of a fine-tuned model (`WORKDIR/best/`) on raw input, streamed.

Input, one example per line (`lines`: plain text or TSV, the columns tab-separated) or one JSON
object per line (`jsonl`); or a whole file in a format of the model's output kind
(`OutputKind.file_formats`, read by the task's `Task.read_input_file`): for SQuAD the official
JSON file (`squad_json`, read whole: JSON does not stream). What a line holds depends on the task
the model was fine-tuned on (its `Task.parse_input`):

| task | `lines` | `jsonl` |
|---|---|---|
| GLUE, one sentence (SST-2, CoLA) | the sentence | `{"text": ...}` |
| GLUE, a pair (MRPC, STS-B, MNLI, ...) | `text_a<TAB>text_b` | `{"text_a": ..., "text_b": ...}` |
| NER | the sentence (words split at whitespace) | `{"words": [...]}` or `{"text": ...}` |
| SQuAD | `question<TAB>context` | `{"id": ..., "question": ..., "context": ...}` |
| SWAG | `context<TAB>ending0<TAB>...<TAB>ending3` | `{"context": ..., "endings": [4 strings]}` |

A JSON object's `"id"`, if any, is copied to its output line.

Output: one JSON line per example that could be read, in input order, with `"line"` (1-based
line number in the input; the question's index for `squad_json`) and the records of the task's
output kind (`OutputKind.records`, bert_jax/tasks/framework/output_kinds.py):
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
from typing import Any, Callable, Dict, Iterator, List, Tuple

from bert_jax import parallel
from bert_jax.io import filesystem
from bert_jax.parallel import sharding
from bert_jax.tasks.framework import finetuning, output_kinds
from bert_jax.tasks.framework.task import BadInput
from bert_jax.tasks.tools import fine_tuned

LINE_FORMATS = ("lines", "jsonl")   # one example per line, for every task
# With the whole-file formats of the built-in output kinds (squad_json).
FORMATS = LINE_FORMATS + tuple(fmt for kind in output_kinds.BUILT_IN.values()
                               for fmt in kind.file_formats)
MAX_REPORTED = 20   # bad lines printed one by one; beyond that only counted


# ----------------------------------------------------------------------------------- reading


def detect_format(path: str, kind) -> str:
  """The input format of `path` for a model of output `kind` (an OutputKind or its name): by the
  name's ending, `lines` when nothing else matches."""
  if path.endswith((".jsonl", ".ndjson")):
    return "jsonl"
  for fmt, (ending, _) in output_kinds.resolve(kind).file_formats.items():
    if path.endswith(ending):
      return fmt
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


@dataclasses.dataclass
class Counts:
  lines: int = 0          # examples offered (non-blank lines, or questions of a SQuAD file)
  predicted: int = 0
  bad: int = 0


def read_examples(path: str, fmt: str, task, counts: Counts,
                  report: Callable[[str], None]) -> Iterator[Tuple[Dict, Any]]:
  """(output fields, example) for every readable example of `path`, streamed; bad lines are
  reported as `path:line: why` and counted. Blank lines are not examples (not counted)."""
  if fmt not in LINE_FORMATS:   # a whole file in a format of the task's output kind
    for index, (example_id, example) in enumerate(task.read_input_file(path, fmt)):
      counts.lines += 1
      yield {"line": index + 1, "id": example_id}, example
    return
  make_example = task.parse_input
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


# ----------------------------------------------------------------------------------- the run


def predict_file(model: fine_tuned.FineTuned, input_path: str, output_path: str,
                 fmt: str = "", batch_size: int = 32, chunk_size: int = 1024,
                 length_bucket: int = 16, progress: bool = True,
                 report: Callable[[str], None] = None) -> Counts:
  """Writes one JSON line per readable example of `input_path` to `output_path`."""
  if not filesystem.exists(input_path):
    raise FileNotFoundError(f"Input file not found: {input_path}")
  kind = model.output_kind
  fmt = fmt or detect_format(input_path, kind)
  if fmt not in LINE_FORMATS and fmt not in kind.file_formats:
    whose = output_kinds.whose_file_format(fmt)
    if whose is None:
      raise ValueError(f"format {fmt!r}: expected one of {FORMATS}")
    raise ValueError(f"format {fmt} is for {whose} models; {model.directory} is "
                     f"{model.task.name}")
  if fmt in LINE_FORMATS and not _has_a_line(input_path):   # a whole file is checked whole
    raise ValueError(f"{input_path}: no examples (the file is empty or holds only blank "
                     "lines)")
  report = report or (lambda message: print(message, file=sys.stderr, flush=True))
  counts = Counts()
  par = parallel.create(model.config)
  predictor = finetuning.Predictor(model.model, model.task, batch_size, par.mesh,
                                   length_bucket=length_bucket)
  params = sharding.place(model.params, sharding.replicated(par.mesh))   # once, not per chunk
  settings = kind.prediction_settings(model.task, model.directory)   # read once
  bar = _progress_bar(input_path, fmt, progress)
  with filesystem.open(output_path, "w") as out:
    for chunk in _chunks(read_examples(input_path, fmt, model.task, counts, report),
                         chunk_size):
      fields = [f for f, _ in chunk]
      examples = [e for _, e in chunk]
      features = model.task.make_features(examples, model.tokenizer, "predict")
      outputs, _ = predictor(params, features, with_loss=False)
      for f, record in zip(fields, kind.records(model.task, examples, features, outputs,
                                                settings)):
        out.write(json.dumps(dict(f, **record), ensure_ascii=False) + "\n")
      counts.predicted += len(chunk)
      bar.update(len(chunk))
  bar.close()
  return counts


def _has_a_line(path: str) -> bool:
  """Whether `path` holds a non-blank line (read up to the first one)."""
  with filesystem.open(path, "rb") as f:
    return any(line.strip() for line in f)


def _progress_bar(path: str, fmt: str, enabled: bool):
  """Examples done, against the input's line count when it is cheap to know (a local file)."""
  import tqdm
  total = None
  if enabled and fmt in LINE_FORMATS and not filesystem.is_url(path):
    with open(path, "rb") as f:
      total = sum(1 for line in f if line.strip())
  return tqdm.tqdm(total=total, unit=" examples", disable=not enabled, file=sys.stderr,
                   mininterval=1.0)
