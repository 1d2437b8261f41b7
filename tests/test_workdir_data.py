"""WORKDIR/data (data_pipelines/workdir_data.py, from a run's config by
bert_jax/tasks/jobs/pretraining_data.py): built once, by one process, and its vocabulary checked on
every later start.

* `workdir_data.prepare` takes explicit arguments (the corpus, `Settings`, `Vocabulary`) and says
  where the records and the learned vocabulary are; `pretraining_data` turns a config into them
  and what was built into config changes.
* Two processes of one run (`--num_processes=2`, one workdir) start the demo from an empty
  workdir: process 0 builds the data while process 1 waits for DONE, process 1 writes nothing
  there (every file each process opens for writing is logged by an audit hook), and both train.
  Only process 0 holds the workdir lock.
* DONE records the vocabulary's size and SHA-256: a vocabulary edited, cut short or replaced
  after the records were built (their ids index it) is an error naming the file; so is a run
  given another vocabulary than the one its records were built with.
"""
import hashlib
import json
import os
import shutil
import time

import pytest

from bert_jax.io import file_digests, workdir_lock
from bert_jax.tasks.jobs import pretraining_data
from data_pipelines import demo_corpus, workdir_data
from tests import test_multihost


def _demo_config():
  from experiments import pretrain_demo
  config = pretrain_demo.get_config("quick")
  config.data.demo_max_documents = 60   # enough for a vocabulary and records; quicker to build
  return config


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """A workdir whose data the demo built once (copied by each test that changes it), by the
  data pipeline's own arguments: nothing of the config reaches it."""
  workdir = str(tmp_path_factory.mktemp("built") / "work")
  config = _demo_config()
  settings = workdir_data.Settings(max_seq_length=config.max_seq_length,
                                   max_predictions_per_seq=config.max_predictions_per_seq,
                                   seed=config.seed, dupe_factor=config.data.dupe_factor,
                                   holdout_every=config.data.holdout_every,
                                   learned_vocab_size=config.model.vocab_size)
  assert pretraining_data.settings(config) == (settings, workdir_data.Vocabulary())
  prepared = workdir_data.prepare(workdir, demo_corpus.corpus(60), settings)
  data = os.path.join(workdir, "data")
  assert prepared == workdir_data.Prepared(
      os.path.join(data, "train.tfrecord"), os.path.join(data, "eval.tfrecord"),
      learned_vocab_file=os.path.join(data, "vocab.txt"),
      learned_vocab_size=prepared.learned_vocab_size)
  with open(prepared.learned_vocab_file) as f:
    assert prepared.learned_vocab_size == len(f.read().splitlines()) > 100
  return workdir


def _copy(built, tmp_path):
  workdir = str(tmp_path / "work")
  shutil.copytree(built, workdir)
  return workdir


def _sha256(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def test_done_records_the_vocabulary_and_a_changed_one_is_an_error_naming_it(built, tmp_path):
  workdir = _copy(built, tmp_path)
  data = os.path.join(workdir, "data")
  vocab = os.path.join(data, "vocab.txt")
  with open(os.path.join(data, workdir_data.DONE)) as f:
    done = json.load(f)
  assert done["vocabulary"] == {"vocab.txt": {"bytes": os.path.getsize(vocab),
                                              "sha256": _sha256(vocab)}}
  assert done["train_documents"] > 0 and done["eval_documents"] > 0
  changes = pretraining_data.data_changes(_demo_config(), workdir)   # unchanged: reused
  assert changes["tokenizer.vocab_file"] == vocab

  # Two tokens swapped: the same size, the same number of tokens, other ids.
  with open(vocab) as f:
    tokens = f.read().splitlines()
  tokens[-1], tokens[-2] = tokens[-2], tokens[-1]
  with open(vocab, "w") as f:
    f.write("\n".join(tokens) + "\n")
  assert os.path.getsize(vocab) == done["vocabulary"]["vocab.txt"]["bytes"]
  with pytest.raises(file_digests.DamagedFileError) as error:
    pretraining_data.data_changes(_demo_config(), workdir)
  assert vocab in str(error.value) and "SHA-256" in str(error.value)
  assert "new workdir" in str(error.value)

  with open(vocab, "w") as f:   # cut short
    f.write("\n".join(tokens[:10]) + "\n")
  with pytest.raises(file_digests.DamagedFileError, match="cut short or replaced") as error:
    pretraining_data.data_changes(_demo_config(), workdir)
  assert vocab in str(error.value)


def test_a_done_marker_of_an_earlier_version_gets_the_digest_recorded(built, tmp_path):
  workdir = _copy(built, tmp_path)
  done = os.path.join(workdir, "data", workdir_data.DONE)
  with open(done, "w") as f:
    f.write("57 train documents, 3 eval documents\n")   # what earlier versions wrote
  pretraining_data.data_changes(_demo_config(), workdir)
  with open(done) as f:
    recorded = json.load(f)["vocabulary"]
  vocab = os.path.join(workdir, "data", "vocab.txt")
  assert recorded["vocab.txt"]["sha256"] == _sha256(vocab)
  with open(vocab, "a") as f:
    f.write("extra\n")
  with pytest.raises(file_digests.DamagedFileError, match="vocab.txt"):
    pretraining_data.data_changes(_demo_config(), workdir)


def test_a_run_given_another_vocabulary_than_its_records_is_an_error_naming_both(built, tmp_path):
  workdir = _copy(built, tmp_path)
  given = str(tmp_path / "given_vocab.txt")
  shutil.copyfile(os.path.join(workdir, "data", "vocab.txt"), given)
  config = _demo_config()
  config.tokenizer.vocab_file = given
  pretraining_data.data_changes(config, workdir)   # the same content: fine
  with open(given, "a") as f:
    f.write("extra\n")
  with pytest.raises(ValueError, match="is not the one") as error:
    pretraining_data.data_changes(config, workdir)
  assert given in str(error.value)
  assert os.path.join(workdir, "data", "vocab.txt") in str(error.value)


@pytest.mark.slow
def test_two_processes_from_an_empty_workdir_build_the_data_once_and_both_train(tmp_path):
  workdir = str(tmp_path / "work")
  writes = str(tmp_path / "writes")
  start = test_multihost._start   # pylint: disable=protected-access
  procs = start("experiments/pretrain_demo.py:quick", workdir, write_log_dir=writes)
  holders = set()
  deadline = time.time() + 600
  try:
    while any(p.poll() is None for p in procs) and time.time() < deadline:
      try:   # who holds the workdir lock while the run goes on
        with open(os.path.join(workdir, workdir_lock.LOCK_FILE)) as f:
          holders.add(json.load(f)["pid"])
      except (OSError, ValueError):
        pass
      time.sleep(0.2)
  finally:
    test_multihost._wait(procs, 1)   # pylint: disable=protected-access
  outputs = test_multihost._outputs(procs)   # pylint: disable=protected-access
  for i, (proc, (out, err)) in enumerate(zip(procs, outputs)):
    assert proc.returncode == 0, f"process {i}:\n{out[-2000:]}\n{err[-4000:]}"
  (out0, _), (out1, _) = outputs
  assert "Building pre-training records" in out0
  assert "Building pre-training records" not in out1
  assert "Process 1: waiting for process 0 to build" in out1
  assert holders == {procs[0].pid}, holders   # process 0 held the lock for both
  assert not os.path.exists(os.path.join(workdir, workdir_lock.LOCK_FILE))   # released

  # Both trained: each saved its own input position with the last checkpoint.
  last = max(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())
  assert {"process_0", "process_1"} <= set(
      os.listdir(os.path.join(workdir, "checkpoints", str(last), "data")))
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    steps = [json.loads(line)["step"] for line in f if '"train"' in line]
  assert steps and steps[-1] == last

  # Process 1 wrote nothing into WORKDIR/data (nor anywhere else but its checkpoint shards).
  written = []
  for proc in procs:
    path = os.path.join(writes, str(proc.pid))
    names = open(path).read().split() if os.path.exists(path) else []
    written.append({os.path.relpath(n, workdir) for n in names
                    if n.startswith(workdir + os.sep)})
  assert any(n.startswith(os.path.join("data", "train.tfrecord")) for n in written[0])
  assert not [n for n in written[1] if not n.startswith("checkpoints")], sorted(written[1])
