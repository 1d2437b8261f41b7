"""Every `config.task` value, what it runs and the job it trains: the one table main,
prediction, serving, `fine_tuned`, the compile report and the benchmarks read.

A fine-tuning task is found by its file: `config.task=NAME` is the `TASK` class (a
`framework.task.Task`) of `bert_jax/tasks/datasets/NAME.py`. Adding a task is that file plus its
experiment file (`experiments/NAME.py`); nothing else lists it. The jobs that are not one
fine-tuning task are the lines of `JOBS`: the job each trains (`runtime.job.Job`) and, for those
that run more than their one job, what runs instead.

    results = registry.run(config, workdir)   # what `bert_jax.main` runs: the workdir locked
    job = registry.job(config)            # its job, nothing prepared: what --compile_for compiles
    job = registry.job(config, workdir)   # the workdir prepared: the job that trains
    results = registry.run_job(config, workdir)   # that job trained: jobs.run(job(...), ...)

Modules are imported only when chosen, so a pre-training run never imports the fine-tuning tasks
(and the other way round).
"""
import contextlib
import dataclasses
import importlib
import pkgutil
from typing import Callable, Dict, Optional, Tuple

import ml_collections

from bert_jax.io import filesystem, workdir_lock
from bert_jax.runtime import environment, outputs

DATASETS = "bert_jax.tasks.datasets"

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


def _pretraining_job(config, workdir: Optional[str], layers: Optional[int]):
  """The pre-training job: the init checkpoint's architecture when the config adopts it, the
  workdir's data prepared (`pretraining.prepare`) when there is a workdir."""
  from bert_jax.runtime import config_names
  from bert_jax.tasks.jobs import pretraining
  config = pretraining.job_config(config, workdir)
  if layers is not None:
    config = config_names.replaced(config, {"model.num_hidden_layers": layers,
                                            "model.scan_layers": False})
  return pretraining.make_job(config)


def _feature_based_job(config, workdir: Optional[str], layers: Optional[int]):
  """The feature-based tagger's job, of the first layer choice (`feature_based.job`)."""
  del layers   # the frozen encoder is not in the tagger's step (its features are inputs)
  from bert_jax.tasks.jobs import feature_based
  return feature_based.job(config, workdir)


def _embeddings_job(config, workdir: Optional[str], layers: Optional[int]):
  """The embedding job: a bi-encoder trained on pairs with in-batch negatives."""
  from bert_jax.tasks.jobs import embeddings
  return embeddings.job(config, workdir, layers=layers)


def _several_jobs(why: str):
  def refuse(config, workdir, layers):
    del workdir, layers
    raise ValueError(f"config.task={config.task!r} has no single job (no one step to build, "
                     f"compile or time): it {why}")
  return refuse


@dataclasses.dataclass(frozen=True)
class JobEntry:
  """A `config.task` that is not one fine-tuning task: its job, function(config, workdir,
  layers) -> Job (the ones that run several jobs one after another say so instead), and what
  `bert_jax.main` runs when that is more than the job, (module, function(config, workdir)); None:
  the job is the run (`run_job`)."""
  job: Callable
  runs: Optional[Tuple[str, str]] = None


# config.task -> its entry, for the jobs that are not one fine-tuning task (a fine-tuning task's
# runner and job: `framework.finetuning.run_task` and `framework.finetuning.job`).
JOBS = {
    "pretraining": JobEntry(_pretraining_job),
    "ner_feature_based": JobEntry(_feature_based_job,
                                  runs=("bert_jax.tasks.jobs.feature_based", "run")),
    # The job, then WORKDIR/best/ (the best evaluated model, else the last) and results.json.
    "embeddings": JobEntry(_embeddings_job, runs=("bert_jax.tasks.jobs.embeddings", "run")),
    "glue_all": JobEntry(_several_jobs(
        "fine-tunes each task of config.glue_tasks in turn, each its own job; for one of them "
        "use config.task='glue' with config.data.glue_task=NAME (experiments/glue.py:task=NAME)"),
        runs=("bert_jax.tasks.datasets.glue", "run_all")),
    "ablations": JobEntry(_several_jobs(
        "pre-trains, fine-tunes and probes each variant of config.variants in turn; for one "
        "step use its pre-training experiment (config.pretraining) or one GLUE task "
        "(experiments/glue.py)"), runs=("bert_jax.tasks.jobs.ablations", "run")),
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


def job_builder(name: str) -> Callable:
  """function(config, workdir, layers) -> Job of `config.task=name`; a ValueError naming why
  when the value has no single job (or is no value)."""
  if name in JOBS:
    return JOBS[name].job
  try:
    task = task_class(name)
  except ValueError:
    raise ValueError(f"config.task={name!r}: expected one of {list(names())}") from None

  def build(config, workdir, layers):
    from bert_jax.tasks.framework import finetuning
    return finetuning.job(task(config), config, workdir, layers=layers)
  return build


def job(config: ml_collections.ConfigDict, workdir: Optional[str] = None, *,
        layers: Optional[int] = None):
  """The job (`runtime.job.Job`: model, state, the pure step, example batches, FLOPs, loop
  settings, actions) that `config.task` trains.

  With `workdir` it is prepared first (pre-training: the demo corpus or text files built into
  WORKDIR/data; fine-tuning: the workdir made, every split read; the feature-based tagger: the
  frozen encoder's features extracted or read from their cache): the job a run trains. Without,
  nothing is prepared or written: the same step on the checkpoint's architecture and enough
  examples for the shapes (what `--compile_for` compiles and the benchmarks time). `layers`:
  the encoder unrolled at that many layers (the cost of a scanned step, `compile_report`).
  `glue_all` and `ablations` run several jobs one after another: a ValueError says which to use.
  """
  if workdir is not None:
    workdir = filesystem.absolute(workdir)
  return job_builder(config.task)(config, workdir, layers)


def runner(name: str) -> Callable[[ml_collections.ConfigDict, str], Dict]:
  """What `python -m bert_jax.main` runs for `config.task=name` (in `run`, the workdir locked)."""
  if name in JOBS:
    if JOBS[name].runs is None:
      return run_job
    module, function = JOBS[name].runs
    return getattr(importlib.import_module(module), function)
  try:
    task = task_class(name)
  except ValueError:
    raise ValueError(f"config.task={name!r}: expected one of {list(names())}") from None
  from bert_jax.tasks.framework import finetuning
  return lambda config, workdir: finetuning.run_task(task, config, workdir)


def run_job(config: ml_collections.ConfigDict, workdir: str) -> Dict:
  """Trains the job `config.task` builds in `workdir` (`job`, prepared), resuming from its newest
  checkpoint: the whole run of a task whose job is its run (pre-training). Returns the last
  logged metrics (`eval_*` for evaluations), with `preempted: True` when SIGTERM stopped it
  early (after saving a checkpoint). A fine-tuning task's run does more (best/, predictions,
  results.json, seeds): `run`."""
  from bert_jax import parallel
  from bert_jax.runtime import job as jobs
  workdir = filesystem.absolute(workdir)
  return jobs.run(job(config, workdir), workdir, parallel.create(config)).results()


def run(config: ml_collections.ConfigDict, workdir: str) -> Dict:
  """What `python -m bert_jax.main` runs: `config.task`'s runner in `workdir`, with the
  workdir's lock held; the environment (what the numbers depend on beyond the config) is
  recorded once its first job starts training, so a refused run changes nothing there."""
  run_task = runner(config.task)
  with _one_run_per_workdir(workdir), environment.recorded_when_started(workdir):
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
