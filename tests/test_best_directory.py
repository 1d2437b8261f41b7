"""WORKDIR/best/ is replaced whole: `save_best` writes the new one into `best.partial/` and
swaps it in with two renames (the old one to `best.old/`, removed last). Every state a save can
stop in (a crash between the renames; on Cloud Storage, where a rename is a copy and a delete, a
directory caught half-copied) still has a complete best model that every reader finds, and the
next save, or the end of the run, puts it back at best/."""
import json
import os
import re
import shutil
import types

import jax
import numpy as np
import pytest

from bert_jax.io import checkpoints, file_digests, filesystem
from bert_jax.tasks.framework import best_model
from bert_jax.tasks.tools import fine_tuned
from bert_jax.text import tokenization
from experiments import glue
from tests import finetuning_fixtures as fx


def tiny_model(directory):
  """(bert_config, encoder params, tokenizer, task config) of a tiny MRPC model."""
  source = fx.write_checkpoint(directory)
  bert_config, encoder = checkpoints.load_pretrained(source)
  config = glue.get_config("task=mrpc")
  config.init_checkpoint = source
  tokenizer = tokenization.FullTokenizer(os.path.join(source, "vocab.txt"), do_lower_case=True)
  return bert_config, encoder, tokenizer, config


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  return tiny_model(str(tmp_path_factory.mktemp("encoder")))


def save(model, directory, step, tokenizer=None):
  """A best model whose weights (and best.json) say which step it is."""
  bert_config, encoder, model_tokenizer, config = model
  tokenizer = tokenizer or model_tokenizer
  head = {"classifier": {"kernel": np.full((bert_config.hidden_size, 2), step, np.float32),
                         "bias": np.zeros(2, np.float32)}}
  encoder = jax.tree_util.tree_map(lambda x: np.asarray(x) + step, encoder["bert"])
  best_model.save_best(directory, bert_config, {"bert": encoder, "head": head},
                       {"step": step, "metric": "f1", "value": float(step), "metrics": {}},
                       tokenizer, config)


def step_of(directory):
  """The step of the best model in `directory`, read as every reader reads it."""
  kernel = best_model.read_head(directory)["classifier"]["kernel"]
  best_model.check_best(directory)
  return int(kernel[0, 0])


def _crash_between_the_renames(model, workdir):
  """WORKDIR as a save of step 2 leaves it when it stops after moving the old best/ aside."""
  best = os.path.join(workdir, "best")
  save(model, best, 1)
  save(model, os.path.join(workdir, "new"), 2)
  os.rename(best, best + ".old")
  os.rename(os.path.join(workdir, "new"), best + ".partial")
  return best


def test_a_save_replaces_best_whole_and_leaves_nothing_beside_it(model, tmp_path):
  best = str(tmp_path / "best")
  save(model, best, 1)
  save(model, best, 2)
  assert sorted(os.listdir(tmp_path)) == ["best"]
  assert step_of(best) == 2
  assert best_model.read_best_info(str(tmp_path))["step"] == 2


def test_a_crash_between_the_renames_leaves_the_new_best_found_by_every_reader(model, tmp_path):
  workdir = str(tmp_path)
  best = _crash_between_the_renames(model, workdir)
  assert not os.path.exists(best)
  assert best_model.best_location(best) == best + ".partial"
  assert best_model.read_best_info(workdir)["step"] == 2
  for path in (workdir, best):   # predict and export take a workdir or its best/
    assert fine_tuned.best_directory(path) == best + ".partial"
  assert int(fine_tuned.load(workdir).params["head"]["classifier"]["kernel"][0, 0]) == 2

  best_model.settle_best(best)   # what the end of the run (and the next save) does first
  assert sorted(os.listdir(workdir)) == ["best"]
  assert step_of(best) == 2


def test_a_half_copied_best_is_passed_over_for_the_complete_one(model, tmp_path):
  """On Cloud Storage best/ -> best.old/ is a copy, then a delete: best.old/ copied whole and
  best/ half deleted (best.json still there) is found as best.old/."""
  workdir = str(tmp_path)
  best = os.path.join(workdir, "best")
  save(model, best, 1)
  shutil.copytree(best, best + ".old")
  os.remove(os.path.join(best, best_model.HEAD_FILE))
  assert best_model.best_location(best) == best + ".old"
  assert best_model.read_best_info(workdir)["step"] == 1
  save(model, best, 2)
  assert sorted(os.listdir(workdir)) == ["best"]
  assert step_of(best) == 2


def test_a_save_after_a_crash_between_the_renames_ends_with_only_best(model, tmp_path):
  workdir = str(tmp_path)
  best = _crash_between_the_renames(model, workdir)
  save(model, best, 3)
  assert sorted(os.listdir(workdir)) == ["best"]
  assert step_of(best) == 3


def test_a_save_killed_while_writing_leaves_the_old_best_in_place(model, tmp_path):
  workdir = str(tmp_path)
  best = os.path.join(workdir, "best")
  save(model, best, 1)
  save(model, best + ".partial", 2)
  os.remove(os.path.join(best + ".partial", best_model.BEST_INFO))   # killed before best.json
  assert best_model.best_location(best) == best
  assert best_model.read_best_info(workdir)["step"] == 1
  save(model, best, 3)
  assert sorted(os.listdir(workdir)) == ["best"]
  assert step_of(best) == 3


def test_a_save_that_fails_half_way_keeps_the_best_before_it(model, tmp_path):
  """The new encoder is written, then the vocabulary cannot be copied (gone here; on a full disk,
  no room): the best/ before it is untouched (was: its encoder overwritten in place), nothing
  is left beside it, and the error names both."""
  best = str(tmp_path / "best")
  save(model, best, 1)
  gone = types.SimpleNamespace(vocab_file=str(tmp_path / "gone" / "vocab.txt"))
  with pytest.raises(best_model.BestWriteError,
                     match=rf"best model of step 2 in {re.escape(best)}\.partial .*"
                           rf"{re.escape(best)} holds the best model before it"):
    save(model, best, 2, tokenizer=gone)
  assert sorted(os.listdir(tmp_path)) == ["best"]
  assert step_of(best) == 1


def test_a_damaged_best_is_still_named_by_check_best(model, tmp_path):
  """Nothing complete beside it: the damaged best/ is returned, and its damage named."""
  best = str(tmp_path / "best")
  save(model, best, 1)
  with open(os.path.join(best, best_model.HEAD_FILE), "r+b") as f:
    f.truncate(10)
  assert fine_tuned.best_directory(str(tmp_path)) == best
  with pytest.raises(file_digests.DamagedFileError, match="head.safetensors has 10 bytes"):
    best_model.check_best(best)


def _replace(path, value):
  os.remove(path)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f)


# best.json as the workdir fuzzer leaves it (benchmarks/workdir_fuzz.py): before, a resumed run
# or the end of a run failed with a JSONDecodeError, a KeyError or a TypeError naming nothing,
# read a file outside through a link, or read /dev/zero until killed.
BEST_JSON_DAMAGES = {
    "cut short": lambda path, outside: open(path, "r+b").truncate(os.path.getsize(path) // 2),
    "emptied": lambda path, outside: open(path, "wb").close(),
    "not UTF-8": lambda path, outside: open(path, "wb").write(b"\xff\xfe{" * 20),
    "a list": lambda path, outside: _replace(path, [1, 2]),
    "a string step": lambda path, outside: _replace(path, {"step": "4", "value": 0.5}),
    "a string value": lambda path, outside: _replace(path, {"step": 4, "value": "0.5"}),
    "no value": lambda path, outside: _replace(path, {"step": 4, "metric": "f1"}),
    "every name climbing out": lambda path, outside: _replace(path, {"../../x": "../../x"}),
    "digests of another type": lambda path, outside: _replace(
        path, {"step": 4, "value": 0.5, "file_digests": ["vocab.txt"]}),
    "a link outside": lambda path, outside: (os.remove(path), os.symlink(outside, path)),
    "a link to /dev/zero": lambda path, outside: (os.remove(path), os.symlink("/dev/zero", path)),
    "a directory": lambda path, outside: (os.remove(path), os.mkdir(path)),
}


@pytest.mark.parametrize("damage", list(BEST_JSON_DAMAGES))
def test_a_damaged_best_json_is_an_error_naming_it_nothing_read_outside(model, tmp_path, damage):
  best = str(tmp_path / "best")
  save(model, best, 1)
  outside = tmp_path / "outside.json"
  outside.write_text(json.dumps({"step": 9, "value": 9.0}))
  path = os.path.join(best, best_model.BEST_INFO)
  BEST_JSON_DAMAGES[damage](path, str(outside))
  for read in (best_model.read_best_info, fine_tuned.load):   # a resumed run; predict, export
    with pytest.raises((file_digests.DamagedFileError, filesystem.UnsafeNameError),
                       match=re.escape(path)):
      read(str(tmp_path))
