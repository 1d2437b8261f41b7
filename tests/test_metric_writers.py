"""TensorBoard events of a workdir on a URL (`file://` here: the URL code path without a server;
gs:// with a store that loses the file is tests/faults/test_unlanded_writes.py): written locally,
uploaded whole and checked at every flush (before each checkpoint) and at close."""
import os

import pytest

from bert_jax.runtime.metric_writers import MetricWriter, read_metrics

tf = pytest.importorskip("tensorflow")


def _scalars(directory):
  """{(tag, step): value} of every event file under `directory`."""
  found = {}
  for name in tf.io.gfile.listdir(directory):
    for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
      for value in event.summary.value:
        found[(value.tag, event.step)] = float(tf.make_ndarray(value.tensor))
  return found


def test_events_on_a_url_land_at_flush_and_close(tmp_path):
  workdir = "file://" + str(tmp_path / "run")
  writer = MetricWriter(workdir)
  local = writer._tb_local   # pylint: disable=protected-access  (where the events wait)
  writer.write(1, "train", {"loss": 2.5})
  board = tmp_path / "run" / "tensorboard"
  assert not board.exists() or not os.listdir(board)   # nothing uploaded between checkpoints
  writer.flush()
  assert _scalars(str(board)) == {("train/loss", 1): 2.5}
  writer.write(2, "train", {"loss": 1.5})
  writer.close()
  assert _scalars(str(board)) == {("train/loss", 1): 2.5, ("train/loss", 2): 1.5}
  assert len(os.listdir(board)) == 1 and not os.path.exists(local)
  assert [r["loss"] for r in read_metrics(workdir)] == [2.5, 1.5]


def test_events_on_local_disk_are_written_in_place(tmp_path):
  writer = MetricWriter(str(tmp_path))
  writer.write(1, "eval", {"accuracy": 0.5})
  assert _scalars(str(tmp_path / "tensorboard")) == {("eval/accuracy", 1): 0.5}
  writer.close()


def test_a_killed_writers_event_buffer_is_removed_by_the_next_writer(tmp_path, monkeypatch):
  import subprocess
  import sys
  from bert_jax.runtime import metric_writers
  monkeypatch.setattr(metric_writers.tempfile, "tempdir", str(tmp_path / "tmp"))
  os.makedirs(tmp_path / "tmp")
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  orphan = tmp_path / "tmp" / f"bert_jax_tensorboard_{dead.stdout.strip()}_abc"
  alive = tmp_path / "tmp" / f"bert_jax_tensorboard_{os.getpid()}_def"
  for folder in (orphan, alive):
    folder.mkdir()
    (folder / "events.out.tfevents.1").write_bytes(b"x")
  writer = MetricWriter("file://" + str(tmp_path / "run"))
  assert not orphan.exists() and alive.exists()     # a running process's buffer stays
  own = [p for p in os.listdir(tmp_path / "tmp") if p.startswith(f"bert_jax_tensorboard_{os.getpid()}_")]
  assert len(own) == 2
  writer.close()
  assert os.listdir(tmp_path / "tmp") == [alive.name]
