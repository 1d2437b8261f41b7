"""A job spec: everything that defines a training job, built once by the job's `make_job` and
used unchanged by whoever runs it: `run` on real devices, `--compile_for` on a TPU slice's
abstract devices (`tasks.tools.compile_report`), and the benchmarks. So the step that is compiled,
profiled and timed is the step that trains.

    job = registry.job(config, workdir)                         # (bert_jax/tasks/registry.py)
    outcome = run(job, workdir, parallel.create(config))        # trains, resumes, evaluates
    state, step = state_and_step(job, par)                      # or: what a benchmark times
    state, step = abstract_state_and_step(job, par)             # or: shapes only, to lower

`run` is the one sequence every job follows: initial state on the mesh -> compile the step
(`state_and_step`) -> `Trainer` with the job's actions -> restore (or a fresh run's
`warm_start`) -> evaluate the start if asked -> train -> close. What differs between jobs is
data, not code: the fields below.
"""
import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from bert_jax.runtime import environment
from bert_jax.runtime.actions import Action
from bert_jax.runtime.loop import LoopSettings, Metrics, Throughput, Trainer

Batch = Dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Batches:
  """A run's training input: `next_batch(step)` -> this host's batch of that step, and the
  iterator whose position is saved with every checkpoint (None when a batch is a pure function
  of its step)."""
  next_batch: Callable[[int], Batch]
  iterator: Any = None


@dataclasses.dataclass(frozen=True)
class Job:
  # What the step computes (what `--compile_for` lowers and the benchmarks time).
  name: str                                  # console prefix, e.g. "pretraining"
  model: Any                                 # the Flax module
  init_state: Callable[[], Any]              # () -> a fresh TrainState (jit / eval_shape it)
  param_axes: Any                            # logical axis names of the parameters (sharding)
  train_step: Callable                       # (state, batch, rng) -> (state, metrics), pure
  eval_step: Optional[Callable]              # (params, batch) -> outputs or summed terms
  example_batch: Callable[[int], Batch]      # rows -> a host batch of the train step's shapes
  example_eval_batch: Optional[Callable[[int], Batch]] = None
  model_flops: Callable[[int], float] = lambda rows: 0.0   # analytic training FLOPs of a step
  kernel_flops: Callable[[int], float] = lambda rows: 0.0  # inside custom calls (splash)
  # How it trains (what `run` needs besides the step).
  settings: Optional[LoopSettings] = None    # steps, logging, checkpoints, profiling
  batches: Optional[Callable[[], Batches]] = None   # opened by `run` (reads the data)
  dropout_rng: Any = None
  # trainer -> evaluate(state, step) -> metrics; built once the mesh and the restored step are
  # known (`trainer.par`, `trainer.resumed`, `trainer.workdir`). None: no evaluation.
  evaluator: Optional[Callable[[Trainer], Callable[[Any, int], Metrics]]] = None
  eval_at: Callable[[int], bool] = lambda step: False   # besides the last step
  eval_first: bool = False                   # a fresh run evaluates its starting point (step 0)
  # (state, par) -> state: where a fresh run starts (a checkpoint's weights); not on resume.
  warm_start: Optional[Callable[[Any, Any], Any]] = None
  # workdir -> None: the files that describe the run (pre-training's bert_config.json), written
  # once it is known to run (restored or started fresh): a refused run leaves none behind.
  record_start: Optional[Callable[[str], None]] = None
  throughput: Throughput = Throughput()
  console_keys: Tuple[str, ...] = ("loss", "learning_rate")


@dataclasses.dataclass
class Outcome:
  """What `run` leaves: the final state, the last logged metrics (`eval_*` for evaluations),
  whether SIGTERM stopped it early, and the evaluation it used (None if the job has none)."""
  state: Any
  last: Metrics
  preempted: bool
  evaluate: Optional[Callable[[Any, int], Metrics]]
  trainer: Trainer

  def results(self) -> Metrics:
    """The last logged metrics, with `preempted: True` when SIGTERM stopped the run early."""
    return dict(self.last, preempted=True) if self.preempted else self.last


def state_and_step(job: Job, par) -> Tuple[Any, Callable]:
  """The job's fresh state placed on `par`'s mesh (sharded by `param_axes`) and its train step
  compiled by `par` for that state's shardings: what `run` trains with, and what the benchmarks
  time."""
  state = par.init_state(job.init_state, job.param_axes)
  return state, par.compile_step(job.train_step)


def abstract_state_and_step(job: Job, par) -> Tuple[Any, Callable]:
  """`state_and_step` as shapes only (a `parallel.JitParallel`, whose devices may be a TPU
  slice's compile-only ones): the state's `jax.ShapeDtypeStruct`s with its shardings, and the
  same compiled step, to lower (`--compile_for`). Nothing is computed or placed."""
  state = par.abstract_init_state(job.init_state, job.param_axes)
  return state, par.compile_step(job.train_step)


def run(job: Job, workdir: str, par, actions: Tuple[Action, ...] = ()) -> Outcome:
  """Trains `job` in `workdir` on the mesh of `par` (`parallel.create(config)`), resuming from
  its newest checkpoint. `actions`: hooks on the loop (`runtime.actions.Action`) besides the ones
  every run has (clock, throughput, non-finite abort, profiler, watchdog), called after those at
  each point; an action that keeps state across calls starts it afresh in `start`."""
  state, step_fn = state_and_step(job, par)
  batches = job.batches()
  trainer = Trainer(job.name, workdir, par, job.settings, iterator=batches.iterator,
                    console_keys=job.console_keys, throughput=job.throughput,
                    actions=actions)
  failed = True
  try:
    state = trainer.restore(state, model=job.model)
    if not trainer.resumed and job.warm_start is not None:
      state = job.warm_start(state, par)
    # Every check passed: what describes the run is written now, not before.
    environment.job_started()
    if job.record_start is not None:
      job.record_start(workdir)
    evaluate = job.evaluator(trainer) if job.evaluator is not None else None
    if evaluate is not None and job.eval_first and trainer.start_step == 0:
      trainer.log_eval(0, evaluate(state, 0))
    state, last = trainer.run(state, step_fn, batches.next_batch, job.dropout_rng,
                              evaluate=evaluate, eval_at=job.eval_at)
    failed = False
  finally:
    trainer.close(failed=failed)
  return Outcome(state, last, trainer.preempted, evaluate, trainer)
