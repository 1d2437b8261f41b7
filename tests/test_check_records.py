"""Unreadable TFRecord files: the training iterator's error names its input, and
`data_pipelines.check_records` names the bad file."""
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from data_pipelines import check_records, input_pipeline
from tests import pretraining_fixtures as fx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _files(directory):
  """good.tfrecord (20 records), truncated.tfrecord (its last record cut short) and
  corrupted.tfrecord (one byte of the 6th record's payload changed: a checksum mismatch)."""
  good = fx.write_records(str(directory / "good.tfrecord"), 20, seed=1)
  whole = open(good, "rb").read()
  (directory / "truncated.tfrecord").write_bytes(whole[:-10])
  sizes = [len(r.numpy()) for r in tf.data.TFRecordDataset(good)]
  offset = sum(16 + n for n in sizes[:5]) + 12 + 3   # into the payload of record 5 (0-based)
  damaged = bytearray(whole)
  damaged[offset] ^= 0xFF
  (directory / "corrupted.tfrecord").write_bytes(bytes(damaged))
  return str(directory / "*.tfrecord")


def test_check_records_names_each_bad_file_and_where(tmp_path):
  pattern = _files(tmp_path)
  bad = check_records.bad_files(pattern)
  assert [(os.path.basename(p), n) for p, n, _ in bad] == [("corrupted.tfrecord", 5),
                                                           ("truncated.tfrecord", 19)]
  assert "corrupted record" in bad[0][2] and "truncated record" in bad[1][2]
  assert "{{" not in bad[0][2] and "[Op:" not in bad[0][2]


@pytest.mark.slow
def test_check_records_command_exit_status(tmp_path):
  pattern = _files(tmp_path)
  env = dict(os.environ, PYTHONPATH=ROOT)
  run = lambda files: subprocess.run(
      [sys.executable, "-m", "data_pipelines.check_records", f"--input_files={files}"],
      cwd=ROOT, env=env, capture_output=True, text=True)
  failed = run(pattern)
  assert failed.returncode == 1, failed.stderr[-2000:]
  assert "2 unreadable file(s)" in failed.stdout
  assert f"{tmp_path}/good.tfrecord: 20 records\n" in failed.stdout
  clean = run(str(tmp_path / "good.tfrecord"))
  assert clean.returncode == 0 and "All files read cleanly." in clean.stdout


def test_training_iterator_error_names_its_input(tmp_path):
  pattern = _files(tmp_path)
  path = str(tmp_path / "corrupted.tfrecord")
  iterator = input_pipeline.PipelineIterator(
      tf.data.TFRecordDataset(path).map(lambda record: {"record": record}), source=pattern)
  for _ in range(5):
    next(iterator)
  with pytest.raises(input_pipeline.DataLossError,
                     match=r"Unreadable record in .*\*\.tfrecord \(corrupted record at \d+\)"):
    next(iterator)
