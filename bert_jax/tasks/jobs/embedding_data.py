"""The training pairs of the embedding job: a JSON-lines file read and checked, the demo pairs,
and the token arrays the step reads.

One line per training row:

    {"query": "how do I sort a list", "positive": "sorted(iterable) returns a new sorted list"}
    {"query": "...", "positive": "...", "negative": "a hard negative"}
    {"query": "...", "positive": "...", "negative": ["hard negative 1", "hard negative 2"]}

`query` and `positive` are non-empty strings; `negative` is optional, a non-empty string or a
list of them. Anything else (not JSON, not an object, another key, another type, an empty text)
is an error naming the file and the line (`BadPairsLine`); blank lines are skipped.

Without a file (`config.data.train_file` empty) the job trains on demo pairs from Python's
own documentation (`demo_pairs`: each sentence and the one after it, a sentence of another
document as the hard negative), written once into WORKDIR/data: no download.

Shapes: N rows, K hard negatives per row, Sq query tokens, Sd document tokens.
"""
import dataclasses
import json
from typing import Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from bert_jax.io import filesystem
from bert_jax.runtime import outputs
from bert_jax.text import pairs as text_pairs

KEYS = ("query", "positive", "negative")
DEMO_FILE = "demo_pairs.jsonl"


class BadPairsLine(ValueError):
  """A line of a pairs file that is not a training row; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class Pair:
  query: str
  positive: str
  negatives: Tuple[str, ...] = ()


def _text(value, path: str, number: int, field: str) -> str:
  if not isinstance(value, str) or not value.strip():
    raise BadPairsLine(f"{path}, line {number}: \"{field}\" must be a non-empty string, got "
                       f"{json.dumps(value)[:80]}")
  return value


def parse_line(line: str, path: str, number: int) -> Pair:
  """One JSON line -> a `Pair`; `BadPairsLine` naming `path` and line `number` otherwise."""
  try:
    row = json.loads(line)
  except json.JSONDecodeError as e:
    raise BadPairsLine(f"{path}, line {number}: not JSON ({e.msg} at column {e.colno})") from None
  if not isinstance(row, dict):
    raise BadPairsLine(f"{path}, line {number}: expected an object with \"query\" and "
                       f"\"positive\", got {type(row).__name__}")
  unknown = sorted(set(row) - set(KEYS))
  if unknown:
    raise BadPairsLine(f"{path}, line {number}: unknown key(s) {unknown}; a row has \"query\", "
                       "\"positive\" and optionally \"negative\" (a string or a list of strings)")
  for field in ("query", "positive"):
    if field not in row:
      raise BadPairsLine(f"{path}, line {number}: \"{field}\" is missing")
  negatives = row.get("negative", [])
  if isinstance(negatives, str):
    negatives = [negatives]
  if not isinstance(negatives, list):
    raise BadPairsLine(f"{path}, line {number}: \"negative\" must be a string or a list of "
                       f"strings, got {type(negatives).__name__}")
  return Pair(_text(row["query"], path, number, "query"),
              _text(row["positive"], path, number, "positive"),
              tuple(_text(n, path, number, "negative") for n in negatives))


def read_pairs(path: str, limit: int = 0) -> List[Pair]:
  """Every row of a JSON-lines pairs file (the first `limit` when > 0), each line checked."""
  rows: List[Pair] = []
  with filesystem.open(path) as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      rows.append(parse_line(line, path, number))
      if limit and len(rows) >= limit:
        break
  if not rows:
    raise ValueError(f"{path}: no training rows (one JSON object per line: \"query\", "
                     "\"positive\", optionally \"negative\")")
  return rows


def demo_pairs(max_documents: int = 0) -> List[Pair]:
  """Pairs from the demo corpus (Python's documentation): each sentence as the query, the next
  sentence of its document as the positive, the sentence at the same place in the next
  document (or its first) as a hard negative. Deterministic."""
  from data_pipelines import demo_corpus
  documents = list(demo_corpus.documents(max_documents))
  rows = []
  for d, sentences in enumerate(documents):
    other = documents[(d + 1) % len(documents)]
    for i in range(len(sentences) - 1):
      rows.append(Pair(sentences[i], sentences[i + 1], (other[min(i, len(other) - 1)],)))
  return rows


def write_pairs(path: str, rows: Sequence[Pair]) -> None:
  """`rows` as a pairs file (written whole, then renamed into place)."""
  lines = [json.dumps({"query": r.query, "positive": r.positive,
                       **({"negative": list(r.negatives)} if r.negatives else {})})
           for r in rows]
  filesystem.write_text(path, "\n".join(lines) + "\n")


def training_file(config, workdir: str) -> str:
  """`config.data.train_file`, or the demo pairs written into WORKDIR/data once."""
  if config.data.train_file:
    return config.data.train_file
  path = filesystem.join(workdir, "data", DEMO_FILE)
  if outputs.is_writer() and not filesystem.exists(path):
    filesystem.makedirs(filesystem.dirname(path))
    write_pairs(path, demo_pairs(config.data.demo_max_documents))
  if jax.process_count() > 1:   # the others read it once process 0 has written it
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("demo pairs written")
  return path


def negatives_per_row(config, rows: Optional[Sequence[Pair]]) -> int:
  """K: `config.data.num_negatives`, or (-1) the most hard negatives any row has (0 without
  rows: the shapes of a compile, which reads no data)."""
  asked = config.data.num_negatives
  if asked >= 0:
    return asked
  return max((len(r.negatives) for r in rows), default=0) if rows else 0


def encode(tokenizer, rows: Sequence[Pair], max_query_length: int, max_seq_length: int,
           num_negatives: int) -> Dict[str, np.ndarray]:
  """Token arrays of `rows`: query_ids / query_mask [N, Sq]; document_ids / document_mask
  [N, 1 + K, Sd] (the positive, then the hard negatives); negative_mask [N, K] (1: a real
  negative; a row with fewer than K has empty slots, a row with more keeps its first K).
  Each text is one `[CLS] text [SEP]` sequence, cut to its length."""
  n, k = len(rows), num_negatives
  queries = text_pairs.encode_pairs(tokenizer, [r.query for r in rows], None, max_query_length)
  negatives = [list(r.negatives[:k]) + [""] * (k - len(r.negatives[:k])) for r in rows]
  texts = [t for r, extra in zip(rows, negatives) for t in [r.positive] + extra]
  documents = text_pairs.encode_pairs(tokenizer, texts, None, max_seq_length)
  counts = np.array([min(len(r.negatives), k) for r in rows], np.int64)        # [N]
  negative_mask = (np.arange(k)[None, :] < counts[:, None]).astype(np.float32)  # [N, K]
  shape = (n, 1 + k, max_seq_length)
  return {"query_ids": queries["input_ids"], "query_mask": queries["input_mask"],
          "document_ids": documents["input_ids"].reshape(shape),
          "document_mask": documents["input_mask"].reshape(shape),
          "negative_mask": negative_mask}


def shape_arrays(rows: int, max_query_length: int, max_seq_length: int,
                 num_negatives: int) -> Dict[str, np.ndarray]:
  """Arrays of `encode`'s shapes and types for `rows` rows, every token real (what a compile
  and a model's initialisation need; nothing is read)."""
  k = num_negatives
  return {"query_ids": np.zeros((rows, max_query_length), np.int32),
          "query_mask": np.ones((rows, max_query_length), np.int32),
          "document_ids": np.zeros((rows, 1 + k, max_seq_length), np.int32),
          "document_mask": np.ones((rows, 1 + k, max_seq_length), np.int32),
          "negative_mask": np.ones((rows, k), np.float32)}
