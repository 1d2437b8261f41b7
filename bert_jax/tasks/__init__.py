"""What `python -m bert_jax.main` runs, chosen by `config.task` from the one table of tasks and
jobs (`tasks.registry`).

The folders say what is inside: `framework/` (the task protocol and the one fine-tuning loop),
`datasets/` (the fine-tuning tasks, one file each), `jobs/` (pre-training, the feature-based
tagger, the ablations), `tools/` (prediction, serving exports, `best/` loaded back, the TPU
compile report).
"""
from bert_jax.runtime import environment
from bert_jax.tasks import registry


def run(config, workdir):
  run_task = registry.runner(config.task)
  environment.record(workdir)  # what the numbers depend on beyond the config
  return run_task(config, workdir)
