"""benchmarks/time_to_quality end to end at toy scale: prepare, both sides, fine-tune, report.

The real benchmark pre-trains BERT-mini for an hour per side on ../shared/data; here a few
generated documents (written to tmp_path: the shared data is not on a user's machine), BERT-tiny
at seq 32, a fixed few steps per side (no calibration) and one GLUE task of the fixtures with one
seed check that every stage's outputs exist and fit together: both sides leave a held-out curve
and a checkpoint that bert_jax loads, both are scored on the same fixed batches, and the table
and plot are written. The pieces with logic of their own (documents from the two text formats,
the step count from a calibration, the per-task subsets) are checked directly.
"""
import importlib.util
import json
import os

import numpy as np
import pytest

pytest.importorskip("torch", reason="the transformers side of the benchmark needs torch")
pytest.importorskip("transformers", reason="the transformers side needs transformers")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")

from benchmarks.time_to_quality import (cli, clocks, common, corpus, finetune,  # noqa: E402
                                        prepared, report, schedule)
from bert_jax.io import checkpoints  # noqa: E402
from tests import finetuning_fixtures  # noqa: E402

WORDS = finetuning_fixtures.WORDS[:-3]


def _sentence(rng) -> str:
  return " ".join(rng.choice(WORDS, size=int(rng.integers(4, 10)))) + " ."


def _write_texts(root) -> str:
  """Two files in the corpus's formats: one sentence per line (with a heading and a bracketed
  note, as the Gutenberg books), and raw paragraphs with speaker lines (as tinyshakespeare)."""
  rng = np.random.default_rng(0)
  os.makedirs(root / "gutenberg")
  lines = ["[ A Book by Someone 1900 ]"]
  for chapter in range(1, 13):
    lines.append(f"Chapter {chapter}")
    lines += [_sentence(rng) for _ in range(12)]
  (root / "gutenberg" / "book.txt").write_text("\n".join(lines) + "\n")
  speeches = []
  for i in range(60):
    speeches.append(f"Speaker {'AB'[i % 2]}:\n" + "\n".join(
        _sentence(rng).capitalize() for _ in range(2)))
  (root / "play.txt").write_text("\n\n".join(speeches) + "\n")
  return str(root)


def test_documents_from_both_formats(tmp_path):
  text_dir = _write_texts(tmp_path / "text")
  docs = list(corpus.text_documents(text_dir, sentences_per_document=8))
  book = [d for d in docs if not d[0][0].isupper()]
  play = [d for d in docs if d[0][0].isupper()]
  # 12 chapters of 12 sentences: each chapter heading ends a document (8 + 4 sentences).
  assert sorted({len(d) for d in book}) == [4, 8] and len(book) == 24
  assert not any(s.startswith("[") or s.startswith("Chapter") for d in docs for s in d)
  assert not any(s.startswith("Speaker") for d in play for s in d)   # speaker lines dropped
  assert sum(len(d) for d in play) == 120


def test_calibration_sets_the_steps_that_fill_the_budget():
  calibration = schedule.Calibration.from_windows([(10, 25.0), (10, 20.0), (10, 20.0)])
  assert calibration.steps_per_sec == pytest.approx(0.5)
  assert calibration.startup_seconds == pytest.approx(5.0)
  assert calibration.steps_for(3600.0) == int((3600 - 5) * 0.5)
  assert schedule.every(180.0, 0.5, multiple=20) == 80 and schedule.every(1.0, 0.5, multiple=20) == 20
  assert finetune.parse_subsets("sst2=20000,cola=0") == {"sst2": 20000, "cola": 0}


def test_clock_stops_and_restarts():
  clock = clocks.Clock(10.0)
  clock.start()
  first = clock.stop()
  assert first >= 10.0 and clock.stop() == first       # stopped: no time passes
  clock.start()
  assert clock.read() >= first


def test_end_to_end_tiny(tmp_path, monkeypatch):
  # Python's documentation as the third source: its first documents only. The package's
  # `documents(max_documents)` reads every standard-library docstring before counting (~7 s).
  from data_pipelines import demo_corpus
  rng = np.random.default_rng(1)
  monkeypatch.setattr(demo_corpus, "documents", lambda max_documents=0: iter(
      [[_sentence(rng) for _ in range(6)] for _ in range(max_documents or 5)]))
  out = str(tmp_path / "out")
  text_dir = _write_texts(tmp_path / "text")
  glue_dir = finetuning_fixtures.write_glue_dir(str(tmp_path / "glue"),
                                                dict(train=16, dev=8, test=2))
  plot = str(tmp_path / "curve.png")
  flags = [f"--out={out}", "--size=tiny", "--seq=32", "--batch=8", "--max_predictions=5",
            "--log_every=2", f"--plot={plot}"]
  cli.main(flags + ["--prepare", f"--text_dir={text_dir}", "--demo_documents=3",
                     "--sentences_per_document=8", "--holdout_every=5", "--vocab_size=300",
                     "--dupe_factor=2", "--eval_sequences=64", "--data_workers=1"])
  info = prepared.read_data_info(out)
  assert info["instances"]["train"] > 8 and info["eval_batches"] == 1
  assert info["documents"]["train"].get("python_docs", 0) + info["documents"]["eval"].get(
      "python_docs", 0) == 3
  arrays = np.load(prepared.data_paths(out)["train_instances.npz"])
  assert len(arrays["lengths"]) == info["instances"]["train"]

  # A fixed few steps per side (1 step/s assumed): checkpoints every 2 steps, evaluations every
  # 2 steps (bert_jax: a multiple of --log_every) or after every step (transformers: its clock).
  pretrain = flags + ["--max_steps=4", "--eval_every_minutes=0.0001",
                       "--checkpoint_every_minutes=0.034"]
  done = cli.main(pretrain + ["--side=bert_jax", "--side=transformers"])
  for side in common.SIDES:
    curve = common.read_jsonl(os.path.join(out, side, "curve.jsonl"))
    assert [r["step"] for r in curve][-1] == 4, side
    assert all(np.isfinite(r["mlm_loss"]) and r["seconds"] > 0 for r in curve), side
    assert [r["seconds"] for r in curve] == sorted(r["seconds"] for r in curve), side
    config, params = checkpoints.load_pretrained(finetune.checkpoint_of(cli.parse_args(
        ["--report", f"--out={out}"]), side))
    assert config.vocab_size == info["vocab_size"] and "cls" in params, side
  # bert_jax's own evaluation and the fixed numpy batches (what the transformers side is
  # scored on) are the same data: the same numbers.
  jax_summary = done["bert_jax"]
  assert jax_summary["npz_check"]["mlm_loss"] == pytest.approx(
      jax_summary["final"]["mlm_loss"], rel=1e-5)
  assert len(common.read_jsonl(os.path.join(out, "transformers", "curve.jsonl"))) >= 2

  done = cli.main(flags + ["--finetune", f"--glue_dir={glue_dir}", "--tasks=rte", "--seeds=1",
                            "--ft_max_seq=32", "--ft_batch=4", "--ft_epochs=1",
                            "--ft_length_bucket=0"])
  result = done["report"]
  assert set(result["finetune"]) == set(common.SIDES)
  assert set(result["average"]) == set(common.SIDES)
  with open(os.path.join(out, "time_to_quality.md")) as f:
    table = f.read()
  assert "| RTE | accuracy |" in table and "**average**" in table
  with open(os.path.join(out, "time_to_quality.json")) as f:
    assert json.load(f)["pretraining"]["transformers"]["steps"] == 4
  if importlib.util.find_spec("matplotlib") is not None:
    assert os.path.getsize(plot) > 0


def test_last_within_picks_the_last_evaluation_inside_the_budget():
  curve = [dict(seconds=s, mlm_loss=10.0 - s / 100) for s in (100.0, 3500.0, 3600.0, 3700.0)]
  assert report.last_within(curve, 3600.0)["seconds"] == 3600.0
  assert report.last_within(curve, 3599.0)["seconds"] == 3500.0
  assert report.last_within(curve, 50.0) is None
