"""Documents as sequences (`create_pretraining_data --instances=documents`,
`config.data.instances="documents"`): each document a `[CLS] ... [SEP]` sequence of its own,
packed into rows with sequence_ids and restarting position_ids; the records, the pipeline's
batches, masking that never takes a sequence's [CLS] or [SEP], and a run of the modern recipe's
`:quick` pretrain phase on them. (That a packed row computes each document alone:
tests/test_modern_model.py.)"""
import collections
import os
import subprocess
import sys

import numpy as np
import pytest

from data_pipelines import create_pretraining_data as cpd
from data_pipelines import features as F
from data_pipelines import input_pipeline, masking
from tests import test_contiguous_data as contiguous
from tests import test_create_pretraining_data as pair_tests

ROOT, SEQ, PREDS = contiguous.ROOT, contiguous.SEQ, contiguous.PREDS
CLS, SEP = contiguous.CLS, contiguous.SEP


def _sequences(row):
  """{k: the tokens of the row's k-th sequence} and checks of its layout."""
  out = {}
  for k in range(1, int(row[F.SEQUENCE_IDS].max()) + 1):
    span = np.flatnonzero(row[F.SEQUENCE_IDS] == k)
    assert np.array_equal(span, np.arange(span[0], span[-1] + 1)), "a sequence is contiguous"
    np.testing.assert_array_equal(row[F.POSITION_IDS][span], np.arange(len(span)))
    tokens = row[F.INPUT_IDS][span]
    assert tokens[0] == CLS and tokens[-1] == SEP and CLS not in tokens[1:-1]
    out[k] = tokens
  real = row[F.INPUT_MASK] > 0
  np.testing.assert_array_equal(real, row[F.SEQUENCE_IDS] > 0)
  assert not real[np.argmin(real):].any() or real.all(), "padding only at the end"
  assert np.all(row[F.SEGMENT_IDS] == 0)
  return out


def test_each_document_is_its_own_sequence_packed_first_fit():
  documents = [[[10, 11], [12]], [[20]], [[30, 31, 32, 33, 34, 35, 36, 37, 38]]]
  rows = cpd.documents_arrays(documents, 8, cls_id=CLS, sep_id=SEP)
  # Pieces of <= 6 tokens: [30..35], [36 37 38], [10 11 12], [20]; decreasing length first fit:
  # row 0 = 30..35 (8 tokens), row 1 = 10 11 12 (5) then 20 (3); 36 37 38 (5) opens row 2.
  np.testing.assert_array_equal(rows[F.INPUT_IDS], [
      [CLS, 30, 31, 32, 33, 34, 35, SEP],
      [CLS, 10, 11, 12, SEP, CLS, 20, SEP],
      [CLS, 36, 37, 38, SEP, 0, 0, 0]])
  np.testing.assert_array_equal(rows[F.SEQUENCE_IDS], [
      [1] * 8, [1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(rows[F.POSITION_IDS][1], [0, 1, 2, 3, 4, 0, 1, 2])
  for row in range(3):
    _sequences({k: v[row] for k, v in rows.items()})


def test_records_hold_every_document_once_as_sequences(corpus_records):
  (outputs, stats), _ = corpus_records
  examples = contiguous._examples(outputs)
  assert all(F.NEXT_SENTENCE_LABELS not in ex.features.feature for ex in examples)
  rows = _read(outputs)
  assert len(rows) == stats.instances and stats.sequences > stats.instances
  assert "document sequences packed" in stats.summary()
  written, sequences = collections.Counter(), 0
  for row in rows:
    for tokens in _sequences(row).values():
      written.update(tokens[1:-1].tolist())
      sequences += 1
  assert sequences == stats.sequences
  # Every token of every document once (no [SEP] between documents: each has its own).
  vocab, text = corpus_records[1]
  builder = cpd.BlockBuilder(pair_tests._tokenizer(vocab), cpd.Options(), num_buckets=1)
  documents = builder.tokenize(list(cpd.documents_from_files([text], cpd.Options(), cpd.Stats())),
                               cpd.Stats())
  assert written == collections.Counter(t for d in documents for s in d for t in s)
  assert input_pipeline.instance_form(outputs[0]) == "documents"


def test_the_pipeline_batches_carry_the_sequences_and_masks_inside_them(corpus_records):
  (outputs, _), (vocab, _) = corpus_records
  special = masking.SpecialTokens.from_tokenizer(pair_tests._tokenizer(vocab))
  dataset = input_pipeline.create_pretraining_dataset(
      outputs, global_batch_size=8, max_seq_length=SEQ, max_predictions_per_seq=PREDS,
      masking=masking.MaskingConfig(masked_lm_prob=0.3, max_predictions_per_seq=PREDS),
      special=special, seed=3, is_training=False, process_index=0, process_count=1)
  records = _read(outputs)
  seen = 0
  for batch in input_pipeline.PipelineIterator(dataset):
    assert {F.SEQUENCE_IDS, F.POSITION_IDS} <= set(batch) and F.NEXT_SENTENCE_LABELS not in batch
    for i in np.flatnonzero(batch[input_pipeline.EXAMPLE_WEIGHT]):
      record = records[seen]
      seen += 1
      np.testing.assert_array_equal(batch[F.SEQUENCE_IDS][i], record[F.SEQUENCE_IDS])
      np.testing.assert_array_equal(batch[F.POSITION_IDS][i], record[F.POSITION_IDS])
      chosen = batch[F.MASKED_LM_POSITIONS][i][batch[F.MASKED_LM_WEIGHTS][i] > 0]
      assert len(chosen) and not np.isin(record[F.INPUT_IDS][chosen], [CLS, SEP]).any()
  assert seen == len(records)


def test_the_command_line_writes_them(corpus_records, tmp_path):
  vocab_file, text = corpus_records[1]
  out = str(tmp_path / "cli.tfrecord")
  run = subprocess.run(
      [sys.executable, "-m", "data_pipelines.create_pretraining_data", f"--input_file={text}",
       f"--output_file={out}", f"--vocab_file={vocab_file}", "--do_lower_case",
       f"--max_seq_length={SEQ}", "--instances=documents", "--masking=static",
       f"--max_predictions_per_seq={PREDS}", "--dupe_factor=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]
  assert input_pipeline.instance_form(out) == "documents"
  assert sorted(input_pipeline.feature_spec(out, SEQ, PREDS)) == sorted(
      F.static_feature_spec(SEQ, PREDS, packed=True))


@pytest.fixture(scope="module")
def corpus_records(tmp_path_factory):
  corpus = pair_tests.write_corpus(tmp_path_factory.mktemp("corpus"))
  built = contiguous._build(corpus, tmp_path_factory.mktemp("records"), "docs", num_outputs=1,
                            masking="dynamic", dupe_factor=1, instances="documents")
  return built, corpus


def _read(paths):
  import tensorflow as tf
  spec = F.dynamic_feature_spec(SEQ, next_sentence_labels=False, packed=True)
  dataset = tf.data.TFRecordDataset(paths).map(lambda r: tf.io.parse_single_example(r, spec))
  return [{k: v.numpy() for k, v in ex.items()} for ex in dataset]


@pytest.mark.slow
def test_the_modern_recipe_trains_on_documents_as_sequences(tmp_path):
  """The recipe's default: `:quick` builds its demo records as documents, and trains on them."""
  run = subprocess.run(
      [sys.executable, "-m", "bert_jax.main",
       "--config=experiments/pretrain_modernbert.py:quick", f"--workdir={tmp_path}",
       "--config.num_train_steps=2", "--config.eval_every_steps=0"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  assert input_pipeline.instance_form(os.path.join(tmp_path, "data", "train.tfrecord")) == \
      "documents"
  assert "train step 2/2" in run.stdout + run.stderr
