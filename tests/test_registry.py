"""tasks.registry: every config.task value in one table, a fine-tuning task found by its file."""
import json
import os

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
  assert registry.names() == ("ablations", "embeddings", "glue", "glue_all", "ner",
                              "ner_feature_based", "pretraining", "squad", "swag")
  assert registry.task_class("glue") is glue.GlueTask
  assert registry.runner("glue_all") is glue.run_all


def test_an_unknown_task_is_an_error_naming_every_value(tmp_path):
  config = ml_collections.ConfigDict({"task": "glu"})
  with pytest.raises(ValueError, match=r"config.task='glu': expected one of \['ablations', "
                     r"'embeddings', 'glue', 'glue_all', 'ner', 'ner_feature_based', "
                     r"'pretraining', 'squad', 'swag'\]"):
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


def _job_configs(root: str):
  """One config per `config.task` value: the tiny pre-training config; each fine-tuning task and
  the feature-based tagger from a tiny checkpoint on the shipped (or written) fixtures; the two
  values that run several jobs need nothing more than their name."""
  from experiments import embeddings
  from experiments import glue as glue_experiment, ner, ner_feature_based, squad, swag
  from tests import finetuning_fixtures as ftx
  from tests.test_train_step import tiny_config
  checkpoint = ftx.write_checkpoint(os.path.join(root, "checkpoint"))
  glue_config = glue_experiment.get_config("task=mrpc,quick")
  glue_config.data.glue_dir = ftx.write_glue_dir(os.path.join(root, "glue"))
  glue_config.max_seq_length = 16
  swag_config = swag.get_config("quick")
  swag_config.data.swag_dir = ftx.write_swag_dir(os.path.join(root, "swag"))
  configs = {"pretraining": tiny_config(), "glue": glue_config, "ner": ner.get_config("quick"),
             "squad": squad.get_config("quick"), "swag": swag_config,
             "ner_feature_based": ner_feature_based.get_config("quick"),
             "embeddings": embeddings.get_config("quick")}
  for name, config in configs.items():
    if name != "pretraining":
      config.init_checkpoint = checkpoint
  return configs


def test_the_registry_gives_the_job_of_every_config_task(tmp_path):
  """`registry.job(config)`: every config.task value's job, its step traced on its own example
  batch; `glue_all` and `ablations` (several jobs one after another) say what to use instead."""
  import jax
  from bert_jax.runtime.job import Job
  configs = _job_configs(str(tmp_path))
  several = {"glue_all": "config.task='glue'", "ablations": "config.pretraining"}
  assert set(configs) | set(several) == set(registry.names())
  for name, config in configs.items():
    job = registry.job(config)
    assert isinstance(job, Job), name
    state = jax.eval_shape(job.init_state)
    batch = job.example_batch(config.global_batch_size)
    _, metrics = jax.eval_shape(job.train_step, state, batch, jax.random.PRNGKey(0))
    assert metrics["loss"].shape == (), name
    assert job.example_eval_batch is not None and job.eval_step is not None, name
  assert registry.job(configs["ner_feature_based"]).name == "feature-based embeddings"
  for name, instead in several.items():
    with pytest.raises(ValueError, match=f"config.task='{name}' has no single job.*{instead}"):
      registry.job(ml_collections.ConfigDict({"task": name}))
  with pytest.raises(ValueError, match=r"config.task='glu': expected one of"):
    registry.job(ml_collections.ConfigDict({"task": "glu"}))


def test_a_workdir_gives_the_job_that_trains(tmp_path):
  """With a workdir the fine-tuning job reads every split (its evaluation is the run's)."""
  configs = _job_configs(str(tmp_path))
  workdir = tmp_path / "ner"
  shapes, trains = registry.job(configs["ner"]), registry.job(configs["ner"], str(workdir))
  assert workdir.is_dir()
  assert trains.settings.num_steps > shapes.settings.num_steps   # all rows, not 4
