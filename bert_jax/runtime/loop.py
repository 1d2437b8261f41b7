"""The one training loop of every job: pre-training, fine-tuning and the feature-based tagger.

    trainer = Trainer("mrpc", workdir, par, LoopSettings.from_config(config, num_steps))
    state = trainer.restore(state)                    # newest readable checkpoint, if any
    state, last = trainer.run(state, step_fn, next_batch, dropout_rng,
                              evaluate=..., eval_at=...)

What it does, the same for every job:
* restore: the newest readable checkpoint of `WORKDIR/checkpoints` with the input position
  (`iterator`, a tf.data iterator, if the job has one; a job whose batch is a pure function of the
  step has none); an unreadable one is set aside (`io.training_checkpoints`). `metrics.jsonl` is
  cut back to the restored step, so a killed and restarted run leaves exactly the lines of an
  uninterrupted one.
* the compiled step `step_fn(state, device_batch, rng)` on `next_batch(step)`, placed by `par`.
* metric windows: every `log_every_steps` the step's metrics, the skip counters and the window's
  rates (`window_metrics`) go to `metrics.jsonl`, TensorBoard and one console line with an ETA.
* evaluation when `eval_at(step)` (and at the last step): `evaluate(state, step)` returns the
  metrics to log (split "eval").
* checkpoints every `checkpoint_every_steps`, at evaluations if `checkpoint_at_evaluations`, at
  the last step, and on SIGTERM / preemption, after which the loop returns (exit status 0).
* non-finite steps are skipped on the device (`runtime.step`); `max_consecutive_skips` in a row
  abort the run with `NonFiniteLossError`.
* only process 0 writes metrics (`runtime.outputs`).
"""
import contextlib
import dataclasses
import time
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import numpy as np
from absl import logging

from bert_jax.io import training_checkpoints
from bert_jax.runtime.metric_writers import MetricWriter
from bert_jax.runtime.preemption import Preemption

Metrics = Dict[str, float]


class NonFiniteLossError(RuntimeError):
  pass


class TrainClock:
  """Seconds spent training: paused while the loop evaluates and checkpoints, saved with every
  checkpoint and continued by a resumed run, so `train_seconds` in metrics.jsonl is a run's true
  training time (what a time-to-quality budget counts), however often it was interrupted."""

  def __init__(self, seconds: float = 0.0):
    self.seconds, self._since = seconds, None

  def start(self) -> None:
    self._since = time.perf_counter()

  def stop(self) -> None:
    if self._since is not None:
      self.seconds += time.perf_counter() - self._since
      self._since = None

  def read(self) -> float:
    return self.seconds + (time.perf_counter() - self._since if self._since is not None else 0.0)

  @contextlib.contextmanager
  def paused(self):
    running = self._since is not None
    self.stop()
    try:
      yield
    finally:
      if running:
        self.start()


class Profiler:
  """`config.profile_steps="START,COUNT"`: a jax.profiler trace of steps START+1 .. START+COUNT
  in WORKDIR/profile (TensorBoard's profile plugin or Perfetto read it); "" for none."""

  def __init__(self, spec: str, workdir: str):
    self.start_step = self.stop_step = -1
    if spec:
      try:
        start, count = (int(x) for x in str(spec).split(","))
      except ValueError:
        raise ValueError(f"config.profile_steps={spec!r}: expected 'START,COUNT', e.g. '100,5'"
                         ) from None
      self.start_step, self.stop_step = start, start + count
    self.directory = workdir.rstrip("/") + "/profile"
    self._tracing = False

  def before_step(self, step: int) -> None:
    if step == self.start_step and not self._tracing:
      jax.profiler.start_trace(self.directory)
      self._tracing = True

  def after_step(self, step: int, outputs) -> None:
    if self._tracing and step >= self.stop_step:
      jax.block_until_ready(outputs)
      jax.profiler.stop_trace()
      self._tracing = False
      print(f"Profile of steps {self.start_step + 1}-{step} written to {self.directory}",
            flush=True)


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
               console_keys=("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate")):
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

  # ------------------------------------------------------------------------------- restore

  def restore(self, state):
    """`state` from the newest readable checkpoint if there is one (else `state` as given);
    opens the metric writer at that step."""
    step, restored = self.checkpointer.restore_latest(self.par.abstract_state(state),
                                                      self.iterator)
    if restored is not None:
      state = self.par.from_checkpoint(restored)
      print(f"[{self.name}] Resumed from the checkpoint at step {step} in "
            f"{self.checkpointer.directory}", flush=True)
    self.start_step = int(np.asarray(self.par.metrics({"step": state.step})["step"]))
    self.clock = TrainClock(self.checkpointer.restored_clock if restored is not None else 0.0)
    self.writer = MetricWriter(self.workdir, resume_step=self.start_step)
    return state

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

  def _train_line(self, step, state, metrics, window_metrics) -> Metrics:
    host = {k: float(v) for k, v in self.par.metrics(metrics).items()}
    counters = self.par.metrics({"total": state.total_skips, "run": state.consecutive_skips})
    host["skipped_steps_total"] = float(counters["total"])
    host["train_seconds"] = self.clock.read()
    host.update(window_metrics)
    self.writer.write(step, "train", host)
    self.console(step, "train", host, window_metrics.get("steps_per_sec"))
    consecutive = int(counters["run"])
    if consecutive:
      logging.warning("Step %d: %d non-finite step(s) in a row were skipped.", step, consecutive)
    if consecutive >= self.settings.max_consecutive_skips:
      self.close()
      raise NonFiniteLossError(
          f"[{self.name}] Aborting at step {step}: {consecutive} consecutive steps had a "
          f"non-finite loss or gradient (limit config.max_consecutive_skips="
          f"{self.settings.max_consecutive_skips}). Lower the learning rate or check the data.")
    return host

  # ------------------------------------------------------------------------------- the loop

  def run(self, state, step_fn: Callable, next_batch: Callable[[int], Dict[str, np.ndarray]],
          rng, *, evaluate: Optional[Callable[[Any, int], Metrics]] = None,
          eval_at: Callable[[int], bool] = lambda step: False,
          count: Optional[Callable[[Dict], Dict[str, float]]] = None,
          window_metrics: Optional[Callable[[Dict[str, float], int, float], Metrics]] = None
          ) -> Tuple[Any, Metrics]:
    """Trains from `self.start_step` (call `restore` first) to `settings.num_steps`.

    `count(host_batch)` -> numbers summed over a logging window (e.g. real tokens), read on the
    host before the step (no device sync); `window_metrics(sums, steps, seconds)` turns them
    into the logged rates (default: steps_per_sec). Returns (state, the last logged training
    metrics plus `eval_<name>` of the last evaluation).
    """
    if self.writer is None:
      raise RuntimeError("Trainer.run before Trainer.restore")
    settings = self.settings
    window_metrics = window_metrics or (lambda sums, steps, seconds: {})
    last: Metrics = {}
    window_start, window_steps, window_sums = time.time(), 0, {}
    step = self.start_step
    profiler = Profiler(settings.profile_steps, self.workdir)
    self.clock.start()
    with Preemption() as preemption:  # shardings are explicit in the compiled steps: no mesh
      while step < settings.num_steps:
        batch = next_batch(step)
        if count is not None:
          for k, v in count(batch).items():
            window_sums[k] = window_sums.get(k, 0.0) + v
        profiler.before_step(step)
        state, metrics = step_fn(state, self.par.put_batch(batch), rng)
        step += 1
        profiler.after_step(step, (state, metrics))
        window_steps += 1
        final = step == settings.num_steps
        if step % settings.log_every_steps == 0 or final:
          # Steps are dispatched asynchronously: the window ends when its last step has run,
          # not when it was queued (else the rates count queueing, up to 2x too fast on CPU).
          jax.block_until_ready((state, metrics))
          window_end = time.time()
          elapsed = max(window_end - window_start, 1e-9)
          rates = dict(steps_per_sec=window_steps / elapsed,
                       **window_metrics(window_sums, window_steps, elapsed))
          window_start, window_steps, window_sums = window_end, 0, {}   # logging counts next
          last.update(self._train_line(step, state, metrics, rates))
        evaluated = evaluate is not None and (eval_at(step) or final)
        if evaluated:
          with self.clock.paused():
            eval_metrics = evaluate(state, step)
          self.log_eval(step, eval_metrics)
          last.update({f"eval_{k}": v for k, v in eval_metrics.items()})
          window_start = time.time()
        preempted = preemption.reached(step)
        if (final or preempted
            or (settings.checkpoint_every_steps and step % settings.checkpoint_every_steps == 0)
            or (evaluated and settings.checkpoint_at_evaluations)):
          with self.clock.paused():
            self.checkpointer.save(step, self.par.checkpointable(state), self.iterator,
                                   force=True, train_seconds=self.clock.read())
            self.writer.flush()
          window_start = time.time()
        if preempted:
          self.checkpointer.wait()
          print(f"Preempted: checkpoint at step {step} saved; exiting.", flush=True)
          break
    self.clock.stop()
    self.preempted = step < settings.num_steps
    return state, last

  def close(self) -> None:
    self.checkpointer.close()
    if self.writer is not None:
      self.writer.close()
