"""The training loop's actions (`runtime.loop`): cross-cutting work that hangs on the loop, in
the manner of clu's periodic actions and t5x's `Action`s. The loop calls every action at the same
points: start, before and after each step, at each training line (`log`, then `logged`), around
each evaluation and checkpoint (`pause` / `resume`), and at the end.

* `TrainClock`: `train_seconds`, the training time, paused during evaluations and checkpoints,
  saved with every checkpoint and continued on resume;
* `ThroughputWindow`: `steps_per_sec` and the job's rates (`Throughput`) over the clock's
  seconds since the last line;
* `NonFiniteAbort`: `skipped_steps_total`; `max_consecutive_skips` non-finite steps in a row
  abort the run with `NonFiniteLossError`;
* `Profiler`: `config.profile_steps="START,COUNT"`, a jax.profiler trace in WORKDIR/profile.
"""
import contextlib
import dataclasses
import time
from typing import Callable, Dict

import jax
import numpy as np
from absl import logging

Metrics = Dict[str, float]
Batch = Dict[str, np.ndarray]


class NonFiniteLossError(RuntimeError):
  pass


class Action:
  """A hook on the training loop; every method is optional. `step` counts the steps done."""

  def start(self, step: int) -> None:
    """The loop starts (after restore) with `step` steps done."""

  def before_step(self, step: int, batch: Batch) -> None:
    """`batch` (host numpy) is about to become step `step + 1`."""

  def after_step(self, step: int, outputs) -> None:
    """Step `step` was dispatched; `outputs` = (state, metrics), possibly still computing."""

  def log(self, step: int, state) -> Metrics:
    """The fields this action adds to the training line at `step` (the step has run)."""
    return {}

  def logged(self, step: int, line: Metrics) -> None:
    """The training line at `step` was written."""

  def pause(self) -> None:
    """An evaluation or a checkpoint begins (the steps dispatched so far have run)."""

  def resume(self) -> None:
    """The evaluation or checkpoint is over; training goes on."""

  def end(self, step: int) -> None:
    """The loop is over (finished or preempted) at `step`."""


class TrainClock(Action):
  """Seconds spent training: paused while the loop evaluates and checkpoints, saved with every
  checkpoint and continued by a resumed run, so `train_seconds` in metrics.jsonl is a run's true
  training time (what a time-to-quality budget counts), however often it was interrupted.
  It starts with the loop: compilation and the input pipeline count."""

  def __init__(self, seconds: float = 0.0):
    self.seconds, self._since = seconds, None

  def start(self, step: int = 0) -> None:
    self._since = time.perf_counter()

  def stop(self) -> None:
    if self._since is not None:
      self.seconds += time.perf_counter() - self._since
      self._since = None

  def read(self) -> float:
    return self.seconds + (time.perf_counter() - self._since if self._since is not None else 0.0)

  @contextlib.contextmanager
  def paused(self):
    """`with clock.paused():` the time inside does not count."""
    running = self._since is not None
    self.stop()
    try:
      yield
    finally:
      if running:
        self.start()

  def log(self, step, state) -> Metrics:
    return {"train_seconds": self.read()}

  def pause(self) -> None:
    self.stop()

  def resume(self) -> None:
    self.start()

  def end(self, step: int) -> None:
    self.stop()


@dataclasses.dataclass(frozen=True)
class Throughput:
  """A job's throughput counters: `count(host_batch)` -> numbers summed over a logging window
  (read on the host before the step: no device sync), `rates(sums, steps, seconds)` -> the
  logged rates of the window (e.g. sequences and tokens per second)."""
  count: Callable[[Batch], Dict[str, float]] = lambda batch: {}
  rates: Callable[[Dict[str, float], int, float], Metrics] = lambda sums, steps, seconds: {}


class ThroughputWindow(Action):
  """`steps_per_sec` and the job's rates over each logging window, timed by the training clock
  (so evaluations and checkpoints inside a window do not count). The loop waits for a logging
  step to finish before it logs, so a window ends when its last step has run, not when it was
  queued (else the rates would count queueing, up to 2x too fast on CPU)."""

  def __init__(self, clock: TrainClock, throughput: Throughput = Throughput()):
    self.clock, self.throughput = clock, throughput
    self._start, self._steps, self._sums = 0.0, 0, {}

  def start(self, step: int) -> None:
    self._start, self._steps, self._sums = self.clock.read(), 0, {}

  def before_step(self, step: int, batch: Batch) -> None:
    for k, v in self.throughput.count(batch).items():
      self._sums[k] = self._sums.get(k, 0.0) + v

  def after_step(self, step: int, outputs) -> None:
    self._steps += 1

  def log(self, step: int, state) -> Metrics:
    now = self.clock.read()
    seconds = max(now - self._start, 1e-9)
    rates = dict(steps_per_sec=self._steps / seconds,
                 **self.throughput.rates(self._sums, self._steps, seconds))
    self._start, self._steps, self._sums = now, 0, {}   # logging counts in the next window
    return rates


class NonFiniteAbort(Action):
  """`skipped_steps_total` on every line; a warning while non-finite steps are being skipped,
  and `NonFiniteLossError` once `limit` were skipped in a row (t5x's TerminateOnNanAction)."""

  def __init__(self, name: str, par, limit: int):
    self.name, self.par, self.limit = name, par, limit
    self._consecutive = 0

  def log(self, step: int, state) -> Metrics:
    counters = self.par.metrics({"total": state.total_skips, "run": state.consecutive_skips})
    self._consecutive = int(counters["run"])
    return {"skipped_steps_total": float(counters["total"])}

  def logged(self, step: int, line: Metrics) -> None:
    if self._consecutive:
      logging.warning("Step %d: %d non-finite step(s) in a row were skipped.", step,
                      self._consecutive)
    if self._consecutive >= self.limit:
      raise NonFiniteLossError(
          f"[{self.name}] Aborting at step {step}: {self._consecutive} consecutive steps had a "
          f"non-finite loss or gradient (limit config.max_consecutive_skips={self.limit}). "
          "Lower the learning rate or check the data.")


class Profiler(Action):
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

  def before_step(self, step: int, batch: Batch) -> None:
    if step == self.start_step and not self._tracing:
      jax.profiler.start_trace(self.directory)
      self._tracing = True

  def after_step(self, step: int, outputs) -> None:
    if self._tracing and step >= self.stop_step:
      self._stop(step, outputs)

  def end(self, step: int) -> None:
    if self._tracing:   # a run that ended (or was preempted) inside the traced steps
      self._stop(step, None)

  def _stop(self, step: int, outputs) -> None:
    jax.block_until_ready(outputs)
    jax.profiler.stop_trace()
    self._tracing = False
    print(f"Profile of steps {self.start_step + 1}-{step} written to {self.directory}",
          flush=True)
