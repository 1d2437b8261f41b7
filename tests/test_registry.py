"""tasks.registry: every config.task value in one table, a fine-tuning task found by its file."""
import json

import ml_collections
import pytest

from bert_jax import tasks
from bert_jax.tasks import registry
from bert_jax.tasks.datasets import glue
from bert_jax.tasks.framework import best_model
from bert_jax.tasks.framework import task as task_protocol
from bert_jax.tasks.tools import fine_tuned

TOY_TASK_FILE = '''
from bert_jax.tasks.datasets import glue


class ToyTask(glue.GlueTask):
  """A GLUE task under another config.task value."""


TASK = ToyTask
'''


def test_the_table_lists_every_task_and_job():
  assert registry.finetuning_tasks() == ("glue", "ner", "squad", "swag")
  assert registry.names() == ("ablations", "glue", "glue_all", "ner", "ner_feature_based",
                              "pretraining", "squad", "swag")
  assert registry.task_class("glue") is glue.GlueTask
  assert registry.runner("glue_all") is glue.run_all


def test_an_unknown_task_is_an_error_naming_every_value(tmp_path):
  config = ml_collections.ConfigDict({"task": "glu"})
  with pytest.raises(ValueError, match=r"config.task='glu': expected one of \['ablations', "
                     r"'glue', 'glue_all', 'ner', 'ner_feature_based', 'pretraining', 'squad', "
                     r"'swag'\]"):
    tasks.run(config, str(tmp_path))
  with pytest.raises(ValueError, match="not a fine-tuning task"):
    registry.task_class("squad_metrics")   # a module of datasets/ without a TASK


def test_a_new_task_is_one_file(tmp_path, monkeypatch):
  """A file with a TASK in datasets/ is a config.task value for main, prediction and export."""
  from bert_jax.tasks import datasets
  folder = tmp_path / "more_tasks"
  folder.mkdir()
  (folder / "toy.py").write_text(TOY_TASK_FILE)
  monkeypatch.setattr(datasets, "__path__", list(datasets.__path__) + [str(folder)])
  assert "toy" in registry.finetuning_tasks()
  assert callable(registry.runner("toy"))
  config = ml_collections.ConfigDict({"task": "toy", "data": {"glue_task": "sst2"}})
  assert type(registry.make_task(config)).__name__ == "ToyTask"
  (tmp_path / best_model.TASK_CONFIG).write_text(json.dumps(config.to_dict()))
  assert fine_tuned.read_task_config(str(tmp_path)).task == "toy"


def test_the_protocol_names_what_a_task_lacks():
  with pytest.raises(TypeError, match="FunctionTask"):
    task_protocol.Task(name="old style")

  class Half(task_protocol.Task):
    def read_examples(self, split):
      return []
  with pytest.raises(TypeError, match="abstract"):
    Half(None)
