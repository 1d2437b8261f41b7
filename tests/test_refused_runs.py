"""A refused run changes nothing: each refusal (another architecture, with or without the
workdir's bert_config.json; another vocabulary; a held lock; a bad bucket; a bad flag) leaves the
workdir byte for byte as it was. What describes a run (environment.jsonl's line,
bert_config.json) is written only once its job starts training, every check passed."""
import copy
import os
import subprocess
import sys

import pytest

from bert_jax.io import training_checkpoints
from bert_jax.tasks import registry
from tests import pretraining_fixtures as fx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree(root: str) -> dict:
  """{relative path: ("dir",) | ("link", target) | ("file", bytes)} of everything under root."""
  found = {}
  for directory, dirs, files in os.walk(root):
    for name in dirs + files:
      path = os.path.join(directory, name)
      key = os.path.relpath(path, root)
      if os.path.islink(path):
        found[key] = ("link", os.readlink(path))
      elif os.path.isdir(path):
        found[key] = ("dir",)
      else:
        with open(path, "rb") as f:
          found[key] = ("file", f.read())
  return found


def _changed(before: dict, after: dict) -> list:
  return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """(config, workdir) of a finished 4-step run through `registry.run`, as main runs it."""
  base = tmp_path_factory.mktemp("refused")
  config = fx.tiny_config(str(base / "data"), num_train_steps=4, checkpoint_every_steps=2,
                          eval_every_steps=0)
  workdir = str(base / "work")
  registry.run(config, workdir)
  assert os.path.exists(os.path.join(workdir, "environment.jsonl"))
  return config, workdir


def _refused(workdir: str, run, error, match: str) -> None:
  before = tree(workdir)
  with pytest.raises(error, match=match):
    run()
  assert not _changed(before, tree(workdir)), _changed(before, tree(workdir))


def test_another_architecture_is_refused_and_changes_nothing(finished):
  config, workdir = finished
  other = copy.deepcopy(config)
  other.model.hidden_size, other.num_train_steps = 64, 6
  _refused(workdir, lambda: registry.run(other, workdir),
           training_checkpoints.CheckpointMismatchError, r"hidden_size: 32 -> 64")


def test_another_architecture_without_bert_config_json_writes_none(finished, tmp_path):
  """Only checkpoints/ copied: the refusal comes from the checkpoint, and leaves no
  bert_config.json of the wrong architecture behind to block the right run."""
  config, workdir = finished
  import shutil
  copied = str(tmp_path / "copied")
  shutil.copytree(workdir, copied)
  os.remove(os.path.join(copied, training_checkpoints.BERT_CONFIG))
  other = copy.deepcopy(config)
  other.model.num_attention_heads, other.num_train_steps = 4, 6
  _refused(copied, lambda: registry.run(other, copied),
           training_checkpoints.CheckpointMismatchError, "num_attention_heads")
  right = copy.deepcopy(config)
  right.num_train_steps = 6
  registry.run(right, copied)   # the right config is not blocked by the refusal
  assert os.path.exists(os.path.join(copied, training_checkpoints.BERT_CONFIG))


def test_a_held_lock_refuses_the_run_and_changes_nothing(finished):
  from bert_jax.io import workdir_lock
  config, workdir = finished
  lock = workdir_lock.acquire(workdir, say=lambda text: None)
  try:
    _refused(workdir, lambda: registry.run(config, workdir), workdir_lock.WorkdirInUseError,
             "is in use")
  finally:
    lock.release()


def _main(*args):
  return subprocess.run([sys.executable, "-m", "bert_jax.main", *args], capture_output=True,
                        text=True, cwd=ROOT, timeout=600,
                        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT))


@pytest.mark.slow
@pytest.mark.parametrize("flag, message", [
    ("--config.data.eval_input_files=gs://Bad_Bucket/eval", "bucket"),
    ("--config.no_such_field=1", "no_such_field")])
def test_a_bad_bucket_or_flag_is_refused_and_changes_nothing(finished, tmp_path, flag, message):
  config, workdir = finished
  experiment = fx.write_experiment(str(tmp_path), os.path.dirname(config.data.eval_input_files),
                                   num_train_steps=6, checkpoint_every_steps=2,
                                   eval_every_steps=0)
  before = tree(workdir)
  result = _main(f"--config={experiment}", f"--workdir={workdir}", flag)
  assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]
  assert not _changed(before, tree(workdir))


@pytest.mark.slow
def test_another_vocabulary_is_refused_and_changes_nothing(tmp_path):
  """WORKDIR/data built from the demo corpus with its learned vocabulary; the same workdir run
  with another vocabulary file: refused, the workdir as it was."""
  from experiments import pretrain_demo
  config = pretrain_demo.get_config("quick")
  config.data.demo_max_documents, config.num_train_steps = 50, 1
  workdir = str(tmp_path / "work")
  registry.run(config, workdir)
  other_vocab = tmp_path / "other_vocab.txt"
  other_vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]))
  other = copy.deepcopy(config)
  other.tokenizer.vocab_file, other.num_train_steps = str(other_vocab), 2
  _refused(workdir, lambda: registry.run(other, workdir), ValueError,
           "is not the one .* was built with")
