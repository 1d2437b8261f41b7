"""Writes that a planted link cannot redirect: a temporary file is created afresh (never through
an existing `X.tmp`), the final rename replaces a link at `X` instead of writing to its target,
an append or a direct write refuses a link, and the workdir's lock reads, creates and writes no
file through one. The file outside the workdir is never touched."""
import os

import pytest

from bert_jax.io import filesystem, workdir_lock


@pytest.fixture
def planted(tmp_path):
  """(workdir, a file outside it that no write may change)."""
  workdir = tmp_path / "work"
  workdir.mkdir()
  outside = tmp_path / "outside.txt"
  outside.write_text("kept")
  return workdir, outside


def test_write_text_replaces_a_planted_link_and_never_writes_through_a_planted_tmp(planted):
  workdir, outside = planted
  os.symlink(outside, workdir / "a.json.tmp")
  filesystem.write_text(str(workdir / "a.json"), "new")
  os.symlink(outside, workdir / "b.json")
  filesystem.write_text(str(workdir / "b.json"), "new")
  assert outside.read_text() == "kept"
  for name in ("a.json", "b.json"):
    assert not os.path.islink(workdir / name) and (workdir / name).read_text() == "new"
  assert not os.path.lexists(workdir / "a.json.tmp")


def test_copy_replaces_a_planted_link_at_its_target(planted, tmp_path):
  workdir, outside = planted
  source = tmp_path / "source.txt"
  source.write_text("copied")
  os.symlink(outside, workdir / "vocab.txt")
  os.symlink(outside, workdir / "vocab.txt.tmp")
  filesystem.copy(str(source), str(workdir / "vocab.txt"))
  assert outside.read_text() == "kept"
  assert not os.path.islink(workdir / "vocab.txt")
  assert (workdir / "vocab.txt").read_text() == "copied"


@pytest.mark.parametrize("mode", ["a", "w", "ab", "wb"])
def test_an_append_or_a_direct_write_refuses_a_link(planted, mode):
  workdir, outside = planted
  os.symlink(outside, workdir / "metrics.jsonl")
  with pytest.raises(filesystem.LinkNotFollowedError, match=r"metrics\.jsonl is a symbolic "
                     r"link \(to .*outside\.txt\)"):
    filesystem.open(str(workdir / "metrics.jsonl"), mode)
  assert outside.read_text() == "kept"


def test_the_metric_writer_refuses_a_metrics_file_linked_out_of_the_workdir(planted):
  from bert_jax.runtime.metric_writers import MetricWriter
  workdir, outside = planted
  os.symlink(outside, workdir / "metrics.jsonl")
  with pytest.raises(filesystem.UnsafeNameError,
                     match=r"'metrics\.jsonl' \(.*/metrics\.jsonl\) leads out of"):
    MetricWriter(str(workdir), resume_step=0)
  assert outside.read_text() == "kept"


@pytest.mark.parametrize("where", ["folder", "file"])
def test_the_metric_writer_refuses_a_tensorboard_folder_or_file_linked_out(planted, tmp_path,
                                                                          where):
  """TensorFlow's event writer follows links: the tensorboard folder, or a file in it, linked
  out of the workdir is refused by name before anything is written."""
  from bert_jax.runtime.metric_writers import MetricWriter
  workdir, outside = planted
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  if where == "folder":
    os.symlink(elsewhere, workdir / "tensorboard")
  else:
    (workdir / "tensorboard").mkdir()
    os.symlink(outside, workdir / "tensorboard" / "events.out.tfevents.1")
  with pytest.raises(filesystem.UnsafeNameError, match=r"leads out of"):
    MetricWriter(str(workdir), resume_step=0)
  assert outside.read_text() == "kept" and not os.listdir(elsewhere)


@pytest.mark.parametrize("planted_name", [workdir_lock.LOCK_FILE,
                                          workdir_lock.LOCK_FILE + ".guard"])
def test_the_lock_goes_through_no_planted_link(planted, planted_name):
  workdir, outside = planted
  os.symlink(outside, workdir / planted_name)
  with pytest.raises(OSError, match=f"{planted_name} is a symbolic link"):
    workdir_lock.acquire(str(workdir), say=lambda text: None)
  assert outside.read_text() == "kept"


def test_the_lock_refuses_a_fifo_in_its_place_without_waiting(planted):
  workdir, _ = planted
  os.mkfifo(workdir / workdir_lock.LOCK_FILE)
  with pytest.raises(OSError, match="is not a regular file"):
    workdir_lock.acquire(str(workdir), say=lambda text: None)
