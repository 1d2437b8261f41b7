"""A bad TFRecord shard among the pre-training inputs (`config.data.input_files`): a truncated
file, a garbage file, records missing a feature (or with it renamed) and a record with a feature
of the wrong length. Each stops the run before or at its first step with an error naming the
file and the record; none is silently dropped.

A garbage file, or one whose first record lacks a feature, fails when the pipeline is built (the
first record of every file is checked); damage further into a file fails when tf.data reaches
it, and the files are then read again to name the record."""
import os
import subprocess

import pytest
import tensorflow as tf

from bert_jax.tasks.jobs import pretraining
from data_pipelines import features as F
from data_pipelines import input_pipeline
from tests import demo_runs
from tests import pretraining_fixtures as fx

SHARD_RECORDS = 10


def _edited(path, edit):
  """Rewrites the records of `path` through `edit(index, example)`."""
  examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path)]
  with tf.io.TFRecordWriter(path) as writer:
    for index, example in enumerate(examples):
      edit(index, example)
      writer.write(example.SerializeToString())


def _rename_segment_ids(index, example):
  del index
  features = example.features.feature
  features["segment_id"].CopyFrom(features[F.SEGMENT_IDS])
  del features[F.SEGMENT_IDS]


def _drop_next_sentence_labels(index, example):
  del index
  del example.features.feature[F.NEXT_SENTENCE_LABELS]


def _lengthen_input_ids_of_record_7(index, example):
  if index == 7:
    example.features.feature[F.INPUT_IDS].int64_list.value.extend([0] * 8)


def _bad_shard(directory, fault):
  """A good shard of SHARD_RECORDS records with `fault` done to it; its path."""
  path = fx.write_records(os.path.join(str(directory), "shard.tfrecord"), SHARD_RECORDS, seed=5)
  whole = open(path, "rb").read()
  if fault == "truncated":
    open(path, "wb").write(whole[:-10])   # the last record cut short
  elif fault == "garbage":
    open(path, "wb").write(os.urandom(4096))
  else:
    _edited(path, {"renamed feature": _rename_segment_ids,
                   "missing feature": _drop_next_sentence_labels,
                   "wrong length": _lengthen_input_ids_of_record_7}[fault])
  return path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("data"))
  fx.make_data(directory)
  return directory


@pytest.mark.parametrize("fault,expected", [
    ("garbage", r"shard\.tfrecord: record 0: unreadable \(corrupted record at 0"),
    ("renamed feature", r"shard\.tfrecord: record 0: feature 'segment_ids' is missing \(the "
     r"record has \[.*'segment_id'\]\)"),
    ("missing feature", r"shard\.tfrecord: record 0: feature 'next_sentence_labels' is missing"),
    ("wrong length", r"shard\.tfrecord: record 7: feature 'input_ids' has 40 values, expected "
     r"32"),
    ("truncated", rf"shard\.tfrecord: record {SHARD_RECORDS - 1}: unreadable \(truncated record"),
])
def test_a_bad_shard_is_named_with_its_record(data_dir, tmp_path, fault, expected):
  shard = _bad_shard(tmp_path, fault)
  config = fx.tiny_config(data_dir)
  config.data.input_files = f"{data_dir}/train-0.tfrecord,{shard}"
  error = (input_pipeline.DataLossError if fault == "truncated"
           else input_pipeline.RecordFormatError)
  with pytest.raises(error, match=expected):
    # What a training run does (tasks/pretraining.py): build the pipeline, read batches.
    iterator = input_pipeline.PipelineIterator(
        lambda: pretraining.input_pipeline_for(config, training=True),
        source=config.data.input_files, spec=pretraining.record_spec(config, training=True))
    for _ in range(40):   # 40 batches of 8 read both files whole at least once
      next(iterator)


def test_the_same_for_evaluation_input(data_dir, tmp_path):
  config = fx.tiny_config(data_dir)
  config.data.eval_input_files = _bad_shard(tmp_path, "wrong length")
  iterator = input_pipeline.PipelineIterator(
      pretraining.input_pipeline_for(config, training=False),
      source=config.data.eval_input_files, spec=pretraining.record_spec(config, training=False))
  with pytest.raises(input_pipeline.RecordFormatError, match=r"record 7: feature 'input_ids'"):
    list(iterator)


@pytest.mark.slow
def test_a_truncated_shard_stops_the_command_at_its_first_step(data_dir, tmp_path):
  shard = _bad_shard(tmp_path, "truncated")
  experiment = fx.write_experiment(
      str(tmp_path), data_dir, **{"data.input_files": f"{data_dir}/train-0.tfrecord,{shard}"})
  workdir = str(tmp_path / "workdir")
  run = subprocess.run(demo_runs.command(workdir)[:3] + [f"--config={experiment}",
                                                          f"--workdir={workdir}"],
                       cwd=demo_runs.ROOT, env=demo_runs.env(), capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 1
  assert f"DataLossError: Unreadable record in {data_dir}/train-0.tfrecord,{shard}" in run.stderr
  assert f"{shard}: record {SHARD_RECORDS - 1}: unreadable (truncated record" in run.stderr
  assert "train step" not in run.stdout + run.stderr   # not one step trained on partial input
