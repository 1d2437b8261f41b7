"""The pre-training input's saved position (`PipelineIterator.save/restore`) names its files
below their common folder, never absolutely: restored over a copy of the files it reads the
copy's, exactly, whatever became of the originals; over files that differ from those it was
saved over it is not applied (`InputMovedError`: the caller replays)."""
import os
import shutil

import numpy as np
import pytest

from bert_jax.io.training_checkpoints import InputMovedError
from bert_jax.text import tokenization
from data_pipelines import input_pipeline, masking
from tests import pretraining_fixtures as fx

BATCH, PREDICTIONS = 4, 5
# The source folder's name, looked for in the saved state's bytes: unlike a long temporary path
# it cannot be stored compressed (the state's elements are snappy-compressed; a path with
# repeated parts comes out as back-references, not as its text).
ORIGIN = "Q9origin"


def _write_data(directory, seed=1):
  """Two training files of 48 records each in `directory`; returns their pattern."""
  os.makedirs(directory, exist_ok=True)
  for i in range(2):
    fx.write_records(os.path.join(directory, f"train-{i}.tfrecord"), 48, seed=seed + i)
  return os.path.join(directory, "train-*.tfrecord")


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return fx.write_vocab(str(tmp_path_factory.mktemp("vocab")))


def _iterator(pattern, vocab):
  special = masking.SpecialTokens.from_tokenizer(
      tokenization.FullTokenizer(vocab, do_lower_case=False))
  build = lambda: input_pipeline.create_pretraining_dataset(
      pattern, global_batch_size=BATCH, max_seq_length=fx.SEQ,
      max_predictions_per_seq=PREDICTIONS,
      masking=masking.MaskingConfig(max_predictions_per_seq=PREDICTIONS), special=special,
      seed=0, process_index=0, process_count=1, shuffle_buffer_size=8)
  return input_pipeline.PipelineIterator(build, source=pattern)


def _assert_same_batches(got, want):
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert sorted(g) == sorted(w)
    for key in w:
      np.testing.assert_array_equal(g[key], w[key], err_msg=key)


@pytest.fixture
def saved(tmp_path, vocab):
  """(source folder, saved position, the 8 batches after it): 5 batches read, then saved."""
  source = str(tmp_path / ORIGIN / "data")
  iterator = _iterator(_write_data(source), vocab)
  for _ in range(5):
    next(iterator)
  position = str(tmp_path / "position")
  iterator.save(position)
  # 8 batches of 4 reach past the 8-record shuffle buffer: records the restore reads anew.
  return source, position, [next(iterator) for _ in range(8)]


def _files_hold(directory, text):
  for name in os.listdir(directory):
    with open(os.path.join(directory, name), "rb") as f:
      if text.encode() in f.read():
        return True
  return False


def test_a_copy_resumes_on_its_own_files_whatever_became_of_the_source(saved, tmp_path, vocab):
  source, position, following = saved
  assert _files_hold(position, "train-1.tfrecord") and not _files_hold(position, ORIGIN), \
      "a path in the saved state"
  copy = str(tmp_path / "copy" / "data")
  shutil.copytree(source, copy)
  _write_data(source, seed=7)   # the source's files rewritten with other records
  restored = _iterator(os.path.join(copy, "train-*.tfrecord"), vocab)
  restored.restore(position)
  _assert_same_batches([next(restored) for _ in range(8)], following)
  shutil.rmtree(os.path.dirname(source))   # and gone
  restored = _iterator(os.path.join(copy, "train-*.tfrecord"), vocab)
  restored.restore(position)
  _assert_same_batches([next(restored) for _ in range(8)], following)


def test_a_position_saved_over_other_files_is_not_applied(saved, tmp_path, vocab):
  source, position, _ = saved
  pattern = os.path.join(source, "train-*.tfrecord")
  first = next(_iterator(pattern, vocab))
  fx.write_records(os.path.join(source, "train-1.tfrecord"), 48, seed=9)
  iterator = _iterator(pattern, vocab)
  with pytest.raises(InputMovedError, match=r"other input files than .*train-\*\.tfrecord holds "
                     r"now: train-1\.tfrecord (held \d+ bytes then, \d+ now|begins with other)"):
    iterator.restore(position)
  fresh = next(_iterator(pattern, vocab))
  _assert_same_batches([next(iterator)], [fresh])   # left at its first batch
  assert not np.array_equal(fresh["input_ids"], first["input_ids"])   # really other records
  os.remove(os.path.join(source, "train-1.tfrecord"))
  with pytest.raises(InputMovedError, match="train-1.tfrecord is no longer among them"):
    _iterator(pattern, vocab).restore(position)


def test_relative_inputs_cut_paths_at_their_common_folder():
  assert input_pipeline.relative_inputs(["/w/data/a.tfrecord"]) == ("/w/data/", ["a.tfrecord"])
  assert input_pipeline.relative_inputs(["/w/x/a", "/w/y/b"]) == ("/w/", ["x/a", "y/b"])
  assert input_pipeline.relative_inputs(["/w/xa/a", "/w/xb/b"]) == ("/w/", ["xa/a", "xb/b"])
  assert input_pipeline.relative_inputs(["gs://b/run/data/t-0", "gs://b/run/data/t-1"]) == (
      "gs://b/run/data/", ["t-0", "t-1"])
  assert input_pipeline.relative_inputs(["gs://b1/x", "gs://b2/y"]) == ("gs://", ["b1/x", "b2/y"])


def test_a_damaged_position_is_named_not_read(saved, vocab):
  """A state file cut short or changed after it was written: CheckpointDamagedError naming it
  (what sets a checkpoint aside), checked against the digests saved beside it."""
  from bert_jax.io.training_checkpoints import CheckpointDamagedError
  source, position, _ = saved
  data = [n for n in os.listdir(position) if n.startswith("iterator.data")][0]
  with open(os.path.join(position, data), "r+b") as f:
    f.truncate(os.path.getsize(os.path.join(position, data)) - 1)
  with pytest.raises(CheckpointDamagedError, match=rf"position/{data} has \d+ bytes where "
                     r"position\.json records"):
    _iterator(os.path.join(source, "train-*.tfrecord"), vocab).restore(position)


@pytest.mark.parametrize("content", [b"", b"\x82\x01 not a TFRecord file at all" * 8])
def test_a_records_file_that_is_not_one_is_an_error_naming_it(tmp_path, content):
  """What the pipeline reads first (the records' kind and form) from a file that is empty, or of
  other bytes (damaged, overwritten): an error naming the file, not TensorFlow's DataLossError."""
  path = str(tmp_path / "train.tfrecord")
  with open(path, "wb") as f:
    f.write(content)
  for read in (input_pipeline.record_kind, input_pipeline.instance_form):
    with pytest.raises(ValueError, match=f"{path}: (no records|not a readable TFRecord file)"):
      read(path)
