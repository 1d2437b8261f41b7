"""What `python -m bert_jax.main` runs, chosen by `config.task` from the one table of tasks and
jobs (`tasks.registry`; `tasks.run(config, workdir)` is its `run`).

The folders say what is inside: `framework/` (the task protocol and the one fine-tuning loop),
`datasets/` (the fine-tuning tasks, one file each), `jobs/` (pre-training, the feature-based
tagger, the ablations), `tools/` (prediction, serving exports, `best/` loaded back, the TPU
compile report).
"""
from bert_jax.tasks.registry import run  # noqa: F401  (`tasks.run`: what bert_jax.main runs)
