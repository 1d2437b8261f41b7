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
* `Profiler`: `config.profile_steps="START,COUNT"`, a jax.profiler trace in WORKDIR/profile;
* `StepWatchdog`: `config.step_timeout_seconds`, a step (or the wait for its batch) that takes
  longer dumps every thread's stack and ends the process (status 124).
"""
import collections
import contextlib
import dataclasses
import faulthandler
import os
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, Optional

import jax
import numpy as np
from absl import logging

from bert_jax.io import filesystem

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


WATCHDOG_EXIT_STATUS = 124   # as coreutils' `timeout`: the command ran out of time


class StepWatchdog(Action):
  """`config.step_timeout_seconds` (default 3,600; 0: off): a host stuck in a step (a collective whose partner
  hangs while its heartbeat goes on, a device that stops) or in the wait for the next batch (a
  dead input thread, a store that never answers) would hang the whole slice for good. Past the
  bound the watchdog writes the stacks of all threads (faulthandler) to stderr and to
  `WORKDIR/watchdog_stacks.process_<i>.txt`, and ends the process with status 124 at once
  (`os._exit`: a stuck collective never returns, so nothing else would end it); the job's
  scheduler restarts it and it resumes from its newest checkpoint.

  Steps are dispatched ahead of the device, so the time of a step is taken on the device's side:
  a thread polls the outputs of the steps in flight, and the oldest one must finish within the
  bound of the moment it could start (its dispatch, or the end of the step before). With no
  step in flight, the loop itself must dispatch the next one within the bound (its batch, the
  logging between). It starts once the first step of the run has finished, so compilation and
  a first step of any length do not count. Evaluations and checkpoint saves (the loop pauses
  its actions around them) are watched with their own bound, `pause_seconds`
  (`config.pause_timeout_seconds`, default 21,600; 0 leaves them unwatched) once the loop
  runs: an evaluation or a save stuck on a store that never answers ends the same way."""

  def __init__(self, seconds: float, workdir: str, process_index: Optional[int] = None,
               pause_seconds: float = 0.0):
    self.seconds, self.workdir = float(seconds or 0), workdir
    self.pause_seconds = float(pause_seconds or 0)
    self._paused_at: Optional[float] = None
    self.process_index = process_index
    self._lock = threading.Lock()
    self._in_flight = collections.deque()   # (step, an output array, dispatched at)
    self._dispatching: Optional[int] = None  # the step between its batch and its dispatch
    self._next_step = 0
    self._armed = self._paused = False
    self._last_event = self._last_done = 0.0
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  @property
  def enabled(self) -> bool:
    return self.seconds > 0 or self.pause_seconds > 0

  def start(self, step: int) -> None:
    if not self.enabled:
      return
    if self.process_index is None:
      self.process_index = jax.process_index()
    self._armed, self._paused, self._last_event = False, False, time.monotonic()
    self._in_flight.clear()
    self._dispatching, self._next_step = None, step + 1
    self._stop.clear()
    self._thread = threading.Thread(target=self._watch, name="step-watchdog", daemon=True)
    self._thread.start()

  def before_step(self, step: int, batch: Batch) -> None:
    if self.enabled:
      with self._lock:
        # The batch came; the step is dispatched next (on some backends its computation runs
        # right there, before the dispatch returns).
        self._last_event, self._dispatching = time.monotonic(), step + 1

  def after_step(self, step: int, outputs) -> None:
    if not self.enabled:
      return
    leaves = jax.tree_util.tree_leaves(outputs[1] if isinstance(outputs, tuple) else outputs)
    # The metrics, not the state: the state's arrays are donated to the next step (deleted).
    probe = next((leaf for leaf in leaves if hasattr(leaf, "is_ready")), None)
    with self._lock:
      now = time.monotonic()
      self._last_event, self._dispatching, self._next_step = now, None, step + 1
      self._in_flight.append((step, probe, now))

  def pause(self) -> None:
    if self.enabled:
      with self._lock:
        self._paused, self._paused_at = True, time.monotonic()
        self._in_flight.clear()   # the loop waited for every step before pausing

  def resume(self) -> None:
    if self.enabled:
      with self._lock:
        self._paused, self._paused_at, self._last_event = False, None, time.monotonic()
        self._last_done = self._last_event

  def end(self, step: int) -> None:
    if self._thread is not None:
      self._stop.set()
      self._thread.join(timeout=5.0)
      self._thread = None

  # ---------------------------------------------------------------------------- the thread

  def _watch(self) -> None:
    tick = min(1.0, min(b for b in (self.seconds, self.pause_seconds) if b > 0) / 4)
    while not self._stop.wait(tick):
      late = self.overdue(time.monotonic())
      if late:
        self._fire(late)

  def overdue(self, now: float) -> Optional[str]:
    """What is late at `now` (time.monotonic()), or None; the watchdog's thread asks each tick."""
    with self._lock:
      while self._in_flight and _ready(self._in_flight[0][1]):
        self._in_flight.popleft()
        self._armed, self._last_done = True, now
      if self._paused:
        if self.pause_seconds and now - self._paused_at > self.pause_seconds:
          return (f"an evaluation or a checkpoint save has not finished "
                  f"{now - self._paused_at:.0f} s after it began, more than "
                  f"config.pause_timeout_seconds={self.pause_seconds:g}")
        return None
      if not self._armed or not self.seconds:
        return None
      if self._in_flight:
        step, _, dispatched = self._in_flight[0]
        since = max(dispatched, self._last_done)
        if now - since > self.seconds:
          return f"step {step} has not finished {now - since:.0f} s after it could start"
      elif now - self._last_event > self.seconds:
        waited = now - self._last_event
        if self._dispatching is not None:
          return (f"step {self._dispatching} has not finished {waited:.0f} s after its batch "
                  "came (it runs as it is dispatched, or waits to be)")
        return (f"no batch for step {self._next_step} in {waited:.0f} s (the input pipeline, "
                "or the loop between steps)")
    return None

  def _fire(self, late: str) -> None:
    if "pause_timeout_seconds" not in late:
      late += f", more than config.step_timeout_seconds={self.seconds:g}"
    print(f"\n!!! Step watchdog: {late}. Stacks of every thread follow (also in "
          f"{self._stacks_path()}); "
          f"the process exits with status {WATCHDOG_EXIT_STATUS}, and the same command "
          "resumes from the newest checkpoint.", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    with contextlib.suppress(Exception):   # the stacks are on stderr whatever happens here
      self._write_stacks(late)
    sys.stdout.flush()
    os._exit(WATCHDOG_EXIT_STATUS)  # pylint: disable=protected-access

  def _stacks_path(self) -> str:
    return self.workdir.rstrip("/") + f"/watchdog_stacks.process_{self.process_index}.txt"

  def _write_stacks(self, late: str) -> None:
    path = self._stacks_path()
    if "://" not in path:
      with open(path, "w", encoding="utf-8") as f:
        f.write(f"Step watchdog: {late}\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
      return
    # A remote workdir: faulthandler writes to a real file, then a copy that may not hang the
    # exit (the store can be what is stuck).
    with tempfile.NamedTemporaryFile("w+", suffix=".txt", delete=False) as f:
      f.write(f"Step watchdog: {late}\n")
      f.flush()
      faulthandler.dump_traceback(file=f, all_threads=True)
    copier = threading.Thread(target=filesystem.copy, args=(f.name, path), daemon=True)
    copier.start()
    copier.join(timeout=20.0)


def _ready(probe) -> bool:
  """Whether a step's output array has been computed (an output that is not a jax array,
  or none: at once)."""
  if probe is None:
    return True
  try:
    return probe.is_ready()
  except RuntimeError:   # deleted (donated by a caller): it was computed
    return True
