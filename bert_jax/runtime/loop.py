"""The one training loop of every job: pre-training, fine-tuning and the feature-based tagger.

    trainer = Trainer("mrpc", workdir, par, LoopSettings.from_config(config, num_steps))
    state = trainer.restore(state)                    # newest readable checkpoint, if any
    state, last = trainer.run(state, step_fn, next_batch, dropout_rng,
                              evaluate=..., eval_at=...)

(`runtime.job.run` does this for a job, with the job's actions.) What it does, the same for
every job:
* restore: the newest readable checkpoint of `WORKDIR/checkpoints` with the input position
  (`iterator`, a tf.data iterator, if the job has one; a job whose batch is a pure function of the
  step has none) and the training clock; a damaged one is set aside, one of another model or
  one that cannot be read now stops the run with nothing moved (`io.training_checkpoints`).
  `metrics.jsonl` is cut back to the restored step, so a killed and restarted run leaves exactly
  the lines of an uninterrupted one.
* the compiled step `step_fn(state, device_batch, rng)` on `next_batch(step)`, placed by `par`.
* every `log_every_steps` (and at the last step) one training line to `metrics.jsonl`,
  TensorBoard and the console (with an ETA): the step's metrics plus what each action adds.
* evaluation when `eval_at(step)` (and at the last step): `evaluate(state, step)` returns the
  metrics to log (split "eval").
* checkpoints every `checkpoint_every_steps`, at evaluations if `checkpoint_at_evaluations`, at
  the last step, and on a preemption notice (SIGTERM, the metadata server: `runtime.preemption`),
  after which the loop returns (exit status 0).
* only process 0 writes metrics (`runtime.outputs`).

Cross-cutting work hangs on the loop as actions (`runtime.actions`): the training clock
(`train_seconds`, paused during evaluations and checkpoints, saved with them), the throughput
window, the abort after `max_consecutive_skips` non-finite steps in a row (they are skipped on
the device, `runtime.step`), the profiler (`config.profile_steps`), the step watchdog
(`config.step_timeout_seconds`), and the run's own (`actions`, which `runtime.job.run`
passes as `Trainer(..., actions=...)`), called after those at each point.
"""
import dataclasses
import functools
import time
from typing import Any, Callable, Optional, Sequence, Tuple

import jax
import numpy as np

from bert_jax.io import training_checkpoints
from bert_jax.runtime.actions import (Action, Batch, Metrics, NonFiniteAbort,
                                      NonFiniteLossError, Profiler, StepWatchdog, Throughput,
                                      ThroughputWindow, TrainClock)
from bert_jax.runtime.metric_writers import MetricWriter
from bert_jax.runtime.preemption import Preemption

# Re-exported: the loop's actions are part of what `runtime.loop` offers a job.
__all__ = ["Action", "LoopSettings", "NonFiniteAbort", "NonFiniteLossError", "Profiler",
           "Throughput", "ThroughputWindow", "TrainClock", "Trainer"]


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  num_steps: int
  log_every_steps: int = 100
  checkpoint_every_steps: int = 0     # 0: only at evaluations (if asked), the end and SIGTERM
  checkpoint_at_evaluations: bool = False
  max_consecutive_skips: int = 10
  keep_checkpoints: int = 3
  async_checkpointing: bool = False
  profile_steps: str = ""             # "START,COUNT": a profiler trace in WORKDIR/profile
  preemption_grace_seconds: float = 30.0   # notice -> kill: what a preemption save must fit
  step_timeout_seconds: float = 3600.0   # a step past it: stacks dumped, exit 124 (0: off)
  pause_timeout_seconds: float = 21600.0  # an evaluation or a save past it: the same (0: off)

  @classmethod
  def from_config(cls, config, num_steps: int, **overrides) -> "LoopSettings":
    """The loop fields of an experiment config (absent fields keep their defaults)."""
    fields = {f.name: config[f.name] for f in dataclasses.fields(cls)
              if f.name != "num_steps" and f.name in config}
    fields.update(overrides)
    return cls(num_steps=num_steps, **fields)


def _duration(seconds: float) -> str:
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Trainer:
  """Runs one job's training loop; see the module docstring."""

  def __init__(self, name: str, workdir: str, par, settings: LoopSettings, iterator=None,
               console_keys=("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate"),
               throughput: Throughput = Throughput(), actions: Sequence[Action] = ()):
    self.name = name
    self.workdir = workdir
    self.par = par
    self.settings = settings
    self.iterator = iterator
    self.console_keys = console_keys
    self.checkpointer = training_checkpoints.TrainingCheckpointer(
        workdir, keep=settings.keep_checkpoints, async_save=settings.async_checkpointing)
    self.start_step = 0
    self.preempted = False   # the last run() stopped early on SIGTERM / preemption
    self.writer: Optional[MetricWriter] = None
    self.clock = TrainClock()
    self.actions = [self.clock, ThroughputWindow(self.clock, throughput),
                    NonFiniteAbort(name, par, settings.max_consecutive_skips),
                    Profiler(settings.profile_steps, workdir),
                    StepWatchdog(settings.step_timeout_seconds, workdir,
                                 pause_seconds=settings.pause_timeout_seconds), *actions]

  # ------------------------------------------------------------------------------- restore

  def restore(self, state, model=None):
    """`state` from the newest readable checkpoint if there is one (else `state` as given),
    the training clock with it; opens the metric writer at that step. `model` (the job's Flax
    module): its architecture is compared with the checkpoint's and recorded with each save.

    A checkpoint of another model (the config or the code changed), or one that cannot be read
    for a reason other than proven damage (a store past its retry budget, out of memory), stops
    the run with an error naming it, nothing moved; only a damaged one is set aside
    (`io.training_checkpoints`)."""
    step, restored = self.checkpointer.restore_latest(self.par.abstract_state(state),
                                                      self.iterator, model=model)
    if restored is not None:
      state = self.par.from_checkpoint(restored)
      print(f"[{self.name}] Resumed from the checkpoint at step {step} in "
            f"{self.checkpointer.directory}", flush=True)
    self.start_step = int(np.asarray(self.par.metrics({"step": state.step})["step"]))
    self.clock.seconds = self.checkpointer.restored_clock if restored is not None else 0.0
    self.writer = MetricWriter(self.workdir, resume_step=self.start_step)
    self._report_steps_trained_again(restored is not None)
    return state

  def _report_steps_trained_again(self, resumed: bool) -> None:
    """Says which logged steps are trained again: those after the checkpoint resumed from, or,
    with no checkpoint at all, every step a previous run logged (its checkpoints never written,
    set aside as unreadable, or lost with the store), so a run never starts over unannounced."""
    beyond = self.writer.recorded_beyond
    if beyond is None or not self.writer.enabled:
      return
    if resumed:
      print(f"[{self.name}] metrics.jsonl went on to step {beyond}: steps "
            f"{self.start_step + 1}-{beyond} are trained again.", flush=True)
    else:
      print(f"\n!!! [{self.name}] NO CHECKPOINT in {self.checkpointer.directory}, but "
            f"metrics.jsonl records this run up to step {beyond}: its checkpoints were never "
            "written, were set aside as unreadable, or were lost with the store. Training starts "
            "again from step 0.\n", flush=True)

  @property
  def resumed(self) -> bool:
    return self.start_step > 0

  # ------------------------------------------------------------------------------- logging

  def console(self, step: int, split: str, metrics: Metrics, rate: Optional[float] = None):
    if self.writer is None or not self.writer.enabled:
      return
    shown = " ".join(f"{k}={metrics[k]:.4g}" for k in self.console_keys if k in metrics)
    line = f"[{self.name}] {split} step {step}/{self.settings.num_steps} {shown}"
    if rate:
      remaining = (self.settings.num_steps - step) / rate
      line += f" {rate:.3g} steps/s ETA {_duration(remaining)}"
    print(line, flush=True)

  def log_eval(self, step: int, metrics: Metrics) -> None:
    self.writer.write(step, "eval", metrics)
    self.console(step, "eval", metrics)

  def _log_train(self, step: int, state, metrics) -> Metrics:
    jax.block_until_ready((state, metrics))   # the window ends when its last step has run
    line = {k: float(v) for k, v in self.par.metrics(metrics).items()}
    for action in self.actions:
      line.update(action.log(step, state))
    self.writer.write(step, "train", line)
    self.console(step, "train", line, line.get("steps_per_sec"))
    for action in self.actions:
      action.logged(step, line)
    return line

  def _paused(self, work: Callable, state, step: int):
    """`work(state, step)` (an evaluation or a checkpoint) with every action paused; the steps
    dispatched before it have run first, so their time counts as training."""
    jax.block_until_ready(state)
    for action in self.actions:
      action.pause()
    try:
      return work(state, step)
    finally:
      for action in reversed(self.actions):   # nested: the clock, paused first, resumes last
        action.resume()

  def _save(self, state, step: int, wait: bool = False) -> None:
    # The lines up to `step` durable first: once its checkpoint is complete (in the background,
    # on Cloud Storage when its commit marker lands) a run killed at any moment resumes from it
    # and logs only the steps after it. Flushed after, a kill between the two lost the step's
    # lines for good; lines past the newest checkpoint are cut by the resumed run.
    self.writer.flush()
    self.checkpointer.save(step, self.par.checkpointable(state), self.iterator, force=True,
                           train_seconds=self.clock.read())
    if wait:   # landed before the process exits (a preemption)
      self.checkpointer.wait()

  # ------------------------------------------------------------------------------- the loop

  def run(self, state, step_fn: Callable, next_batch: Callable[[int], Batch], rng, *,
          evaluate: Optional[Callable[[Any, int], Metrics]] = None,
          eval_at: Callable[[int], bool] = lambda step: False) -> Tuple[Any, Metrics]:
    """Trains from `self.start_step` (call `restore` first) to `settings.num_steps`. Returns
    (state, the last logged training metrics plus `eval_<name>` of the last evaluation)."""
    if self.writer is None:
      raise RuntimeError("Trainer.run before Trainer.restore")
    settings, last, step = self.settings, {}, self.start_step
    for action in self.actions:
      action.start(step)
    try:
      # Shardings are explicit in the compiled steps: no mesh.
      with Preemption(settings.preemption_grace_seconds) as preemption:
        while step < settings.num_steps:
          batch = next_batch(step)
          for action in self.actions:
            action.before_step(step, batch)
          state, metrics = step_fn(state, self.par.put_batch(batch), rng)
          step += 1
          for action in self.actions:
            action.after_step(step, (state, metrics))
          final = step == settings.num_steps
          if step % settings.log_every_steps == 0 or final:
            last.update(self._log_train(step, state, metrics))
          evaluated = evaluate is not None and (eval_at(step) or final)
          if evaluated:
            eval_metrics = self._paused(evaluate, state, step)
            self.log_eval(step, eval_metrics)
            last.update({f"eval_{k}": v for k, v in eval_metrics.items()})
          preempted = preemption.reached(step)
          if (final or preempted
              or (settings.checkpoint_every_steps and step % settings.checkpoint_every_steps == 0)
              or (evaluated and settings.checkpoint_at_evaluations)):
            saving = time.perf_counter()
            self._paused(functools.partial(self._save, wait=preempted), state, step)
            preemption.saved(step, time.perf_counter() - saving)   # against the grace period
          if preempted:
            break
    finally:
      for action in self.actions:
        action.end(step)
    self.preempted = step < settings.num_steps
    return state, last

  def close(self, failed: bool = False) -> None:
    """`failed`: the run is ending on an error; its last save is finished but not read back (a
    read-back deletes old checkpoints, which waits for every process: one that failed alone
    would wait there for good)."""
    self.checkpointer.close(verify=not failed)
    if self.writer is not None:
      self.writer.close()
