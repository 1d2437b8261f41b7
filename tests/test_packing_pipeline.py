"""Packing in the training pipeline (config.data.packing): every instance once, exact resume,
and a short pre-training run on packed rows."""
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
from bert_jax.text import tokenization
from bert_jax.runtime.metric_writers import read_metrics
from data_pipelines import create_pretraining_data as cpd
from data_pipelines import input_pipeline, masking, packing
from tests import pretraining_fixtures as fx

SEQ, PREDS, WINDOW, BATCH = 32, 5, 16, 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
  """(vocab, one dynamic-masking TFRecord file): create_pretraining_data on a generated corpus
  whose short documents and short_seq_prob=0.5 mix short and full-length instances."""
  root = tmp_path_factory.mktemp("packing")
  vocab = fx.write_vocab(str(root))
  rng = random.Random(0)
  lines = []
  for doc in range(40):
    for _ in range(rng.randint(2, 3) if doc % 2 else rng.randint(4, 8)):
      lines.append(" ".join(rng.choice(fx.WORDS) for _ in range(rng.randint(2, 9))))
    lines.append("")
  text = root / "corpus.txt"
  text.write_text("\n".join(lines) + "\n")
  tokenizer = tokenization.FullTokenizer(vocab, do_lower_case=False)
  output = str(root / "train.tfrecord")  # one file: its epoch is a contiguous prefix of the stream
  cpd.create_pretraining_data([str(text)], [output], tokenizer, max_seq_length=SEQ,
                              max_predictions_per_seq=PREDS, masking="dynamic", dupe_factor=2,
                              short_seq_prob=0.5, random_seed=3, progress=False)
  return vocab, output


def _dataset(records, packed=True, seed=0, window=WINDOW):
  vocab, path = records
  special = masking.SpecialTokens.from_tokenizer(
      tokenization.FullTokenizer(vocab, do_lower_case=False))
  return input_pipeline.create_pretraining_dataset(
      path, global_batch_size=BATCH, max_seq_length=SEQ, max_predictions_per_seq=PREDS,
      masking=masking.MaskingConfig(max_predictions_per_seq=PREDS), special=special, seed=seed,
      process_index=0, process_count=1, shuffle_buffer_size=1,  # record order = file order
      packing=packing.PackingConfig(window=window, max_pairs_per_row=4) if packed else None)


def _unmasked(row):
  """input_ids with the masked-LM targets put back (masking differs between the pipelines)."""
  ids = row["input_ids"].copy()
  real = row["masked_lm_weights"] > 0
  ids[row["masked_lm_positions"][real]] = row["masked_lm_ids"][real]
  return ids


def _rows(batches):
  for batch in batches:
    for i in range(len(batch["input_ids"])):
      yield {k: v[i] for k, v in batch.items()}


def _pairs(row):
  """(tokens, segment ids, NSP label) of every pair in a row (one pair if unpacked)."""
  ids = _unmasked(row)
  if "sequence_ids" not in row:
    n = int(row["input_mask"].sum())
    return [(tuple(ids[:n]), tuple(row["segment_ids"][:n]), int(row["next_sentence_labels"][0]))]
  pairs = []
  for k in range(int(row["nsp_weights"].sum())):
    span = row["sequence_ids"] == k + 1
    start = row["cls_positions"][k]
    assert span[start], "cls_positions points into its pair"
    np.testing.assert_array_equal(row["position_ids"][span], np.arange(span.sum()))
    pairs.append((tuple(ids[span]), tuple(row["segment_ids"][span]),
                  int(row["next_sentence_labels"][k])))
  return pairs


def test_packed_rows_hold_every_instance_once(records):
  count = sum(1 for _ in tf.data.TFRecordDataset(records[1]))
  instances = count // WINDOW * WINDOW     # whole windows of the first epoch
  assert instances >= 4 * WINDOW
  unpacked = input_pipeline.PipelineIterator(_dataset(records, packed=False))
  expected = collections.Counter(
      pair for row in _rows(next(unpacked) for _ in range(instances // BATCH))
      for pair in _pairs(row))
  packed_pairs, rows = [], 0
  for row in _rows(input_pipeline.PipelineIterator(_dataset(records))):
    packed_pairs += _pairs(row)
    rows += 1
    assert row["masked_lm_weights"].sum() >= 1 and row["input_mask"].sum() <= SEQ
    if len(packed_pairs) >= instances:   # a window's rows are contiguous in the stream
      break
  assert len(packed_pairs) == instances
  assert collections.Counter(packed_pairs) == expected
  assert rows < 0.8 * instances, (rows, instances)   # it really packs


def test_iterator_resumes_exactly_and_is_deterministic(records, tmp_path):
  iterator = input_pipeline.PipelineIterator(_dataset(records))
  first = [next(iterator) for _ in range(3)]
  iterator.save(str(tmp_path / "it"))
  following = [next(iterator) for _ in range(4)]
  restored = input_pipeline.PipelineIterator(_dataset(records))
  restored.restore(str(tmp_path / "it"))
  again = input_pipeline.PipelineIterator(_dataset(records))
  other_seed = next(input_pipeline.PipelineIterator(_dataset(records, seed=1)))
  for want, got in zip(first + following, [next(again) for _ in range(7)]):
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  for want in following:
    got = next(restored)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  assert not np.array_equal(other_seed["input_ids"], first[0]["input_ids"])


def test_process_with_a_live_packed_iterator_exits(records):
  """Python in tf.data threads (numpy_function) must not deadlock interpreter shutdown.

  A large window keeps the packing threads busy when the script ends (without the atexit close
  in input_pipeline this hangs until the timeout)."""
  script = ("from tests import test_packing_pipeline as t\n"
            "from data_pipelines import input_pipeline\n"
            f"it = input_pipeline.PipelineIterator(t._dataset({records!r}, window=1024))\n"
            "[next(it) for _ in range(2)]\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, timeout=45,
                        capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]


def test_pretraining_on_packed_rows(tmp_path):
  config = fx.tiny_config(str(tmp_path / "data"), **{
      "data.packing": True, "data.max_pairs_per_row": 3, "data.packing_window": 32,
      "num_train_steps": 6, "eval_every_steps": 6, "checkpoint_every_steps": 6})
  result = registry.run_job(config, str(tmp_path / "work"))
  train = read_metrics(str(tmp_path / "work"), "train")
  assert [r["step"] for r in train] == list(range(1, 7))
  assert all(np.isfinite(r["loss"]) for r in train)
  # The fixture's pairs are 11-27 tokens of 32: some rows hold two.
  assert all(1.0 < r["pairs_per_row"] <= 3.0 for r in train)
  assert [r["step"] for r in read_metrics(str(tmp_path / "work"), "eval")] == [6]
  assert np.isfinite(result["eval_mlm_accuracy"]) and "eval_nsp_accuracy" in result


def test_packing_rejects_left_to_right(tmp_path):
  config = fx.tiny_config(str(tmp_path / "data"), **{"data.packing": True, "objective": "ltr"})
  with pytest.raises(ValueError, match="packing"):
    pretraining.input_pipeline_for(config, training=True, process_index=0, process_count=1)
