"""The pre-training data builder on Apache Beam (`--runner=`): the single-machine builder's records
(same seed, same blocks), on the in-memory DirectRunner and, from the command line, on the
multi-process one; statistics as Beam counters; bad input; tensorflow-datasets input."""
import collections
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from data_pipelines import create_pretraining_data as cpd
from tests import test_create_pretraining_data as single_machine_tests

pytest.importorskip("apache_beam", reason="apache-beam is not installed (pip install "
                    "'bert_jax[beam]'), so the Beam builder (--runner) is not tested")
from data_pipelines import beam_pipeline  # noqa: E402

# The single-machine builder's test corpus and helpers.
SEQ, PREDS, ROOT = single_machine_tests.SEQ, single_machine_tests.PREDS, single_machine_tests.ROOT
_read, _tokenizer = single_machine_tests._read, single_machine_tests._tokenizer
OPTIONS = dict(max_seq_length=SEQ, max_predictions_per_seq=PREDS, dupe_factor=2, random_seed=7,
               documents_per_block=25)
MULTI_PROCESS = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return single_machine_tests.write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def split_corpus(corpus, tmp_path_factory):
  """The corpus in three files of 50, 40 and 30 documents: blocks of 25 span files."""
  vocab, text = corpus
  documents = open(text).read().strip("\n").split("\n\n")
  root = tmp_path_factory.mktemp("split")
  files = []
  for i, (start, end) in enumerate([(0, 50), (50, 90), (90, 120)]):
    path = root / f"part{i}.txt"
    path.write_text("\n\n".join(documents[start:end]) + "\n")
    files.append(str(path))
  return vocab, files


@pytest.fixture(scope="module")
def single_machine(split_corpus, tmp_path_factory):
  """buckets -> the single-machine builder's 3 output files and statistics (built once each)."""
  vocab, files = split_corpus
  built = {}

  def build(buckets):
    if buckets not in built:
      outputs = cpd.expand_output_files(
          f"{tmp_path_factory.mktemp('single')}/train.tfrecord@3")
      with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpd, "_num_buckets", lambda input_bytes, options: buckets)
        stats = cpd.create_pretraining_data(files, outputs, _tokenizer(vocab), progress=False,
                                            **OPTIONS)
      built[buckets] = outputs, stats
    return built[buckets]
  return build


def _records(paths):
  return [r.numpy() for r in tf.data.TFRecordDataset(paths)]


def _check_same_records(outputs, expected_outputs):
  assert [os.path.basename(p) for p in outputs] == [
      os.path.basename(p) for p in expected_outputs] == [
      f"train.tfrecord-0000{i}-of-00003" for i in range(3)]
  expected = _records(expected_outputs)
  assert len(expected) > 200
  # The same multiset of serialized tf.train.Examples...
  assert collections.Counter(_records(outputs)) == collections.Counter(expected)
  # ...and in fact the same files, byte for byte (same buckets, shuffle and round-robin).
  for path, expected_path in zip(outputs, expected_outputs):
    assert open(path, "rb").read() == open(expected_path, "rb").read(), path
  assert sorted(os.listdir(os.path.dirname(outputs[0]))) == sorted(
      os.path.basename(p) for p in outputs), "temporary pieces removed"


def _check_counters(result, stats):
  counted = beam_pipeline.counters(result)
  assert counted == {name: getattr(stats, name) for name in beam_pipeline.COUNTED}


def test_in_memory_direct_runner_writes_the_single_machine_records(split_corpus, single_machine,
                                                                   tmp_path, monkeypatch):
  vocab, files = split_corpus
  expected_outputs, expected_stats = single_machine(5)
  monkeypatch.setattr(cpd, "_num_buckets", lambda input_bytes, options: 5)
  outputs = cpd.expand_output_files(f"{tmp_path}/train.tfrecord@3")
  stats, written, result = beam_pipeline.run(files, outputs, _tokenizer(vocab),
                                             pipeline_args=["--runner=DirectRunner"], **OPTIONS)
  _check_same_records(outputs, expected_outputs)
  assert written == stats.instances and stats == expected_stats
  _check_counters(result, stats)


@pytest.mark.slow
def test_multi_process_direct_runner_from_the_command_line(split_corpus, single_machine,
                                                           tmp_path):
  """`--runner` plus Beam's own options, passed through; one shuffle bucket (what the flags
  give this small corpus, in the workers too)."""
  vocab, files = split_corpus
  expected_outputs, expected_stats = single_machine(1)
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  command = [sys.executable, "-m", "data_pipelines.create_pretraining_data",
             f"--input_file={','.join(files)}", f"--output_file={tmp_path}/out/train.tfrecord@3",
             f"--vocab_file={vocab}", f"--stats_file={tmp_path}/stats.json"] + [
             f"--{name}={value}" for name, value in OPTIONS.items()]
  result = subprocess.run(command + ["--runner=DirectRunner"] + MULTI_PROCESS, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "NSP balance" in result.stdout
  _check_same_records(cpd.expand_output_files(f"{tmp_path}/out/train.tfrecord@3"),
                      expected_outputs)
  assert json.load(open(tmp_path / "stats.json")) == dataclasses.asdict(expected_stats)
  # Without --runner, a Beam option is an unknown flag, as it always was.
  result = subprocess.run(command + ["--direct_num_workers=2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 1 and "Unknown command line flag 'direct_num_workers'" in \
      result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_contiguous_instances_from_the_command_line(split_corpus, tmp_path):
  """`--instances=contiguous` (statically masked at 0.30, two passes) on the multi-process
  DirectRunner: the single-machine builder's files and statistics, no NSP labels."""
  vocab, files = split_corpus
  options = dict(OPTIONS, instances="contiguous", masked_lm_prob=0.3)
  expected_outputs = cpd.expand_output_files(f"{tmp_path}/one/train.tfrecord@3")
  with pytest.MonkeyPatch.context() as patch:   # one bucket: what the flags give this corpus
    patch.setattr(cpd, "_num_buckets", lambda input_bytes, options: 1)
    expected_stats = cpd.create_pretraining_data(files, expected_outputs, _tokenizer(vocab),
                                                 progress=False, **options)
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  command = [sys.executable, "-m", "data_pipelines.create_pretraining_data",
             f"--input_file={','.join(files)}", f"--output_file={tmp_path}/out/train.tfrecord@3",
             f"--vocab_file={vocab}", f"--stats_file={tmp_path}/stats.json",
             "--runner=DirectRunner"] + MULTI_PROCESS + [
             f"--{name}={value}" for name, value in options.items()]
  result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "none (contiguous instances)" in result.stdout
  outputs = cpd.expand_output_files(f"{tmp_path}/out/train.tfrecord@3")
  _check_same_records(outputs, expected_outputs)
  assert json.load(open(tmp_path / "stats.json")) == dataclasses.asdict(expected_stats)
  assert expected_stats.is_next == expected_stats.not_next == 0
  assert not any("next_sentence_labels" in tf.train.Example.FromString(r).features.feature
                 for r in _records(outputs))


def test_bad_input_through_beam(corpus, tmp_path, capsys):
  """Invalid UTF-8, an over-long line and empty documents: counted as on one machine, as Beam
  counters, and named with file and line."""
  vocab, _ = corpus
  text = tmp_path / "bad.txt"
  text.write_bytes(b"w1 w2 .\nw3 \xff\xfe w4 .\n\n\n\n" + b"w5 " * 50_000 + b".\nw6 w7 .\n\n"
                   b"w8 w9 .\n")
  options = dict(max_seq_length=SEQ, max_predictions_per_seq=PREDS, dupe_factor=1,
                 max_line_bytes=1000)
  expected = cpd.create_pretraining_data([str(text)], [str(tmp_path / "one.tfrecord")],
                                         _tokenizer(vocab), progress=False, **options)
  capsys.readouterr()
  stats, written, result = beam_pipeline.run(
      [str(text)], [str(tmp_path / "beam.tfrecord")], _tokenizer(vocab),
      pipeline_args=["--runner=DirectRunner"], **options)
  assert stats.bad_utf8_lines == 1 and stats.overlong_lines == 1
  assert stats.documents == 3 and stats.empty_documents == 2
  assert stats.bad_line_locations == [f"{text}:2: invalid UTF-8",
                                      f"{text}:6: line longer than 1000 bytes, cut"]
  assert stats == expected
  _check_counters(result, stats)
  # The end of the Beam run (`beam_pipeline.create_pretraining_data`) names them on stderr.
  cpd.finish(stats, written, 1, 0.0, progress=False)
  err = capsys.readouterr().err
  assert f"{text}:2: invalid UTF-8" in err and f"{text}:6: line longer than 1000" in err


def test_tensorflow_datasets_input_and_url_output_through_beam(corpus, tmp_path):
  """TFDS documents, and an output URL (`file://`, which takes the `gs://` code path of the
  filesystem layer: work directory, shipped vocabulary, pieces, concatenation, summary)."""
  import tensorflow_datasets as tfds
  vocab, _ = corpus
  options = dict(tfds_name="wikipedia/20230601.en", tfds_split="train", max_seq_length=SEQ,
                 max_predictions_per_seq=PREDS, dupe_factor=1, documents_per_block=5)
  with tfds.testing.mock_data(num_examples=12):
    expected = cpd.create_pretraining_data([], [str(tmp_path / "one.tfrecord")],
                                           _tokenizer(vocab), progress=False, **options)
    stats, _, _ = beam_pipeline.run([], [f"file://{tmp_path}/beam.tfrecord"], _tokenizer(vocab),
                                    pipeline_args=["--runner=DirectRunner"], **options)
  assert stats == expected and stats.documents + stats.empty_documents == 12
  assert (open(tmp_path / "beam.tfrecord", "rb").read()
          == open(tmp_path / "one.tfrecord", "rb").read())
  assert sorted(os.listdir(tmp_path)) == ["beam.tfrecord", "one.tfrecord"]
  # A prepared split is read shard by shard, in order.
  assert beam_pipeline.tfds_slices("train", [3, 0, 4]) == ["train[0:3]", "train[3:7]"]


def test_errors_name_the_option_or_path_before_any_work(tmp_path):
  with pytest.raises(ValueError, match="--direct_num_worker"):
    beam_pipeline.pipeline_options(["--runner=DirectRunner", "--direct_num_worker=2"])
  beam_pipeline.pipeline_options(["--runner=DirectRunner"] + MULTI_PROCESS)
  with pytest.raises(ValueError, match=f"local path.*{tmp_path}/corpus.txt"):
    beam_pipeline.run([f"{tmp_path}/corpus.txt"], ["gs://bucket/train.tfrecord"], None,
                      pipeline_args=["--runner=DataflowRunner", "--project=p"])
  assert not os.listdir(tmp_path)
