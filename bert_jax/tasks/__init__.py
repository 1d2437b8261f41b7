"""What `python -m bert_jax.main` runs, chosen by `config.task` from this readable table.

Each runner is imported only when chosen, so a pre-training run never imports the fine-tuning
tasks (and the other way round).
"""
import importlib

from bert_jax.runtime import environment

# config.task -> (module, function(config, workdir))
RUNNERS = {
    "pretraining": ("bert_jax.tasks.pretraining", "train_and_evaluate"),
    "glue": ("bert_jax.tasks.glue", "run"),
    "glue_all": ("bert_jax.tasks.glue", "run_all"),
    "swag": ("bert_jax.tasks.swag", "run"),
    "squad": ("bert_jax.tasks.squad", "run"),
    "ner": ("bert_jax.tasks.ner", "run"),
    "ner_feature_based": ("bert_jax.tasks.feature_based", "run"),
    "ablations": ("bert_jax.tasks.ablations", "run"),
}


def run(config, workdir):
  task = config.task
  if task not in RUNNERS:
    raise ValueError(f"config.task={task!r}: expected one of {sorted(RUNNERS)}")
  module, function = RUNNERS[task]
  environment.record(workdir)  # what the numbers depend on beyond the config
  return getattr(importlib.import_module(module), function)(config, workdir)
