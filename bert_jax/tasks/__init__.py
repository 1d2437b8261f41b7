"""What `python -m bert_jax.main` runs, chosen by `config.task` from the one table of tasks and
jobs (`tasks.registry`).

The folders say what is inside: `framework/` (the task protocol and the one fine-tuning loop),
`datasets/` (the fine-tuning tasks, one file each), `jobs/` (pre-training, the feature-based
tagger, the ablations), `tools/` (prediction, serving exports, `best/` loaded back, the TPU
compile report).
"""
import contextlib

from bert_jax.io import filesystem, workdir_lock
from bert_jax.runtime import environment, outputs
from bert_jax.tasks import registry


def run(config, workdir):
  run_task = registry.runner(config.task)
  with _one_run_per_workdir(workdir):
    environment.record(workdir)  # what the numbers depend on beyond the config
    return run_task(config, workdir)


@contextlib.contextmanager
def _one_run_per_workdir(workdir):
  """The workdir's lock (bert_jax/io/workdir_lock.py), held while the job runs: a second run on
  the same workdir stops at once, naming this one. Of several processes of one run, process 0
  holds it for all; the others start only once it has it (a run refused leaves them no work)."""
  import jax
  lock = None
  if outputs.is_writer():
    filesystem.makedirs(workdir)
    lock = workdir_lock.acquire(workdir)
  try:
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices("workdir lock taken")
    yield
  finally:
    if lock is not None:
      lock.release()
