"""One confinement rule for every name a run reads back from its workdir (`filesystem.confined`):
a name in a checkpoint's `position.json`, `data/DONE`, `best.json` or a sharded checkpoint's index
that leads out of its folder (`..`, an absolute path, a link) or at a file that is not a regular
one (a FIFO, `/dev/zero`) is a clear error naming the file that held it: nothing outside is read,
nothing hangs, and no checkpoint is moved aside."""
import hashlib
import json
import os
import signal
import shutil

import pytest

from bert_jax.io import file_digests, filesystem
from tests import pretraining_fixtures as fx


@pytest.fixture(autouse=True)
def _never_hang():
  """A read that would block on a FIFO or never end on /dev/zero fails the test in 240 s (a
  bound on the whole test, its short training run included, on a loaded machine)."""
  def expire(signum, frame):
    raise TimeoutError("a read did not end: a name was not confined")
  previous = signal.signal(signal.SIGALRM, expire)
  signal.alarm(240)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("name, why", [
    ("../outside", "climbs out"), ("a/../../outside", "climbs out"), ("a//b", "climbs out"),
    ("./a", "climbs out"), ("/etc/hostname", "not a relative name"),
    ("gs://bucket/x", "not a relative name"), ("a\\..\\b", "not a relative name"),
    ("", "not a file name"), (7, "not a file name")])
def test_a_name_out_of_the_folder_is_refused_naming_the_file_that_held_it(tmp_path, name, why):
  with pytest.raises(filesystem.UnsafeNameError, match=rf"^RECORD: the name .* {why}"):
    filesystem.confined(str(tmp_path), name, held_by="RECORD")


def test_links_out_and_special_files_are_refused_plain_names_inside_are_not(tmp_path):
  folder = tmp_path / "folder"
  (folder / "sub").mkdir(parents=True)
  (folder / "sub" / "file").write_text("x")
  (tmp_path / "outside").write_text("secret")
  os.symlink(tmp_path / "outside", folder / "link_out")
  os.symlink(folder / "sub" / "file", folder / "link_in")
  os.symlink("/dev/zero", folder / "zero")
  os.mkfifo(folder / "fifo")
  assert filesystem.confined(str(folder), "sub/file", "R") == str(folder / "sub" / "file")
  assert filesystem.confined(str(folder), "link_in", "R") == str(folder / "link_in")
  assert filesystem.confined(str(folder), "not_yet", "R") == str(folder / "not_yet")
  assert filesystem.confined(str(folder), "sub", "R", folder=True) == str(folder / "sub")
  for name, why in [("link_out", "leads out of .* through a link"),
                    ("zero", "leads out of .* through a link"),
                    ("fifo", "is not a regular file"), ("sub", "is not a regular file")]:
    with pytest.raises(filesystem.UnsafeNameError, match=why):
      filesystem.confined(str(folder), name, "R")
  with pytest.raises(filesystem.UnsafeNameError, match="is not a directory"):
    filesystem.confined(str(folder), "sub/file", "R", folder=True)


def test_a_digest_record_naming_a_file_outside_reads_nothing(tmp_path):
  """The digest check opens no recorded name before it is confined: a FIFO outside, which any
  read would block on, is never opened."""
  folder = tmp_path / "folder"
  folder.mkdir()
  os.mkfifo(tmp_path / "fifo")
  recorded = {"../fifo": {"bytes": 0, "sha256": hashlib.sha256(b"").hexdigest()}}
  with pytest.raises(filesystem.UnsafeNameError, match=r"position\.json: the name '\.\./fifo'"):
    file_digests.check(str(folder), recorded, "position.json")


def _plant(position_dir: str, damage: str, outside: str) -> None:
  """One crafted change to a checkpoint's input position (`position_dir`: data/process_0)."""
  record_path = os.path.join(position_dir, "position.json")
  if damage == "name out":   # a recorded state name climbing out, its digest made to match
    with open(outside, "rb") as f:
      data = f.read()
    with open(record_path) as f:
      record = json.load(f)
    record["state"]["../../../../../outside"] = {"bytes": len(data),
                                                 "sha256": hashlib.sha256(data).hexdigest()}
    with open(record_path, "w") as f:
      json.dump(record, f)
  elif damage == "position is /dev/zero":
    os.remove(record_path)
    os.symlink("/dev/zero", record_path)
  elif damage == "state is a fifo":
    index = os.path.join(position_dir, "iterator.index")
    os.remove(index)
    os.mkfifo(index)


@pytest.mark.parametrize("damage", ["name out", "position is /dev/zero", "state is a fifo"])
def test_a_crafted_input_position_stops_the_run_and_moves_no_checkpoint(tmp_path, damage):
  from bert_jax.tasks import registry
  data = str(tmp_path / "data")
  fx.make_data(data, train_count=64, eval_count=16)
  config = fx.tiny_config(data, num_train_steps=4, checkpoint_every_steps=2, eval_every_steps=0)
  workdir = str(tmp_path / "work")
  registry.run_job(config, workdir)
  outside = str(tmp_path / "outside")
  with open(outside, "w") as f:
    f.write("not the workdir's")
  position_dir = os.path.join(workdir, "checkpoints", "4", "data", "process_0")
  _plant(position_dir, damage, outside)
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  config.num_train_steps = 6
  with pytest.raises(filesystem.UnsafeNameError, match=r"position\.json|process_0"):
    registry.run_job(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before
  assert not os.path.exists(os.path.join(workdir, "checkpoints_corrupt"))
  assert os.path.isdir(position_dir)


def test_a_done_file_linked_out_of_the_data_folder_is_refused(tmp_path):
  from data_pipelines import workdir_data
  data = tmp_path / "data"
  data.mkdir()
  os.symlink("/dev/zero", data / "DONE")
  with pytest.raises(filesystem.UnsafeNameError, match="DONE"):
    workdir_data._read_done(str(data / "DONE"))


def test_a_sharded_checkpoint_index_naming_a_shard_outside_is_refused(tmp_path):
  from bert_jax.io import checkpoints
  model = tmp_path / "model"
  model.mkdir()
  shutil.copy(os.devnull, tmp_path / "elsewhere.safetensors")
  (model / "model.safetensors.index.json").write_text(
      json.dumps({"weight_map": {"w": "../elsewhere.safetensors"}}))
  with pytest.raises(filesystem.UnsafeNameError, match=r"model\.safetensors\.index\.json"):
    checkpoints._read_safetensors(str(model))


@pytest.mark.parametrize("recorded", [
    ["vocab.txt"], {"vocab.txt": 5}, {"vocab.txt": {"bytes": "5"}}])
def test_digests_of_other_types_are_damage_naming_their_file(tmp_path, recorded):
  """A digest record (DONE's vocabulary, best.json's files) of other JSON types: the record
  file named as damaged, nothing opened."""
  with pytest.raises(file_digests.DamagedFileError, match="DONE: its digests are not"):
    file_digests.check(str(tmp_path), recorded, "DONE")
