"""Contiguous instances without NSP (`create_pretraining_data --instances=contiguous`,
`config.data.instances`): the layout of the token stream and its cut points, the records, passes,
determinism and workers, a length of 8,192, dynamic masking at 0.30 in the tf.data pipeline, the
errors for NSP and packing, and the demo's quick run on them. (Beam: tests/test_beam_pipeline.py.)"""
import collections
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.tasks.jobs import pretraining
from bert_jax.tasks import registry
from data_pipelines import create_pretraining_data as cpd
from data_pipelines import features as F
from data_pipelines import input_pipeline, masking, packing
from tests import test_create_pretraining_data as pair_tests

ROOT, VOCAB, SEQ = pair_tests.ROOT, pair_tests.VOCAB, pair_tests.SEQ
PREDS = 20   # round(64 * 0.30) = 19 fits: the rate is not capped at SEQ
CLS, SEP, MASK = VOCAB.index("[CLS]"), VOCAB.index("[SEP]"), VOCAB.index("[MASK]")
OPTIONS = dict(max_seq_length=SEQ, max_predictions_per_seq=PREDS, random_seed=7,
               documents_per_block=50, instances="contiguous", progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The pair tests' corpus: 120 documents of 1-12 sentences, words with `##` pieces."""
  return pair_tests.write_corpus(tmp_path_factory.mktemp("corpus"))


def _build(corpus, out_dir, name, num_outputs=2, **options):
  vocab, text = corpus
  outputs = [os.path.join(str(out_dir), f"{name}-{i}.tfrecord") for i in range(num_outputs)]
  stats = cpd.create_pretraining_data([text], outputs, pair_tests._tokenizer(vocab),
                                      **dict(OPTIONS, **options))
  return outputs, stats


def _examples(paths):
  return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(paths)]


def _read(paths, kind="dynamic", seq=SEQ, preds=PREDS):
  spec = (F.static_feature_spec(seq, preds, next_sentence_labels=False) if kind == "static"
          else F.dynamic_feature_spec(seq, next_sentence_labels=False))
  dataset = tf.data.TFRecordDataset(paths).map(lambda r: tf.io.parse_single_example(r, spec))
  return [{k: v.numpy() for k, v in ex.items()} for ex in dataset]


def _check_rows(examples, seq=SEQ):
  """[CLS] text [SEP], one segment, padding only after the last real token; -> real lengths."""
  lengths = []
  for ex in examples:
    n = int(ex[F.INPUT_MASK].sum())
    assert np.all(ex[F.INPUT_MASK][:n] == 1) and np.all(ex[F.INPUT_MASK][n:] == 0)
    ids = ex[F.INPUT_IDS]
    assert ids[0] == CLS and ids[n - 1] == SEP and np.all(ids[n:] == 0)
    assert CLS not in ids[1:n]
    assert np.all(ex[F.SEGMENT_IDS] == 0)
    lengths.append(n)
  return lengths


def _unmasked(ex):
  ids = ex[F.INPUT_IDS].copy()
  real = ex[F.MASKED_LM_WEIGHTS] > 0
  ids[ex[F.MASKED_LM_POSITIONS][real]] = ex[F.MASKED_LM_IDS][real]
  return ids


# ------------------------------------------------------------------------------ the builder


def test_the_stream_and_its_cut_points():
  # Stream: 10 11 12 | 20 | 30 31 32 33, each document followed by [SEP]; 4 tokens per row.
  documents = [[[10, 11], [12]], [[20]], [[30, 31, 32, 33]]]
  arrays = cpd.contiguous_arrays(documents, 6, CLS, SEP)
  assert sorted(arrays) == sorted([F.INPUT_IDS, F.INPUT_MASK, F.SEGMENT_IDS]), "no NSP labels"
  np.testing.assert_array_equal(arrays[F.INPUT_IDS], [[CLS, 10, 11, 12, SEP, SEP],
                                                     [CLS, 20, SEP, 30, 31, SEP],
                                                     [CLS, 32, 33, SEP, SEP, 0]])
  np.testing.assert_array_equal(arrays[F.INPUT_MASK], [[1] * 6, [1] * 6, [1] * 5 + [0]])
  np.testing.assert_array_equal(arrays[F.SEGMENT_IDS], np.zeros((3, 6)))
  assert all(v.dtype == np.int64 for v in arrays.values())
  # A stream of whole rows has no padded row; a last piece that would hold only the final
  # document's [SEP] is dropped (the row before ends at that document's last token).
  whole = cpd.contiguous_arrays([[[10, 11, 12]], [[20, 21, 22]]], 6, CLS, SEP)
  np.testing.assert_array_equal(whole[F.INPUT_IDS], [[CLS, 10, 11, 12, SEP, SEP],
                                                    [CLS, 20, 21, 22, SEP, SEP]])
  cut = cpd.contiguous_arrays([[[10, 11], [12, 13]]], 6, CLS, SEP)
  np.testing.assert_array_equal(cut[F.INPUT_IDS], [[CLS, 10, 11, 12, 13, SEP]])
  assert cpd.contiguous_arrays([], 6, CLS, SEP)[F.INPUT_IDS].shape == (0, 6)


def test_records_are_each_blocks_stream_in_its_shuffled_document_order(corpus, tmp_path):
  outputs, stats = _build(corpus, tmp_path, "dyn", masking="dynamic", dupe_factor=1)
  assert all(F.NEXT_SENTENCE_LABELS not in ex.features.feature for ex in _examples(outputs))
  examples = _read(outputs)
  assert len(examples) == stats.instances > 100
  lengths = _check_rows(examples)
  # Full rows everywhere but at the end of each block's stream (3 blocks of <= 50 documents).
  assert sum(n < SEQ for n in lengths) <= 3 and sum(n == SEQ for n in lengths) > 100
  assert stats.tokens == sum(lengths) and stats.is_next == stats.not_next == 0
  assert stats.truncated_instances == 0 and "none (contiguous instances)" in stats.summary()

  # Expected: the documents of each block, tokenized, in the order the block's generator
  # (seed, block index) shuffles them, as one stream cut every SEQ - 2 tokens.
  vocab, text = corpus
  builder = cpd.BlockBuilder(pair_tests._tokenizer(vocab), cpd.Options(**{
      k: v for k, v in OPTIONS.items() if k != "progress"}), num_buckets=1)
  documents = list(cpd.documents_from_files([text], cpd.Options(), cpd.Stats()))
  expected, stream_tokens = [], collections.Counter()
  for block_index, start in enumerate(range(0, len(documents), 50)):
    docs = builder.tokenize(documents[start:start + 50], cpd.Stats())
    random.Random(f"7/{block_index}").shuffle(docs)
    expected.extend(map(tuple, cpd.contiguous_arrays(docs, SEQ, CLS, SEP)[F.INPUT_IDS]))
    for doc in docs:
      stream_tokens.update(t for sentence in doc for t in sentence)
      stream_tokens[SEP] += 1
  assert collections.Counter(map(tuple, (ex[F.INPUT_IDS] for ex in examples))) == \
      collections.Counter(expected)
  # Independently of the cut: every token of the corpus once, each document's [SEP] once.
  written = collections.Counter(t for ex, n in zip(examples, lengths)
                                for t in ex[F.INPUT_IDS][1:n - 1])
  assert written == stream_tokens
  # is_word_continuation as for pairs: where a `##` piece is.
  continuation = [VOCAB.index("##s"), VOCAB.index("##x")]
  for ex in examples:
    expected_cont = np.isin(ex[F.INPUT_IDS], continuation) & (ex[F.INPUT_MASK] > 0)
    np.testing.assert_array_equal(ex[F.IS_WORD_CONTINUATION], expected_cont)


def test_static_masks_and_fresh_cut_points_each_pass(corpus, tmp_path):
  outputs, stats = _build(corpus, tmp_path, "static", dupe_factor=2, masked_lm_prob=0.3)
  assert all(F.NEXT_SENTENCE_LABELS not in ex.features.feature for ex in _examples(outputs))
  examples = _read(outputs, "static")
  lengths = _check_rows([dict(ex, **{F.INPUT_IDS: _unmasked(ex)}) for ex in examples])
  masked = 0
  for ex, n in zip(examples, lengths):
    k = int(ex[F.MASKED_LM_WEIGHTS].sum())
    assert k == min(PREDS, max(1, round(n * 0.3)))
    positions = ex[F.MASKED_LM_POSITIONS][:k]
    assert list(positions) == sorted(set(positions))
    assert not np.isin(_unmasked(ex)[positions], [CLS, SEP]).any(), "never [CLS] or a [SEP]"
    assert np.all(ex[F.MASKED_LM_IDS][:k] > MASK)
    masked += k
  assert stats.masked_tokens == masked and stats.instances == len(examples)
  # The second pass reorders the documents: other rows, not the first pass's again.
  rows = collections.Counter(tuple(_unmasked(ex)) for ex in examples)
  assert sum(count == 2 for count in rows.values()) < 0.1 * len(rows)


def test_deterministic_and_independent_of_worker_count(corpus, tmp_path):
  one, _ = _build(corpus, tmp_path, "one", dupe_factor=2)
  again, _ = _build(corpus, tmp_path, "again", dupe_factor=2)
  two, _ = _build(corpus, tmp_path, "two", dupe_factor=2, num_workers=2)
  other_seed, _ = _build(corpus, tmp_path, "seed", dupe_factor=2, random_seed=8)
  pairs, _ = _build(corpus, tmp_path, "pairs", dupe_factor=2, instances="pairs")
  read = lambda paths: [open(p, "rb").read() for p in paths]
  assert read(one) == read(again) == read(two)
  assert read(one) != read(other_seed) and read(one) != read(pairs)


def test_command_line_flag(corpus, tmp_path):
  vocab, text = corpus
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.create_pretraining_data", f"--input_file={text}",
       f"--output_file={tmp_path}/cli.tfrecord@2", f"--vocab_file={vocab}",
       f"--max_seq_length={SEQ}", f"--max_predictions_per_seq={PREDS}", "--dupe_factor=1",
       "--random_seed=7", "--documents_per_block=50", "--instances=contiguous",
       "--masking=dynamic"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "NSP                  none (contiguous instances)" in result.stdout
  cli = [f"{tmp_path}/cli.tfrecord-0000{i}-of-00002" for i in range(2)]
  same, _ = _build(corpus, tmp_path, "api", masking="dynamic", dupe_factor=1)
  assert [open(p, "rb").read() for p in cli] == [open(p, "rb").read() for p in same]
  with pytest.raises(ValueError, match="instances='sentences'"):
    _build(corpus, tmp_path, "bad", instances="sentences")


def test_a_length_of_8192(tmp_path):
  """Rows of 8,192 tokens from a tiny vocabulary, masked at 0.30 by the builder (static) and by
  the tf.data pipeline (dynamic)."""
  seq, preds = 8192, 2458              # round(8192 * 0.30) = 2458
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(VOCAB) + "\n")
  rng = random.Random(0)
  text = tmp_path / "long.txt"
  text.write_text("\n\n".join("\n".join(" ".join(rng.choice(pair_tests.WORDS)
                                                 for _ in range(12)) + " ."
                                        for _ in range(rng.randint(200, 700)))
                              for _ in range(4)) + "\n")
  tokenizer = pair_tests._tokenizer(str(vocab))
  common = dict(max_seq_length=seq, max_predictions_per_seq=preds, masked_lm_prob=0.3,
                dupe_factor=1, instances="contiguous", progress=False)
  static = str(tmp_path / "static.tfrecord")
  stats = cpd.create_pretraining_data([str(text)], [static], tokenizer, **common)
  examples = _read([static], "static", seq, preds)
  assert len(examples) == stats.instances >= 3
  lengths = _check_rows([dict(ex, **{F.INPUT_IDS: _unmasked(ex)}) for ex in examples], seq)
  assert sorted(lengths)[1:] == [seq] * (len(lengths) - 1)
  for ex, n in zip(examples, lengths):
    assert int(ex[F.MASKED_LM_WEIGHTS].sum()) == min(preds, max(1, round(n * 0.3)))

  dynamic = str(tmp_path / "dynamic.tfrecord")
  cpd.create_pretraining_data([str(text)], [dynamic], tokenizer, masking="dynamic", **common)
  cap = 1000
  batch = next(iter(input_pipeline.create_pretraining_dataset(
      dynamic, global_batch_size=2, max_seq_length=seq, max_predictions_per_seq=cap,
      masking=masking.MaskingConfig(masked_lm_prob=0.3, max_predictions_per_seq=cap),
      special=masking.SpecialTokens.from_tokenizer(tokenizer), seed=0, process_index=0,
      process_count=1)))
  assert tuple(batch[F.INPUT_IDS].shape) == (2, seq) and F.NEXT_SENTENCE_LABELS not in batch
  np.testing.assert_array_equal(batch[F.MASKED_LM_WEIGHTS].numpy().sum(axis=1), [cap, cap])


# ------------------------------------------------------------------------------ the pipeline


@pytest.fixture(scope="module")
def dynamic_records(corpus, tmp_path_factory):
  outputs, _ = _build(corpus, tmp_path_factory.mktemp("records"), "train", num_outputs=1,
                      masking="dynamic", dupe_factor=1)
  return corpus[0], outputs[0]


def _dataset(records, prob, cap, **kwargs):
  vocab, path = records
  special = masking.SpecialTokens.from_tokenizer(pair_tests._tokenizer(vocab))
  return input_pipeline.create_pretraining_dataset(
      path, global_batch_size=16, max_seq_length=SEQ, max_predictions_per_seq=cap,
      masking=masking.MaskingConfig(masked_lm_prob=prob, max_predictions_per_seq=cap),
      special=special, seed=3, process_index=0, process_count=1, **dict(dict(
          is_training=False), **kwargs))


@pytest.mark.parametrize("cap", [PREDS, 10])
def test_dynamic_masking_at_030(dynamic_records, cap):
  records = _read([dynamic_records[1]])          # evaluation order: the file's
  rows = []
  for batch in input_pipeline.PipelineIterator(_dataset(dynamic_records, 0.30, cap)):
    assert F.NEXT_SENTENCE_LABELS not in batch and F.IS_WORD_CONTINUATION not in batch
    rows += [{k: v[i] for k, v in batch.items()} for i in range(len(batch[F.INPUT_IDS]))
             if batch[input_pipeline.EXAMPLE_WEIGHT][i]]
  assert len(rows) == len(records)
  chosen = real = masks = 0
  for row, record in zip(rows, records):
    n = int(record[F.INPUT_MASK].sum())
    k = int(row[F.MASKED_LM_WEIGHTS].sum())
    assert k == min(cap, max(1, round(n * 0.30)))
    np.testing.assert_array_equal(_unmasked(row), record[F.INPUT_IDS])
    positions = row[F.MASKED_LM_POSITIONS][:k]
    assert not np.isin(record[F.INPUT_IDS][positions], [CLS, SEP]).any()
    masks += int(np.sum(row[F.INPUT_IDS][positions] == MASK))
    chosen, real = chosen + k, real + n
  assert 0.7 < masks / chosen < 0.9, "80% of the chosen pieces become [MASK]"
  if cap == PREDS:
    assert abs(chosen / real - 0.30) < 0.01    # the rate, uncapped
  else:
    # Capped at max_predictions_per_seq: every row but the (up to 3) short ends of the streams.
    assert chosen >= cap * (len(rows) - 3) and cap < round(SEQ * 0.30)


def test_nsp_objective_and_packing_are_rejected_by_name(dynamic_records):
  path = dynamic_records[1]
  with pytest.raises(input_pipeline.MissingNspLabelsError, match=path):
    _dataset(dynamic_records, 0.15, PREDS, require_nsp_labels=True)
  with pytest.raises(ValueError, match=f"packing.*{path}.*contiguous"):
    _dataset(dynamic_records, 0.15, PREDS, is_training=True,
             packing=packing.PackingConfig(window=16, max_pairs_per_row=4))
  assert sorted(input_pipeline.feature_spec(path, SEQ, PREDS)) == sorted(
      F.dynamic_feature_spec(SEQ, next_sentence_labels=False))


# ------------------------------------------------------------------------------ a run


@pytest.mark.slow
def test_demo_quick_run_on_contiguous_instances(tmp_path):
  """`bert_jax.main --config=experiments/pretrain_demo.py:quick --config.objective=mlm
  --config.data.instances=contiguous`, in process."""
  from experiments import pretrain_demo
  from bert_jax.runtime.metric_writers import read_metrics
  config = pretrain_demo.get_config("quick")
  assert config.data.instances == "pairs"
  config.objective, config.data.instances = "mlm", "contiguous"
  workdir = str(tmp_path / "work")
  result = registry.run_job(config, workdir)
  train = read_metrics(workdir, "train")
  assert train[-1]["step"] == config.num_train_steps and all(np.isfinite(r["loss"]) for r in train)
  assert np.isfinite(result["eval_mlm_accuracy"]) and "eval_nsp_accuracy" not in result
  for split in ("train", "eval"):
    examples = _examples(os.path.join(workdir, "data", f"{split}.tfrecord"))
    assert all(F.NEXT_SENTENCE_LABELS not in ex.features.feature for ex in examples)
  lengths = [sum(ex.features.feature[F.INPUT_MASK].int64_list.value) for ex in examples]
  assert sorted(lengths)[1:] == [config.max_seq_length] * (len(lengths) - 1)

  config.objective = "mlm_nsp"
  with pytest.raises(ValueError, match="instances='contiguous'.*mlm_nsp"):
    registry.run_job(config, str(tmp_path / "nsp"))
  config.data.instances = "pairs"   # the workdir's records are contiguous ones
  with pytest.raises(ValueError, match="holds contiguous instances"):
    registry.run_job(config, workdir)
  # Pre-built contiguous records with an NSP objective: named by the pipeline.
  config.data.prepare_demo_corpus = False
  config.data.input_files = os.path.join(workdir, "data", "train.tfrecord")
  config.tokenizer.vocab_file = os.path.join(workdir, "data", "vocab.txt")
  with pytest.raises(input_pipeline.MissingNspLabelsError, match="train.tfrecord"):
    pretraining.input_pipeline_for(config, training=True, process_index=0, process_count=1)
