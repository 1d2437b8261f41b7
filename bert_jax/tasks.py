"""What `python -m bert_jax.main` runs, chosen by `config.task` from this readable table."""
from typing import Callable, Dict


def _pretraining(config, workdir):
  from bert_jax import pretraining
  return pretraining.train_and_evaluate(config, workdir)


RUNNERS: Dict[str, Callable] = {
    "pretraining": _pretraining,
}


def run(config, workdir):
  task = config.get("task", "pretraining")
  if task not in RUNNERS:
    raise ValueError(f"config.task={task!r}: expected one of {sorted(RUNNERS)}")
  return RUNNERS[task](config, workdir)
