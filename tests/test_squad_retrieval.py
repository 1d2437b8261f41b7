"""`python -m data_pipelines.squad_retrieval`: SQuAD questions -> their paragraph as a BEIR folder
and training pairs, split by article (no article on both sides), readable by the BEIR reader;
unanswerable v2.0 questions left out; a file not in SQuAD's layout named with its entry."""
import json
import os
import subprocess
import sys

import pytest

from bert_jax.tasks.datasets import beir
from data_pipelines import squad_retrieval

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _squad(articles=6, paragraphs=2, questions=3):
  """A SQuAD v2.0-like file: article a, paragraph p, question q; the last question of each
  paragraph unanswerable."""
  return {"version": "v2.0", "data": [
      {"title": f"Article_{a}", "paragraphs": [
          {"context": f"Paragraph {p} of article {a}.", "qas": [
              {"id": f"a{a}p{p}q{q}", "question": f"Question {q} on {a}/{p}?",
               "answers": [], "is_impossible": q == questions - 1}
              for q in range(questions)]}
          for p in range(paragraphs)]}
      for a in range(articles)]}


def _write(tmp_path, data):
  path = tmp_path / "squad.json"
  path.write_text(json.dumps(data), encoding="utf-8")
  return str(path)


def _jsonl(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def test_split_by_article_as_beir_and_pairs(tmp_path):
  out = str(tmp_path / "out")
  counts = squad_retrieval.convert(_write(tmp_path, _squad()), out, test_fraction=0.5, seed=3)
  assert counts == {"articles": 6, "train_articles": 3, "test_articles": 3,
                    "test_documents": 6, "test_queries": 12, "train_pairs": 12,
                    "unanswerable_left_out": 12}
  data = beir.read(os.path.join(out, "test"), "test")
  assert len(data.query_ids) == 12 and len(data.documents) == 6
  test_articles = {doc.split("-")[0] for doc in data.corpus_ids}
  for query, judged in data.qrels.items():
    (document, relevance), = judged.items()
    assert relevance == 1 and query.startswith(f"a{document.split('-')[0]}p")
  assert data.documents[0].startswith("Article ")          # the title, underscores as spaces
  pairs = _jsonl(os.path.join(out, "train_pairs.jsonl"))
  train_articles = {pair["positive"].split()[-1].rstrip(".") for pair in pairs}
  assert not train_articles & test_articles and len(train_articles | test_articles) == 6
  assert set(pairs[0]) == {"query", "positive"}
  # The same seed, the same split.
  again = squad_retrieval.convert(_write(tmp_path, _squad()), str(tmp_path / "again"), 0.5, 3)
  assert again == counts and _jsonl(os.path.join(tmp_path, "again", "test", "queries.jsonl")) \
      == _jsonl(os.path.join(out, "test", "queries.jsonl"))


@pytest.mark.parametrize("data, message", [
    ({"data": [{"title": "T", "paragraphs": [{"qas": []}]}]},
     r"data\[0\].paragraphs\[0\] has no context"),
    ({"data": [{"title": "T", "paragraphs": [{"context": "c", "qas": [{"question": "q"}]}]}]},
     r"data\[0\].paragraphs\[0\].qas\[0\] has no id"),
    ({"version": "1.1"}, "the top level has no data"),
])
def test_bad_files_name_the_entry(tmp_path, data, message):
  with pytest.raises(ValueError, match="squad.json: " + message):
    squad_retrieval.convert(_write(tmp_path, data), str(tmp_path / "out"))


def test_fractions_and_counts_checked(tmp_path):
  with pytest.raises(ValueError, match="--test_fraction=1.0: must be between 0 and 1"):
    squad_retrieval.convert(_write(tmp_path, _squad()), str(tmp_path / "out"), test_fraction=1.0)
  with pytest.raises(ValueError, match="1 article"):
    squad_retrieval.convert(_write(tmp_path, _squad(articles=1)), str(tmp_path / "out"))
  # A tiny fraction still leaves one article on each side.
  counts = squad_retrieval.convert(_write(tmp_path, _squad()), str(tmp_path / "out"), 0.01)
  assert counts["test_articles"] == 1 and counts["train_articles"] == 5


def test_the_command_line(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.squad_retrieval",
       f"--squad_file={_write(tmp_path, _squad(articles=4))}", f"--output_dir={tmp_path / 'out'}",
       "--test_fraction=0.25", "--seed=1"],
      capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  counts = json.loads(result.stdout.strip().splitlines()[-1])
  assert counts["test_articles"] == 1 and counts["train_pairs"] == 12
  assert os.path.exists(tmp_path / "out" / "test" / "qrels" / "test.tsv")
