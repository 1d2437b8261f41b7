r"""Finds the unreadable TFRecord files (truncated or corrupted) among a run's inputs.

  python -m data_pipelines.check_records --input_files='records/train-*.tfrecord'

A training run that meets a bad record stops naming the file and record (it reads the files
again after tf.data's error, for up to two minutes: `input_pipeline.first_bad_record`). This
reads every record of every file (a comma list and/or globs, as `config.data.input_files`), with
tf.data's checksums, and prints each bad file with the number of records before the damage and tf.data's reason. Exit
status 1 if any file is bad, 0 otherwise.
"""
import os
from typing import List, Optional, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

from data_pipelines import input_pipeline  # noqa: E402

_INPUT_FILES = flags.DEFINE_string("input_files", None, "Comma list and/or globs of TFRecords.")


def check_file(path: str) -> Tuple[int, Optional[str]]:
  """(records read, None) for a whole file; (records before the damage, reason) otherwise."""
  count = 0
  try:
    for _ in tf.data.TFRecordDataset(path):
      count += 1
  except tf.errors.DataLossError as e:
    return count, input_pipeline.tf_error_reason(e)
  return count, None


def bad_files(file_patterns: str) -> List[Tuple[str, int, str]]:
  """[(path, records before the damage, reason)] of the unreadable files, in file order."""
  bad = []
  for path in input_pipeline.expand_patterns(file_patterns):
    count, reason = check_file(path)
    print(f"{path}: {count} records" + (f", then UNREADABLE: {reason}" if reason else ""),
          flush=True)
    if reason:
      bad.append((path, count, reason))
  return bad


def main(argv):
  del argv
  bad = bad_files(_INPUT_FILES.value)
  if bad:
    print(f"{len(bad)} unreadable file(s): " + ", ".join(path for path, _, _ in bad))
    raise SystemExit(1)
  print("All files read cleanly.")


if __name__ == "__main__":
  flags.mark_flag_as_required("input_files")
  app.run(main)
