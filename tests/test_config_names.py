"""Config names: renamed fields are errors naming the new one (also nested ones such as
`data.vocab_file`), `bert_jax.main` locks the config (a misspelt field is an error), older saved
configs are read under the new names, and deriving values never changes the config given."""
import importlib
import os
import subprocess
import sys
from unittest import mock

import pytest
from absl import flags
from ml_collections import config_flags

from bert_jax import tasks
from bert_jax.runtime import config_names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = ["pretrain_demo:quick", "pretrain_bert_base:phase=2", "continue_pretraining:quick",
               "glue:task=mrpc,quick", "squad:version=2.0,quick", "ner:quick", "swag:quick",
               "ner_feature_based:quick"]


def _parse(experiment: str, *overrides: str):
  """The experiment as `bert_jax.main` parses it (a locked config and its overrides)."""
  argv = ["prog", f"--config={ROOT}/experiments/{experiment}", *overrides]
  values = flags.FlagValues()
  # config_flags reads the overrides from sys.argv.
  with mock.patch.object(sys, "argv", argv):
    config = config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                             lock_config=True)
    values(argv)
  return config.value


@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("old", sorted(config_names.RENAMED))
def test_every_renamed_field_parses_and_names_its_replacement(experiment, old):
  name = experiment.replace(":", ".py:")
  value = "False" if old.endswith("do_lower_case") else "7" if old.endswith("size") else "v.txt"
  config = _parse(name, f"--config.{old}={value}")
  new = config_names.RENAMED[old]
  with pytest.raises(ValueError, match=rf"config\.{old}=.*use config\.{new} "
                                       rf"\(--config\.{new}={value}\)"):
    config_names.check(config)


def test_a_renamed_field_stops_the_run_before_any_work(tmp_path):
  config = _parse("pretrain_demo.py:quick", "--config.data.vocab_file=v.txt")
  with pytest.raises(ValueError, match=r"use config\.tokenizer\.vocab_file"):
    tasks.run(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run" / "data")


def test_a_field_no_experiment_declares_is_an_error():
  with pytest.raises(AttributeError, match="Did you mean \"glue_dir\""):
    _parse("glue.py:quick", "--config.data.glue_dri=x")


def test_main_locks_the_config():
  """What bert_jax.main hands a job is locked: no code adds a field to it (a misspelt read or
  write is an error, not a new field)."""
  script = ("import sys\n"
            "from absl import flags\n"
            "import bert_jax.main\n"
            "flags.FLAGS(sys.argv)\n"
            "config = flags.FLAGS['config'].value\n"
            "print(config.is_locked)\n"
            "config.data.glue_dri = 'x'\n")
  run = subprocess.run(
      [sys.executable, "-c", script, "--config=experiments/glue.py:quick", "--workdir=unused"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert run.stdout.strip() == "True", run.stderr[-2000:]
  assert run.returncode != 0 and 'Did you mean "glue_dir"' in run.stderr


def test_ablations_sub_configs_have_the_placeholders():
  config = importlib.import_module("experiments.ablations").get_config("quick")
  for sub in (config.pretraining, config.glue, config.ner_probe.config):
    assert sub.data.vocab_file is None and sub.vocab_file is None and sub.tokenizer.vocab_file == ""


def test_a_saved_config_under_the_old_names_is_read_under_the_new_ones():
  saved = {"task": "glue", "vocab_file": "/old/vocab.txt", "spm_model_file": "",
           "do_lower_case": False, "train_batch_size": 0, "global_batch_size": 32,
           "data": {"glue_task": "mrpc"}}
  upgraded = config_names.upgraded(saved)
  assert upgraded["tokenizer"] == {"vocab_file": "/old/vocab.txt", "spm_model_file": "",
                                   "do_lower_case": False}
  assert "vocab_file" not in upgraded and "train_batch_size" not in upgraded
  assert upgraded["global_batch_size"] == 32 and upgraded["data"] == {"glue_task": "mrpc"}
  current = dict(saved, tokenizer={"vocab_file": "/new/vocab.txt"}, vocab_file=None)
  assert config_names.upgraded(current)["tokenizer"]["vocab_file"] == "/new/vocab.txt"


def test_replaced_leaves_the_config_given_as_it_was():
  config = _parse("pretrain_demo.py:quick")
  copy = config_names.replaced(config, {"model.vocab_size": 123, "tokenizer.vocab_file": "v"})
  assert (copy.model.vocab_size, copy.tokenizer.vocab_file) == (123, "v")
  assert (config.model.vocab_size, config.tokenizer.vocab_file) == (800, "")
  with pytest.raises(KeyError):
    config_names.replaced(config, {"model.no_such_field": 1})
