"""What `python -m bert_jax.main` runs, chosen by `config.task` from this readable table.

Each runner is imported only when chosen, so a pre-training run never imports the fine-tuning
tasks (and the other way round).
"""
import importlib

from bert_jax.runtime import environment

# config.task -> (module, function(config, workdir))
RUNNERS = {
    "pretraining": ("bert_jax.tasks.jobs.pretraining", "train_and_evaluate"),
    "glue": ("bert_jax.tasks.datasets.glue", "run"),
    "glue_all": ("bert_jax.tasks.datasets.glue", "run_all"),
    "swag": ("bert_jax.tasks.datasets.swag", "run"),
    "squad": ("bert_jax.tasks.datasets.squad", "run"),
    "ner": ("bert_jax.tasks.datasets.ner", "run"),
    "ner_feature_based": ("bert_jax.tasks.jobs.feature_based", "run"),
    "ablations": ("bert_jax.tasks.jobs.ablations", "run"),
}


def run(config, workdir):
  task = config.get("task", "pretraining")
  if task not in RUNNERS:
    raise ValueError(f"config.task={task!r}: expected one of {sorted(RUNNERS)}")
  module, function = RUNNERS[task]
  environment.record(workdir)  # what the numbers depend on beyond the config
  return getattr(importlib.import_module(module), function)(config, workdir)
