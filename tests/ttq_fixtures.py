"""benchmarks/time_to_quality's data at toy scale, for its tests and the studies built on its
output (benchmarks/long_context): generated documents written to a temporary folder (the shared
data is not on a user's machine), BERT-tiny's shape at seq 32."""
import os

import numpy as np
import pytest

from benchmarks import time_to_quality as ttq
from tests import finetuning_fixtures

WORDS = finetuning_fixtures.WORDS[:-3]
FLAGS = ["--size=tiny", "--seq=32", "--batch=8", "--max_predictions=5", "--log_every=2"]
FINETUNE = ["--tasks=rte", "--seeds=1", "--ft_max_seq=32", "--ft_batch=4", "--ft_epochs=1",
            "--ft_length_bucket=0"]
MODERN = ["--batch_warmup_start=2", "--batch_warmup_fraction=0.25", "--local_attention=16",
          "--modern_lr=2e-3"]


def sentence(rng, words=WORDS) -> str:
  return " ".join(rng.choice(words, size=int(rng.integers(4, 10)))) + " ."


def write_texts(root, words=WORDS) -> str:
  """Two files in the corpus's formats: one sentence per line (with a heading and a bracketed
  note, as the Gutenberg books), and raw paragraphs with speaker lines (as tinyshakespeare)."""
  rng = np.random.default_rng(0)
  os.makedirs(root / "gutenberg")
  lines = ["[ A Book by Someone 1900 ]"]
  for chapter in range(1, 13):
    lines.append(f"Chapter {chapter}")
    lines += [sentence(rng, words) for _ in range(12)]
  (root / "gutenberg" / "book.txt").write_text("\n".join(lines) + "\n")
  speeches = []
  for i in range(60):
    speeches.append(f"Speaker {'AB'[i % 2]}:\n" + "\n".join(
        sentence(rng, words).capitalize() for _ in range(2)))
  (root / "play.txt").write_text("\n\n".join(speeches) + "\n")
  return str(root)


def prepare_tiny(root, words=WORDS, sentences_per_document: int = 8) -> dict:
  """OUT/data prepared at toy scale under `root`, and a GLUE folder of the fixtures:
  {"data": OUT/data, "glue_dir": ...}; a test copies the data into an OUT of its own."""
  # Python's documentation as the third source: its first documents only. The package's
  # `documents(max_documents)` reads every standard-library docstring before counting (~7 s).
  from data_pipelines import demo_corpus
  rng = np.random.default_rng(1)
  out = str(root / "out")
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(demo_corpus, "documents", lambda max_documents=0: iter(
        [[sentence(rng, words) for _ in range(6)] for _ in range(max_documents or 5)]))
    ttq.main(FLAGS + [f"--out={out}", "--prepare",
                      f"--text_dir={write_texts(root / 'text', words)}", "--demo_documents=3",
                      f"--sentences_per_document={sentences_per_document}", "--holdout_every=5",
                      "--vocab_size=300", "--dupe_factor=2", "--eval_sequences=64",
                      "--data_workers=1"])
  glue_dir = finetuning_fixtures.write_glue_dir(str(root / "glue"), dict(train=16, dev=8, test=2))
  return dict(data=os.path.join(out, "data"), glue_dir=glue_dir)
