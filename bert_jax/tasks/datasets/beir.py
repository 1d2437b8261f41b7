r"""Retrieval in BEIR's format: a folder read and checked, and an encoder's nDCG@10, MRR@10 and
Recall@100 on it (`evaluate_beir`).

A BEIR folder (Thakur et al. 2021; every BEIR dataset, and `data_pipelines.squad_retrieval`'s):

    corpus.jsonl      {"_id": ..., "title": ..., "text": ...} per line (title may be empty)
    queries.jsonl     {"_id": ..., "text": ...} per line
    qrels/SPLIT.tsv   a header (query-id, corpus-id, score), then one judgement per line,
                      tab-separated; score an integer, > 0 relevant (the gain of nDCG)

Every line is checked: bad JSON, a missing field, a repeated id, a judgement with other than 3
fields, a score that is not an integer, or a query id that queries.jsonl lacks is a `DataError`
naming the file and line. A judged document missing from the corpus cannot be retrieved (its
count is said).

`evaluate_beir(encode_fn, beir_dir, split)` evaluates what BEIR evaluates for a
sentence-transformers model: the queries that have judgements, each embedded from its text; the
documents embedded from `title + " " + text` (stripped: BEIR's `SentenceBERT` joins them so); the
top 100 documents of each query by dot product of the vectors (cosine when the model normalises;
exact search, the corpus sharded over the devices: `runtime.search.ExactSearch`), a document
with the query's own id left out (BEIR's `ignore_identical_ids`, for corpora that hold their
queries); then trec_eval's measures through `pytrec_eval`: `ndcg_cut_10`, `recall_100`, and
`recip_rank` of each query's top 10 (MRR@10, as BEIR's own MRR@k). The metrics are fractions
in [0, 1], the means over the queries.
"""
import dataclasses
import json
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from bert_jax.io import filesystem
from bert_jax.runtime.search import ExactSearch
from bert_jax.tasks.framework.classification import DataError

EncodeFn = Callable[[List[str]], np.ndarray]   # texts -> [N, D] float32
METRICS = ("nDCG@10", "MRR@10", "Recall@100")
TOP_K = 100


def to_stderr(line: str) -> None:
  """What is said while a model embeds (where its settings come from, progress): on stderr,
  so that stdout keeps the command's result."""
  print(line, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Beir:
  """A BEIR folder's split: documents and queries in file order, judgements by query."""
  corpus_ids: List[str]
  documents: List[str]                 # title + " " + text, stripped
  query_ids: List[str]                 # the judged queries, in queries.jsonl's order
  queries: List[str]
  qrels: Dict[str, Dict[str, int]]     # query id -> {document id: relevance}


def _json_lines(path: str, fields: Sequence[str]) -> List[Tuple[int, Dict]]:
  """(line number, record) of every non-empty line of a JSON-lines file, `fields` checked to be
  strings there (`_id` required, the others may be absent: empty)."""
  if not filesystem.exists(path):
    raise FileNotFoundError(f"BEIR file not found: {path}")
  records, seen = [], set()
  with filesystem.open(path) as f:
    for line_no, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{line_no}"
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{where}: not valid JSON ({e})") from e
      if not isinstance(record, dict) or "_id" not in record:
        raise DataError(f"{where}: expected an object with \"_id\"")
      record["_id"] = str(record["_id"])   # some datasets write numbers
      for field in fields:
        value = record.setdefault(field, "") if field != "_id" else record[field]
        if not isinstance(value, str):
          raise DataError(f"{where}: {field} is {type(value).__name__}, not a string")
      if record["_id"] in seen:
        raise DataError(f"{where}: _id {record['_id']!r} appears twice")
      seen.add(record["_id"])
      records.append((line_no, record))
  return records


def read_qrels(path: str) -> Dict[str, Dict[str, Tuple[int, int]]]:
  """query id -> {document id: (relevance, line number)} of a qrels TSV (header first)."""
  if not filesystem.exists(path):
    raise FileNotFoundError(f"BEIR qrels not found: {path} (is the split name right?)")
  qrels: Dict[str, Dict[str, Tuple[int, int]]] = {}
  with filesystem.open(path) as f:
    for line_no, line in enumerate(f, 1):
      line = line.rstrip("\n").rstrip("\r")
      if line_no == 1 or not line.strip():
        continue   # the header (query-id corpus-id score)
      fields = line.split("\t")
      if len(fields) != 3:
        raise DataError(f"{path}:{line_no}: expected 3 tab-separated fields (query-id, "
                        f"corpus-id, score), got {len(fields)}")
      query, document, score = fields
      try:
        relevance = int(score)
      except ValueError as e:
        raise DataError(f"{path}:{line_no}: score {score!r} is not an integer") from e
      qrels.setdefault(query, {})[document] = (relevance, line_no)
  if not qrels:
    raise DataError(f"{path}: no judgements after the header")
  return qrels


def read(beir_dir: str, split: str = "test", say: Callable[[str], None] = to_stderr) -> Beir:
  """The split `split` of the BEIR folder `beir_dir`, checked (see the module docstring)."""
  qrels_path = filesystem.join(beir_dir, "qrels", f"{split}.tsv")
  judged = read_qrels(qrels_path)
  corpus = _json_lines(filesystem.join(beir_dir, "corpus.jsonl"), ("_id", "title", "text"))
  queries = {r["_id"]: r["text"] for _, r in
             _json_lines(filesystem.join(beir_dir, "queries.jsonl"), ("_id", "text"))}
  for query, documents in judged.items():
    if query not in queries:
      line = min(line for _, line in documents.values())
      raise DataError(f"{qrels_path}:{line}: query-id {query!r} is not in "
                      f"{filesystem.join(beir_dir, 'queries.jsonl')}")
  corpus_ids = [r["_id"] for _, r in corpus]
  known = set(corpus_ids)
  unknown = sorted((line, document) for documents in judged.values()
                   for document, (_, line) in documents.items() if document not in known)
  if unknown:
    say(f"{qrels_path}: {len(unknown)} judgement(s) name documents corpus.jsonl lacks (first: "
        f"line {unknown[0][0]}, {unknown[0][1]!r}); they cannot be retrieved")
  query_ids = [q for q in queries if q in judged]
  return Beir(corpus_ids=corpus_ids,
              documents=[(r["title"] + " " + r["text"]).strip() for _, r in corpus],
              query_ids=query_ids, queries=[queries[q] for q in query_ids],
              qrels={q: {d: relevance for d, (relevance, _) in judged[q].items()}
                     for q in query_ids})


def pytrec_eval():
  """The `pytrec_eval` module, or an error saying how to install it."""
  try:
    import pytrec_eval as module  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("Retrieval metrics need pytrec_eval: pip install 'bert_jax[retrieval]' "
                      "(the pytrec_eval-terrier package)") from e
  return module


def search(query_vectors: np.ndarray, document_vectors: np.ndarray, query_ids: Sequence[str],
           corpus_ids: Sequence[str], k: int = TOP_K, mesh=None) -> Dict[str, Dict[str, float]]:
  """query id -> {document id: score} of each query's top `k` documents by dot product, a
  document with the query's own id left out."""
  scores, rows = ExactSearch(document_vectors, mesh).top_k(query_vectors, k + 1)   # [Q, k+1]
  run = {}
  for query, query_scores, query_rows in zip(query_ids, scores, rows):
    hits = [(corpus_ids[row], float(score)) for score, row in zip(query_scores, query_rows)
            if corpus_ids[row] != query]
    run[query] = dict(hits[:k])
  return run


def metrics(qrels: Dict[str, Dict[str, int]], run: Dict[str, Dict[str, float]]
            ) -> Dict[str, float]:
  """nDCG@10, MRR@10 and Recall@100 (means over the queries of `qrels`) of a run, by trec_eval."""
  module = pytrec_eval()
  per_query = module.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
  # MRR@10: the reciprocal rank of the first relevant document among the top 10 (0 if none).
  top10 = {q: dict(sorted(hits.items(), key=lambda item: -item[1])[:10])
           for q, hits in run.items()}
  ranks = module.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
  count = len(qrels)
  # A query trec_eval did not score (no hits at all) counts 0, as BEIR's mean does.
  mean = lambda table, key: sum(table.get(q, {}).get(key, 0.0) for q in qrels) / count
  return {"nDCG@10": mean(per_query, "ndcg_cut_10"), "MRR@10": mean(ranks, "recip_rank"),
          "Recall@100": mean(per_query, "recall_100")}


def evaluate_beir(encode_fn: EncodeFn, beir_dir: str, split: str = "test", *, mesh=None,
                  say: Callable[[str], None] = to_stderr,
                  encode_queries: Optional[EncodeFn] = None) -> Dict:
  """{"nDCG@10", "MRR@10", "Recall@100" (fractions), "queries", "documents"} of the model
  `encode_fn` (texts -> [N, D] float32) on the split `split` of `beir_dir`; the queries by
  `encode_queries` where given (a training job cuts them at its own query length)."""
  pytrec_eval()   # missing: said before anything is embedded
  data = read(beir_dir, split, say)
  say(f"{beir_dir} ({split}): {len(data.queries):,} judged queries, {len(data.documents):,} "
      "documents")
  queries = np.asarray((encode_queries or encode_fn)(data.queries), np.float32)  # [Q, D]
  documents = np.asarray(encode_fn(data.documents), np.float32)                # [N, D]
  for name, vectors, count in (("queries", queries, len(data.queries)),
                               ("documents", documents, len(data.documents))):
    if vectors.shape[0] != count or vectors.ndim != 2:
      raise ValueError(f"encode_fn gave {vectors.shape} for {count} {name}: expected [N, D]")
  run = search(queries, documents, data.query_ids, data.corpus_ids, TOP_K, mesh)
  return dict(metrics(data.qrels, run), queries=len(data.queries), documents=len(data.documents))
