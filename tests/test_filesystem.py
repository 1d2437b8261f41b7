"""bert_jax.io.filesystem on local paths, and its URL code path on TensorFlow's `file://` scheme
(a URL that needs no server; gs:// itself is tested against an emulator elsewhere)."""
import os

import pytest

from bert_jax.io import filesystem


def test_absolute_leaves_urls_alone(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert filesystem.absolute("gs://bucket/run") == "gs://bucket/run"
  assert filesystem.absolute("run") == os.path.join(str(tmp_path), "run")
  assert not filesystem.is_url("/tmp/x") and filesystem.is_url("gs://b/x")


def test_url_path_helpers():
  assert filesystem.join("gs://b/run", "data", "x.txt") == "gs://b/run/data/x.txt"
  assert filesystem.dirname("gs://b/run/x.txt") == "gs://b/run"
  assert filesystem.dirname("gs://b/run/") == "gs://b"
  assert filesystem.basename("gs://b/run/x.txt") == "x.txt"
  assert filesystem.relpath("gs://b/run/ckpt/1", "gs://b/run") == "ckpt/1"
  assert filesystem.relpath("gs://b/run/ckpt/1", "gs://b/run/") == "ckpt/1"
  assert filesystem.relpath("gs://other/x", "gs://b/run") == "gs://other/x"
  assert filesystem.normpath("gs://b/glue/RTE/../diagnostic/d.tsv") == "gs://b/glue/diagnostic/d.tsv"
  assert filesystem.normpath("a/b/../c") == os.path.join("a", "c")
  assert filesystem.has_magic("gs://b/x-*") and not filesystem.has_magic("gs://b/x")


def test_write_text_is_atomic(tmp_path, monkeypatch):
  path = str(tmp_path / "f.json")
  filesystem.write_text(path, "old")
  real_replace = os.replace
  seen = {}

  def replace(source, target):
    seen["during"] = filesystem.read_text(target)  # the old content until the rename
    seen["tmp"] = filesystem.read_text(source)
    real_replace(source, target)

  monkeypatch.setattr(os, "replace", replace)
  filesystem.write_text(path, "néw")
  assert seen == {"during": "old", "tmp": "néw"}
  assert filesystem.read_text(path) == "néw"
  assert filesystem.listdir(str(tmp_path)) == ["f.json"]  # no temporary file left


def test_files_and_directories(tmp_path):
  root = str(tmp_path)
  sub = filesystem.join(root, "a", "b")
  filesystem.makedirs(sub)
  filesystem.makedirs(sub)  # exists already: fine
  assert filesystem.isdir(sub) and not filesystem.isfile(sub)
  path = filesystem.join(sub, "x.txt")
  with filesystem.open(path, "w") as f:
    f.write("one\ntwo\n")
  assert filesystem.isfile(path) and filesystem.exists(path)
  assert filesystem.getsize(path) == 8 and filesystem.mtime(path) > 0
  assert filesystem.glob(filesystem.join(sub, "*.txt")) == [path]
  filesystem.copy(path, filesystem.join(sub, "y.txt"))
  assert filesystem.listdir(sub) == ["x.txt", "y.txt"]
  filesystem.remove(filesystem.join(sub, "y.txt"))
  assert filesystem.listdir(sub) == ["x.txt"]
  with filesystem.open(path, "rb") as f:
    assert f.read() == b"one\ntwo\n"
  filesystem.rmtree(filesystem.join(root, "a"))
  assert not filesystem.exists(filesystem.join(root, "a"))


def test_rename_moves_files_and_trees(tmp_path):
  source = str(tmp_path / "tree")
  filesystem.makedirs(filesystem.join(source, "inner"))
  filesystem.write_text(filesystem.join(source, "top.txt"), "top")
  filesystem.write_text(filesystem.join(source, "inner", "leaf.txt"), "leaf")
  target = str(tmp_path / "moved")
  filesystem.rename(source, target)
  assert not filesystem.exists(source)
  assert filesystem.read_text(filesystem.join(target, "top.txt")) == "top"
  assert filesystem.read_text(filesystem.join(target, "inner", "leaf.txt")) == "leaf"
  filesystem.rename(filesystem.join(target, "top.txt"), str(tmp_path / "top.txt"))
  assert filesystem.read_text(str(tmp_path / "top.txt")) == "top"
  assert filesystem.listdir(target) == ["inner"]


def test_local_copy_and_local_target_pass_local_paths_through(tmp_path):
  path = str(tmp_path / "model.bin")
  with filesystem.local_target(path) as local:
    assert local == path
    with open(local, "wb") as f:
      f.write(b"\x00\x01")
  with filesystem.local_copy(path) as local:
    assert local == path
    with open(local, "rb") as f:
      assert f.read() == b"\x00\x01"


def _file_url(path) -> str:
  pytest.importorskip("tensorflow")
  return "file://" + str(path)


def test_url_text_files_read_like_local_files(tmp_path):
  """Through tf.io.gfile, text modes keep Python's semantics: universal newlines, `newline=""`,
  `errors=` and encodings such as utf-8-sig."""
  raw = "a\r\nb\n\ufeffc\n".encode("utf-8") + b"\xff\n"
  (tmp_path / "t.txt").write_bytes(raw)
  url = _file_url(tmp_path / "t.txt")
  assert filesystem.is_url(url) and filesystem.isfile(url)
  for kwargs in ({}, {"newline": ""}):
    with filesystem.open(url, errors="replace", **kwargs) as f, \
        open(tmp_path / "t.txt", encoding="utf-8", errors="replace", **kwargs) as local:
      assert list(f) == list(local)
  with filesystem.open(url, encoding="utf-8-sig", errors="replace") as f:
    assert f.readline() == "a\n"
  with filesystem.open(url, "rb") as f:
    assert f.readline(1) == b"a" and f.readline() == b"\r\n" and f.read() == raw[3:]


def test_url_writes_and_copies(tmp_path):
  url = _file_url(tmp_path)
  directory = filesystem.join(url, "out", "deep")
  filesystem.makedirs(directory)
  path = filesystem.join(directory, "x.txt")
  filesystem.write_text(path, "héllo\n")
  assert (tmp_path / "out" / "deep" / "x.txt").read_text(encoding="utf-8") == "héllo\n"
  with filesystem.open(path, "a") as f:
    f.write("more\n")
  assert filesystem.read_text(path) == "héllo\nmore\n"
  assert filesystem.glob(filesystem.join(directory, "*.txt")) == [path]
  with filesystem.local_copy(path) as local:
    assert not filesystem.is_url(local)
    with open(local, encoding="utf-8") as f:
      assert f.read() == "héllo\nmore\n"
  target = filesystem.join(directory, "y.bin")
  with filesystem.local_target(target) as local:
    assert not filesystem.is_url(local)
    with open(local, "wb") as f:
      f.write(b"\x01\x02")
  assert (tmp_path / "out" / "deep" / "y.bin").read_bytes() == b"\x01\x02"


def test_a_url_write_the_store_did_not_keep_fails_naming_the_path(tmp_path):
  """A store that acknowledges every byte and keeps none (a name linked to /dev/null): each way
  of writing a URL fails once it is closed, naming the path, instead of returning normally."""
  (tmp_path / "lost").symlink_to(os.devnull)
  lost = _file_url(tmp_path / "lost")
  (tmp_path / "source.bin").write_bytes(b"\x00" * 1000)
  writes = {
      "text": lambda: filesystem.write_text(lost, "x" * 100),
      "binary": lambda: _write_bytes(lost, b"\x01" * 100),
      "copy": lambda: filesystem.copy(str(tmp_path / "source.bin"), lost),
  }
  for name, write in writes.items():
    with pytest.raises(filesystem.WriteNotLandedError, match="lost: .* were written, but the "
                       "store holds 0 bytes") as raised:
      write()
    assert lost in str(raised.value), name


def _write_bytes(path, data):
  with filesystem.open(path, "wb") as f:
    f.write(data)


def test_url_writes_are_checked_against_what_was_written(tmp_path):
  """Appends count what was there before; a checked write that landed returns normally."""
  path = _file_url(tmp_path / "log.txt")
  filesystem.write_text(path, "one\n")
  with filesystem.open(path, "a") as f:
    f.write("two\n")
  _write_bytes(_file_url(tmp_path / "b.bin"), b"\x00" * 3000000)   # over the 1 MB buffer
  assert (tmp_path / "log.txt").read_text() == "one\ntwo\n"
  assert (tmp_path / "b.bin").stat().st_size == 3000000


def test_record_writer_checks_a_url_file_landed(tmp_path):
  tf = pytest.importorskip("tensorflow")
  path = _file_url(tmp_path / "r.tfrecord")
  records = [b"a" * 10, b"", b"\xff" * 300]
  with filesystem.RecordWriter(path) as writer:
    for record in records:
      writer.write(record)
  assert list(tf.data.TFRecordDataset(path).as_numpy_iterator()) == records
  (tmp_path / "lost").symlink_to(os.devnull)
  lost = _file_url(tmp_path / "lost")
  with pytest.raises(filesystem.WriteNotLandedError, match="lost: 26 bytes were written"):
    with filesystem.RecordWriter(lost) as writer:
      writer.write(b"0123456789")


def _tree(root):
  """A local tree with a nested file and an empty folder (a SavedModel's assets/)."""
  os.makedirs(os.path.join(root, "variables"))
  os.makedirs(os.path.join(root, "assets"))
  open(os.path.join(root, "saved_model.pb"), "wb").close()
  with open(os.path.join(root, "variables", "variables.data"), "wb") as f:
    f.write(b"\x07" * 5000)
  return root


def test_upload_tree_lands_every_file_and_checks_the_listing(tmp_path):
  local = _tree(str(tmp_path / "local"))
  url = _file_url(tmp_path / "remote")
  assert filesystem.upload_tree(local, url) == {"saved_model.pb": 0,
                                                "variables/variables.data": 5000}
  assert filesystem.tree_sizes(url) == filesystem.tree_sizes(local)
  assert filesystem.isdir(filesystem.join(url, "assets"))
  os.remove(tmp_path / "remote" / "saved_model.pb")   # lost after its own write was checked
  with pytest.raises(filesystem.WriteNotLandedError,
                     match=r"remote/saved_model\.pb: the write finished, but the object is not "
                           r"there \(1 of the 2 files written to .*remote are missing"):
    filesystem.check_tree_landed(url, filesystem.tree_sizes(local))
  os.truncate(tmp_path / "remote" / "variables" / "variables.data", 10)
  with pytest.raises(filesystem.WriteNotLandedError, match=r"variables\.data: 5000 bytes were "
                     "written, but the store holds 10 bytes there"):
    filesystem.check_tree_landed(url, {"variables/variables.data": 5000})


def test_local_directory_target_uploads_checked(tmp_path):
  """A writer that writes URLs itself writes locally instead; a file the store does not keep
  (a name linked to /dev/null) fails the block, naming it."""
  url = _file_url(tmp_path / "out")
  with filesystem.local_directory_target(url) as local:
    assert not filesystem.is_url(local)
    _tree(local)
  assert filesystem.tree_sizes(url) == {"saved_model.pb": 0, "variables/variables.data": 5000}
  (tmp_path / "lost").mkdir()
  os.makedirs(tmp_path / "lost" / "variables")
  (tmp_path / "lost" / "variables" / "variables.data").symlink_to(os.devnull)
  with pytest.raises(filesystem.WriteNotLandedError,
                     match=r"lost/variables/variables\.data: 5000 bytes were written, but the "
                           "store holds 0 bytes"):
    with filesystem.local_directory_target(_file_url(tmp_path / "lost")) as local:
      _tree(local)
  with filesystem.local_directory_target(str(tmp_path / "plain")) as local:   # a local path
    assert local == str(tmp_path / "plain") and os.path.isdir(local)
