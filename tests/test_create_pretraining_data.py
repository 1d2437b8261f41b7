"""The pre-training data builder: the original algorithm, record layout, statistics, determinism,
parallel workers, tensorflow-datasets input and bad input."""
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.text import tokenization
from data_pipelines import create_pretraining_data as cpd
from data_pipelines import features as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = [f"w{i}" for i in range(60)]
VOCAB = (["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "##s", "##x"] + WORDS)
SEQ, PREDS = 64, 10


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return write_corpus(tmp_path_factory.mktemp("corpus"))


def write_corpus(root):
  """A vocabulary and a generated corpus: documents of varied length, incl. one-sentence ones."""
  vocab = root / "vocab.txt"
  vocab.write_text("\n".join(VOCAB) + "\n")
  rng = random.Random(0)
  lines = []
  for doc in range(120):
    for _ in range(1 if doc % 10 == 0 else rng.randint(2, 12)):
      words = [rng.choice(WORDS) + rng.choice(["", "", "s", "sx"]) for _ in range(rng.randint(3, 15))]
      lines.append(" ".join(words) + " .")
    lines.append("")
  text = root / "corpus.txt"
  text.write_text("\n".join(lines) + "\n")
  return str(vocab), str(text)


def _tokenizer(vocab):
  return tokenization.FullTokenizer(vocab, do_lower_case=True)


def _read(paths, masking="static"):
  spec = (F.static_feature_spec(SEQ, PREDS) if masking == "static"
          else F.dynamic_feature_spec(SEQ))
  # Plain TensorFlow parsing of the original feature spec.
  dataset = tf.data.TFRecordDataset(paths).map(lambda r: tf.io.parse_single_example(r, spec))
  return [{k: v.numpy() for k, v in ex.items()} for ex in dataset]


def _build(corpus, out_dir, name="out", num_outputs=2, **options):
  vocab, text = corpus
  outputs = [os.path.join(str(out_dir), f"{name}-{i}.tfrecord") for i in range(num_outputs)]
  options = dict(dict(max_seq_length=SEQ, max_predictions_per_seq=PREDS, dupe_factor=3,
                      random_seed=7, documents_per_block=50, progress=False), **options)
  stats = cpd.create_pretraining_data([text], outputs, _tokenizer(vocab), **options)
  return outputs, stats


def test_static_records_layout_and_statistics(corpus, tmp_path):
  outputs, stats = _build(corpus, tmp_path)
  examples = _read(outputs)
  assert len(examples) == stats.instances > 200
  assert stats.documents == 120 and stats.empty_documents == 0
  cls, sep, mask_id = VOCAB.index("[CLS]"), VOCAB.index("[SEP]"), VOCAB.index("[MASK]")
  masked_total = tokens_total = 0
  for ex in examples:
    input_mask, segments = ex[F.INPUT_MASK], ex[F.SEGMENT_IDS]
    weights = ex[F.MASKED_LM_WEIGHTS]
    k = int(weights.sum())
    positions = ex[F.MASKED_LM_POSITIONS][:k]
    ids = ex[F.INPUT_IDS].copy()  # the unmasked sequence
    ids[positions] = ex[F.MASKED_LM_IDS][:k]
    n = int(input_mask.sum())
    assert n <= SEQ
    assert np.all(input_mask[:n] == 1) and np.all(input_mask[n:] == 0)
    assert np.all(ids[n:] == 0) and np.all(segments[n:] == 0)
    assert ids[0] == cls and ids[n - 1] == sep
    seps = np.flatnonzero(ids[:n] == sep)
    assert len(seps) == 2, "[CLS] A [SEP] B [SEP]"
    first_sep = seps[0]
    assert first_sep >= 2 and n - first_sep >= 3, "A and B are non-empty"
    np.testing.assert_array_equal(segments[:first_sep + 1], 0)
    np.testing.assert_array_equal(segments[first_sep + 1:n], 1)
    assert k == min(PREDS, max(1, round(n * 0.15)))
    assert list(positions) == sorted(set(positions)) and np.all(ex[F.MASKED_LM_POSITIONS][k:] == 0)
    assert not np.isin(positions, [0, first_sep, n - 1]).any(), "never [CLS]/[SEP]"
    assert np.all(ex[F.MASKED_LM_IDS][:k] > mask_id) and np.all(ex[F.MASKED_LM_IDS][k:] == 0)
    assert ex[F.NEXT_SENTENCE_LABELS].shape == (1,)
    masked_total += k
    tokens_total += n
  labels = np.array([ex[F.NEXT_SENTENCE_LABELS][0] for ex in examples])
  assert stats.not_next == int(labels.sum()) and stats.is_next == int((labels == 0).sum())
  # One-sentence chunks always take a random B, so NotNext is a little above half.
  assert 0.45 < labels.mean() < 0.65
  assert stats.masked_tokens == masked_total and stats.tokens == tokens_total
  assert "NSP balance" in stats.summary()


def test_the_original_algorithm_on_a_known_document():
  """Chunking, A/B split, random-next put-back and truncation as the original's code."""
  rng = random.Random(3)
  documents = [[[1] * 5, [2] * 5, [3] * 5, [4] * 5], [[9] * 40]]
  instances = cpd.instances_from_document(documents, 0, max_seq_length=13, short_seq_prob=0.0,
                                          rng=rng)
  for inst in instances:
    assert len(inst.tokens_a) + len(inst.tokens_b) <= 10
    assert inst.tokens_a and inst.tokens_b
    if inst.is_random_next:
      assert set(inst.tokens_b) == {9}
    else:
      assert set(inst.tokens_b) <= {2, 3, 4} and min(inst.tokens_b) > max(inst.tokens_a)
  # Every sentence of the document appears as the start of A in some instance (put-back).
  starts = {inst.tokens_a[0] for inst in instances}
  assert {1}.issubset(starts)
  a, b = [1] * 8, [2] * 8
  removed = cpd.truncate_seq_pair(a, b, 10, random.Random(0))
  assert removed == 6 and len(a) + len(b) == 10 and abs(len(a) - len(b)) <= 1


def test_nsp_is_balanced_on_multi_sentence_documents():
  rng = random.Random(1)
  documents = [[[d * 100 + s] * rng.randint(3, 9) for s in range(20)] for d in range(120)]
  nexts = [inst.is_random_next for d in range(120)
           for inst in cpd.instances_from_document(documents, d, 40, 0.1, rng)]
  assert len(nexts) > 500
  # A chunk of two or more sentences takes a random B with probability 1/2; a chunk of one
  # sentence (often the put-back rest at a document's end) always does, as in the original. So
  # NotNext is a little above half, never far from it.
  assert 0.5 < np.mean(nexts) < 0.62, np.mean(nexts)


def test_dynamic_records_and_whole_word_continuations(corpus, tmp_path):
  outputs, stats = _build(corpus, tmp_path, masking="dynamic", dupe_factor=1)
  examples = _read(outputs, "dynamic")
  assert len(examples) == stats.instances and stats.masked_tokens == 0
  continuation_ids = {VOCAB.index("##s"), VOCAB.index("##x")}
  for ex in examples:
    expected = np.isin(ex[F.INPUT_IDS], list(continuation_ids)) & (ex[F.INPUT_MASK] > 0)
    np.testing.assert_array_equal(ex[F.IS_WORD_CONTINUATION], expected.astype(np.int64))
  assert sum(ex[F.IS_WORD_CONTINUATION].sum() for ex in examples) > 0


def test_static_whole_word_masking_masks_whole_words(corpus, tmp_path):
  outputs, _ = _build(corpus, tmp_path, do_whole_word_mask=True, dupe_factor=1)
  continuation_ids = [VOCAB.index("##s"), VOCAB.index("##x")]
  for ex in _read(outputs):
    k = int(ex[F.MASKED_LM_WEIGHTS].sum())
    chosen = np.zeros(SEQ, bool)
    chosen[ex[F.MASKED_LM_POSITIONS][:k]] = True
    original = ex[F.INPUT_IDS].copy()
    original[ex[F.MASKED_LM_POSITIONS][:k]] = ex[F.MASKED_LM_IDS][:k]
    # A '##' piece joins the previous piece's word unless truncation cut the word's start off
    # (then it follows [CLS]/[SEP] and is a word of its own).
    after_special = np.isin(np.roll(original, 1), [VOCAB.index("[CLS]"), VOCAB.index("[SEP]")])
    joins = np.isin(original, continuation_ids) & ~after_special
    np.testing.assert_array_equal(chosen[1:][joins[1:]], chosen[:-1][joins[1:]])


def test_deterministic_and_independent_of_worker_count(corpus, tmp_path):
  one, _ = _build(corpus, tmp_path, name="one", num_workers=1)
  again, _ = _build(corpus, tmp_path, name="again", num_workers=1)
  two, _ = _build(corpus, tmp_path, name="two", num_workers=2)
  other_seed, _ = _build(corpus, tmp_path, name="seed", random_seed=8)
  read = lambda paths: [open(p, "rb").read() for p in paths]
  assert read(one) == read(again) == read(two)
  assert read(one) != read(other_seed)


def test_small_buckets_still_shuffle_everything(corpus, tmp_path, monkeypatch):
  monkeypatch.setattr(cpd, "_num_buckets", lambda input_bytes, options: 5)
  outputs, stats = _build(corpus, tmp_path, num_outputs=3)
  counts = [len(_read([p])) for p in outputs]
  assert sum(counts) == stats.instances and max(counts) - min(counts) <= 1


def test_bad_input(corpus, tmp_path, capsys):
  vocab, _ = corpus
  tokenizer = _tokenizer(vocab)
  text = tmp_path / "bad.txt"
  text.write_bytes(b"w1 w2 .\nw3 \xff\xfe w4 .\n\n\n\n" + b"w5 " * 50_000 + b".\nw6 w7 .\n\n"
                   b"w8 w9 .\n")  # a lone sentence at the end: a one-sentence document
  stats = cpd.create_pretraining_data([str(text)], [str(tmp_path / "o.tfrecord")], tokenizer,
                                      max_seq_length=SEQ, max_predictions_per_seq=PREDS,
                                      dupe_factor=1, progress=False, max_line_bytes=1000)
  assert stats.bad_utf8_lines == 1 and stats.overlong_lines == 1
  assert stats.documents == 3 and stats.empty_documents == 2
  err = capsys.readouterr().err
  assert f"{text}:2: invalid UTF-8" in err and f"{text}:6: line longer than 1000" in err
  assert stats.instances == len(_read([str(tmp_path / "o.tfrecord")]))

  with pytest.raises(FileNotFoundError, match="missing.txt"):
    cpd.create_pretraining_data([str(tmp_path / "missing.txt")], [str(tmp_path / "x")],
                                tokenizer, progress=False)
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  with pytest.raises(PermissionError, match="a_file/out.tfrecord"):
    cpd.create_pretraining_data([str(text)], [str(blocker / "out.tfrecord")], tokenizer,
                                progress=False)
  with pytest.raises(ValueError, match="max_seq_length"):
    cpd.create_pretraining_data([str(text)], [str(tmp_path / "y")], tokenizer, progress=False,
                                max_seq_length=4)


def test_output_shards_pattern():
  assert cpd.expand_output_files("d/train.tfrecord@3") == [
      "d/train.tfrecord-00000-of-00003", "d/train.tfrecord-00001-of-00003",
      "d/train.tfrecord-00002-of-00003"]
  assert cpd.expand_output_files("a,b") == ["a", "b"]


def test_tensorflow_datasets_input(corpus, tmp_path):
  import tensorflow_datasets as tfds
  vocab, _ = corpus
  output = str(tmp_path / "wiki.tfrecord")
  with tfds.testing.mock_data(num_examples=12):
    stats = cpd.create_pretraining_data(
        [], [output], _tokenizer(vocab), tfds_name="wikipedia/20230601.en", tfds_split="train",
        max_seq_length=SEQ, max_predictions_per_seq=PREDS, dupe_factor=1, progress=False)
  assert stats.documents + stats.empty_documents == 12
  assert stats.instances == len(_read([output])) > 0


def test_command_line(corpus, tmp_path):
  vocab, text = corpus
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.create_pretraining_data", f"--input_file={text}",
       f"--output_file={tmp_path}/cli.tfrecord@2", f"--vocab_file={vocab}",
       f"--max_seq_length={SEQ}", f"--max_predictions_per_seq={PREDS}", "--dupe_factor=1",
       f"--stats_file={tmp_path}/stats.json"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "NSP balance" in result.stdout
  assert len(_read([f"{tmp_path}/cli.tfrecord-0000{i}-of-00002" for i in range(2)])) > 0
  assert os.path.exists(tmp_path / "stats.json")
