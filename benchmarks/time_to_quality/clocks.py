"""The training clock of the transformers side, and the curve read from bert_jax's metrics."""
import time
from typing import List, Optional, Tuple


class Clock:
  """Training time: wall clock that the caller stops around evaluations and checkpoint saves."""

  def __init__(self, seconds: float = 0.0):
    self.seconds = seconds
    self._mark: Optional[float] = None

  def start(self) -> None:
    self._mark = time.perf_counter()

  def read(self) -> float:
    """The training time up to now (the clock keeps running)."""
    now = time.perf_counter()
    if self._mark is not None:
      self.seconds += now - self._mark
    self._mark = now
    return self.seconds

  def stop(self) -> float:
    seconds = self.read()
    self._mark = None
    return seconds


def jax_curve(workdir: str) -> List[dict]:
  """bert_jax's held-out curve from its own metrics.jsonl: each evaluation with the training
  clock of the training line logged at the same step (`train_seconds`: paused during
  evaluations and checkpoints, saved with every checkpoint and continued by a resumed run; the
  lines a killed run logged after its last checkpoint are cut when it resumes)."""
  from bert_jax.runtime.metric_writers import read_metrics
  seconds = {r["step"]: r["train_seconds"] for r in read_metrics(workdir, "train")}
  curve = []
  for record in read_metrics(workdir, "eval"):
    if record["step"] not in seconds:
      raise ValueError(f"{workdir}: an evaluation at step {record['step']} has no training line "
                       "at that step (evaluate at multiples of --log_every)")
    metrics = {k: v for k, v in record.items() if k not in ("step", "split")}
    curve.append(dict(seconds=seconds[record["step"]], step=record["step"], **metrics))
  return curve


def jax_clock_marks(workdir: str) -> List[Tuple[int, float]]:
  """(step, training seconds) at the start and at every logged step (what calibration reads)."""
  from bert_jax.runtime.metric_writers import read_metrics
  return [(0, 0.0)] + [(r["step"], r["train_seconds"]) for r in read_metrics(workdir, "train")]
