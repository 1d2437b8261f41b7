"""Metrics to `WORKDIR/metrics.jsonl`, TensorBoard (`WORKDIR/tensorboard`) and the console.

Each JSON line is `{"step": int, "split": "train"|"eval", "loss": float, "mlm_accuracy": ...,
"nsp_accuracy": ..., ...}`. On resume the file is cut back to the restored step, so a run that was
killed and restarted leaves exactly the lines of an uninterrupted run (no duplicates, no torn
last line).
"""
import json
import math
import os
from typing import Dict, Optional

import jax
from absl import logging

METRICS_FILE = "metrics.jsonl"

# Fields that depend on wall-clock time or on where the logging window began (a resumed run's
# first window is shorter: pairs_per_row averages other steps); everything else is a pure
# function of the run.
TIMING_FIELDS = ("sequences_per_sec", "tokens_per_sec", "real_tokens_per_sec", "steps_per_sec",
                 "pairs_per_row")


def _clean(value):
  value = float(value)
  return value if math.isfinite(value) else str(value)  # JSON has no NaN/inf


def read_metrics(workdir: str, split: Optional[str] = None):
  """The records of `metrics.jsonl` (skipping a torn last line)."""
  path = os.path.join(workdir, METRICS_FILE)
  records = []
  if not os.path.exists(path):
    return records
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        continue
      if split is None or record.get("split") == split:
        records.append(record)
  return records


class MetricWriter:
  """Writes on process 0 only; a no-op elsewhere."""

  def __init__(self, workdir: str, resume_step: int = 0):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, METRICS_FILE)
    self._tb = None
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self._truncate_after(resume_step)
    try:
      import tensorflow as tf
      self._tb = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("TensorBoard summaries disabled: %s", e)

  def _truncate_after(self, step: int) -> None:
    kept = [r for r in read_metrics(os.path.dirname(self.path)) if r["step"] <= step]
    with open(self.path + ".tmp", "w", encoding="utf-8") as f:
      for record in kept:
        f.write(json.dumps(record) + "\n")
    os.replace(self.path + ".tmp", self.path)

  def write(self, step: int, split: str, metrics: Dict[str, float]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), "split": split}
    record.update({k: _clean(v) for k, v in sorted(metrics.items())})
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")
      f.flush()
    if self._tb is not None:
      import tensorflow as tf
      with self._tb.as_default(step=int(step)):
        for k, v in metrics.items():
          tf.summary.scalar(f"{split}/{k}", float(v))
      self._tb.flush()

  def console(self, step: int, total: int, split: str, metrics: Dict[str, float]) -> None:
    if not self.enabled:
      return
    keys = ("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate", "sequences_per_sec")
    shown = " ".join(f"{k}={metrics[k]:.4g}" for k in keys if k in metrics)
    print(f"[{split}] step {step}/{total} {shown}", flush=True)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
