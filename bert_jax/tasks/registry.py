"""Every `config.task` value and what it runs: the one table main, prediction, serving,
`fine_tuned` and the compile report read.

A fine-tuning task is found by its file: `config.task=NAME` is the `TASK` class (a
`framework.task.Task`) of `bert_jax/tasks/datasets/NAME.py`. Adding a task is that file plus its
experiment file (`experiments/NAME.py`); nothing else lists it. The jobs that are not one
fine-tuning task are in `JOBS`.

Modules are imported only when chosen, so a pre-training run never imports the fine-tuning tasks
(and the other way round).
"""
import importlib
import pkgutil
from typing import Callable, Dict, Tuple

import ml_collections

DATASETS = "bert_jax.tasks.datasets"

# config.task -> (module, function(config, workdir)) of the jobs that are not one fine-tuning task
JOBS = {
    "pretraining": ("bert_jax.tasks.jobs.pretraining", "train_and_evaluate"),
    "glue_all": ("bert_jax.tasks.datasets.glue", "run_all"),
    "ner_feature_based": ("bert_jax.tasks.jobs.feature_based", "run"),
    "ablations": ("bert_jax.tasks.jobs.ablations", "run"),
}


def finetuning_tasks() -> Tuple[str, ...]:
  """The `config.task` values of the fine-tuning tasks: the modules of `datasets/` with a TASK."""
  package = importlib.import_module(DATASETS)
  return tuple(sorted(
      info.name for info in pkgutil.iter_modules(package.__path__)
      if hasattr(importlib.import_module(f"{DATASETS}.{info.name}"), "TASK")))


def names() -> Tuple[str, ...]:
  """Every `config.task` value."""
  return tuple(sorted(set(JOBS) | set(finetuning_tasks())))


def task_class(name: str):
  """The Task class of the fine-tuning task `name` (`config.task`)."""
  package = importlib.import_module(DATASETS)
  modules = {info.name for info in pkgutil.iter_modules(package.__path__)}
  task = getattr(importlib.import_module(f"{DATASETS}.{name}"), "TASK",
                 None) if name in modules else None
  if task is None:
    raise ValueError(f"config.task={name!r} is not a fine-tuning task: expected one of "
                     f"{list(finetuning_tasks())}")
  return task


def make_task(config: ml_collections.ConfigDict):
  """The fine-tuning task `config.task`, made from the experiment config."""
  return task_class(config.task)(config)


def runner(name: str) -> Callable[[ml_collections.ConfigDict, str], Dict]:
  """What `python -m bert_jax.main` runs for `config.task=name`."""
  if name in JOBS:
    module, function = JOBS[name]
    return getattr(importlib.import_module(module), function)
  try:
    task = task_class(name)
  except ValueError:
    raise ValueError(f"config.task={name!r}: expected one of {list(names())}") from None
  from bert_jax.tasks.framework import finetuning
  return lambda config, workdir: finetuning.run_task(task, config, workdir)
