"""`python -m benchmarks.embedding_side_by_side --quick` on a tiny random BERT and a generated file
in SQuAD's layout: both sides train from the same folder, both are scored by the embedding job's
evaluator, and results.json holds every figure, finite. The ModernBERT row's folder (a random
ModernBERT with the checkpoint's vocabulary) embeds alike on both sides."""
import json
import math
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from tests import family_fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_squad(path: str, articles: int = 4, paragraphs: int = 3, questions: int = 2) -> str:
  """SQuAD v1.1's layout: paragraphs from the fixtures' corpus, each question four of its
  paragraph's words."""
  lines = family_fixtures.corpus(seed=0, sentences=articles * paragraphs)
  rng = random.Random(0)
  data = []
  for a in range(articles):
    entries = []
    for p in range(paragraphs):
      context = lines[a * paragraphs + p]
      words = context.split()
      entries.append({"context": context, "qas": [
          {"id": f"a{a}p{p}q{q}", "question": " ".join(rng.sample(words, 4)) + "?",
           "answers": [{"text": words[0], "answer_start": 0}]} for q in range(questions)]})
    data.append({"title": f"Article_{a}", "paragraphs": entries})
  with open(path, "w", encoding="utf-8") as f:
    json.dump({"version": "1.1", "data": data}, f)
  return path


def tiny_bert(tmp_path) -> str:
  """A random 2-layer BERT as transformers writes it, its WordPiece vocabulary learnt here."""
  return family_fixtures.write_bert(str(tmp_path / "bert"), layers=2, hidden=32, heads=2,
                                    intermediate=64, max_position_embeddings=64)


@pytest.mark.slow   # both sides, each run in a process of its own: 45-55 s on 2 cores
def test_quick_run_trains_both_sides_and_scores_them_with_one_evaluator(tmp_path):
  pytest.importorskip("sentence_transformers", reason="the peer side")
  pytest.importorskip("datasets", reason="sentence-transformers' trainer")
  pytest.importorskip("pytrec_eval", reason="the retrieval metrics")
  out = tmp_path / "out"
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.embedding_side_by_side", "--quick", "--no-modernbert",
       f"--squad_file={write_squad(str(tmp_path / 'squad.json'))}",
       f"--checkpoint={tiny_bert(tmp_path)}", f"--out={out}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.returncode == 0, result.stderr[-3000:]
  with open(out / "results.json", encoding="utf-8") as f:
    results = json.load(f)
  assert results["data"]["test_documents"] == 6 and results["data"]["test_queries"] == 8
  assert results["settings"]["eval_steps"] == [1, 2]
  assert set(results["models"]) == {"bert"}
  for name, row in results["models"].items():
    # The starting checkpoint, scored in bert_jax's job and read back as the peer's checkpoints
    # are: the same evaluator on the same encoder, so the same figures.
    assert row["before"]["max_abs_diff"] < 1e-3, (name, row["before"])
    assert row["questions_longer_than_max_query_length"] >= 0
    for side in ("bert_jax", "sentence_transformers"):
      (run,) = row["runs"][side]
      assert [p["step"] for p in run["curve"]] == [0, 1, 2], (name, side)
      figures = [p[m] for p in run["curve"] for m in ("nDCG@10", "MRR@10", "Recall@100")]
      figures += run["loss"] + [run["steps_per_sec"], run["train_seconds"]]
      assert len(run["loss"]) == 2 and all(math.isfinite(v) for v in figures), (name, side, run)
      assert all(0 <= p["nDCG@10"] <= 1 for p in run["curve"]) and run["steps_per_sec"] > 0
      assert run["timed_steps"] == 1   # step 1 left out
    assert math.isfinite(row["summary"]["speed_ratio"]) and row["summary"]["speed_ratio"] > 0
  assert "| bert | bert_jax | 1 |" in (out / "embedding_side_by_side.md").read_text()
  assert (out / "embedding_side_by_side.png").stat().st_size > 0


def test_the_random_modernbert_is_one_model_to_both_sides(tmp_path):
  """The ModernBERT row starts from transformers' random ModernBertModel with the checkpoint's
  vocabulary, wrapped as a sentence-transformers folder: both sides embed texts alike from it."""
  st = pytest.importorskip("sentence_transformers", reason="the peer side")
  from benchmarks import embedding_side_by_side as bench
  from bert_jax.tasks.datasets import beir
  from bert_jax.tasks.tools import embedding
  assert bench.METRICS == beir.METRICS   # the benchmark's copy (module-level, JAX-free)
  encoder = bench.write_modernbert(str(tmp_path / "encoder"), tiny_bert(tmp_path), "2,32,2,48")
  folder = bench.sentence_transformers_folder(encoder, str(tmp_path / "st"), 32)
  assert bench.sentence_transformers_folder(folder, str(tmp_path / "again"), 32) == folder
  with open(os.path.join(encoder, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["model_type"] == "modernbert"
  texts = family_fixtures.corpus()[:6]
  model = embedding.load(folder, say=lambda line: None)
  assert (model.settings.pooling, model.settings.normalize) == ("mean", True)
  ours = embedding.Embedder(model, batch_size=4, length_bucket=16).encode(texts)
  reference = st.SentenceTransformer(folder, device="cpu").encode(texts)
  np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
