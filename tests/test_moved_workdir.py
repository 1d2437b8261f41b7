"""A workdir survives being moved or copied: the same command resumes from its newest complete
checkpoint, with the input position exact (the saved position names files relative to their
folder: a copy reads its own files, whether its source is gone or still there, changed or not),
and a failed restore never leaves a broken iterator."""
import os
import shutil

import pytest

from tests import demo_runs

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow

# The quick demo (data built into WORKDIR/data), 8 steps with a checkpoint at every other one.
OVERRIDES = ["--config.num_train_steps=8", "--config.keep_checkpoints=10",
             "--config.eval_every_steps=8"]
# What a resume says when it could not apply the saved input position and replayed to it.
REPLAYED = "input position replayed"


def _demo(workdir):
  return demo_runs.run(workdir, *OVERRIDES)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """An uninterrupted run: checkpoints at steps 2, 4, 6, 8."""
  workdir = str(tmp_path_factory.mktemp("moved") / "original")
  result = _demo(workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  return workdir


def _copy_back_to(source, target, step):
  """`source` copied to `target` as it was right after the checkpoint at `step`."""
  shutil.copytree(source, target)
  checkpoints = os.path.join(target, "checkpoints")
  for name in os.listdir(checkpoints):
    if name.isdigit() and int(name) > step:
      shutil.rmtree(os.path.join(checkpoints, name))


def test_a_copied_workdir_resumes_exactly(finished, tmp_path):
  moved = str(tmp_path / "elsewhere" / "run")
  _copy_back_to(finished, moved, step=4)
  shutil.rmtree(finished + "_gone", ignore_errors=True)
  os.rename(finished, finished + "_gone")   # the old paths no longer exist
  try:
    result = _demo(moved)
  finally:
    os.rename(finished + "_gone", finished)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Resumed from the checkpoint at step 4" in result.stdout, result.stdout[-2000:]
  assert "UNREADABLE" not in result.stdout + result.stderr
  assert REPLAYED not in result.stdout, "the saved input position was not applied"
  assert not os.path.exists(os.path.join(moved, "checkpoints_corrupt"))
  assert demo_runs.untimed_metrics(moved) == demo_runs.untimed_metrics(finished)


@pytest.mark.slow
def test_a_copy_whose_source_is_still_there_reads_only_its_own_files(finished, tmp_path):
  """The source's records replaced by other records (its held-out ones) while the copy resumes:
  a copy that opened any file of its source would read other records (or fail mid-record)."""
  copy = str(tmp_path / "copy")
  _copy_back_to(finished, copy, step=4)
  records = os.path.join(finished, "data", "train.tfrecord")
  os.rename(records, records + ".kept")
  shutil.copyfile(os.path.join(finished, "data", "eval.tfrecord"), records)
  try:
    result = _demo(copy)
  finally:
    os.replace(records + ".kept", records)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Resumed from the checkpoint at step 4" in result.stdout, result.stdout[-2000:]
  assert REPLAYED not in result.stdout, "the saved input position was not applied"
  assert demo_runs.untimed_metrics(copy) == demo_runs.untimed_metrics(finished)


@pytest.mark.slow
def test_a_copy_whose_records_differ_replays_its_input_to_the_step(finished, tmp_path):
  """A position saved over other records (the copy's rewritten: same name, other records) is
  not applied to these: the checkpoint is kept, and the input replayed to its step."""
  copy = str(tmp_path / "copy")
  _copy_back_to(finished, copy, step=4)
  shutil.copyfile(os.path.join(copy, "data", "eval.tfrecord"),
                  os.path.join(copy, "data", "train.tfrecord"))
  result = _demo(copy)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "is of other input files than" in result.stdout, result.stdout[-3000:]
  assert "train.tfrecord held" in result.stdout, result.stdout[-3000:]
  assert "Resumed from the checkpoint at step 4" in result.stdout, result.stdout[-2000:]
  assert REPLAYED in result.stdout
  assert not os.path.exists(os.path.join(copy, "checkpoints_corrupt"))


def test_after_unreadable_checkpoints_the_run_starts_over_with_a_working_input(finished,
                                                                               tmp_path):
  """Every checkpoint's input position unreadable (truncated): each is set aside, and the run
  trains from step 0 on a fresh input pipeline, exactly as an uninterrupted run."""
  copy = str(tmp_path / "copy")
  _copy_back_to(finished, copy, step=4)
  for step in ("2", "4"):
    state_dir = os.path.join(copy, "checkpoints", step, "data", "process_0")
    for name in os.listdir(state_dir):
      if name.startswith("iterator.data"):
        with open(os.path.join(state_dir, name), "r+b") as f:
          f.truncate(8)
  result = _demo(copy)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.count("IS UNREADABLE") == 2
  assert sorted(n.split("-")[0] for n in os.listdir(os.path.join(copy, "checkpoints_corrupt"))) \
      == ["2", "4"]
  assert demo_runs.untimed_metrics(copy) == demo_runs.untimed_metrics(finished)


def test_a_failed_restore_leaves_the_iterator_at_its_first_batch(tmp_path):
  import shutil as sh
  import numpy as np
  import tensorflow as tf
  from bert_jax.io.training_checkpoints import InputMovedError
  from data_pipelines.input_pipeline import PipelineIterator

  def write(directory):
    os.makedirs(directory)
    with tf.io.TFRecordWriter(os.path.join(directory, "x.tfrecord")) as writer:
      for i in range(50):
        writer.write(str(i).encode())

  def pipeline(directory):
    files = [os.path.join(directory, "x.tfrecord")]
    return lambda: (tf.data.TFRecordDataset(files).repeat().shuffle(8, seed=0)
                    .map(lambda x: {"x": tf.strings.to_number(x, tf.int32)}).batch(2))

  old, new = str(tmp_path / "old"), str(tmp_path / "new")
  write(old)
  iterator = PipelineIterator(pipeline(old))
  first = [next(iterator)["x"] for _ in range(3)]
  iterator.save(str(tmp_path / "position"))
  sh.move(old, new)
  moved = PipelineIterator(pipeline(new))
  with pytest.raises(InputMovedError, match="no longer there"):
    moved.restore(str(tmp_path / "position"))
  assert np.array_equal(next(moved)["x"], first[0])   # not StopIteration: a fresh start
  moved.skip(1)
  assert np.array_equal(next(moved)["x"], first[2])
