"""Metrics to `WORKDIR/metrics.jsonl` and TensorBoard (`WORKDIR/tensorboard`); the training loop
prints the console lines.

Each JSON line is `{"step": int, "split": "train"|"eval", "loss": float, "mlm_accuracy": ...,
"nsp_accuracy": ..., ...}`. On resume the file is cut back to the restored step, so a run that was
killed and restarted leaves exactly the lines of an uninterrupted run (no duplicates, no torn
last line); a run that starts from step 0 (nothing to resume: a predict-only run again, or every
checkpoint unreadable) starts the file afresh.

On a local disk every line is appended as it is logged. On Cloud Storage (objects cannot be
appended to) the lines are kept and the file is rewritten whole at `flush()`, which the training
loop calls before every checkpoint (so that a complete checkpoint never has lines missing below
it): lines logged after the last checkpoint are logged again by the resumed run anyway.
TensorBoard's event file is handled the same way there: written to a local folder, and uploaded
at `flush()` and `close()` through the filesystem's checked copy (TensorFlow's own writer checks
nothing it uploads), so a file the store did not keep fails the checkpoint, naming it. The
local folder is removed at `close()`; the folders of processes killed before it are removed by the
next writer on the machine (their names carry the writing process's id).
"""
import glob
import json
import math
import os
import shutil
import tempfile
from typing import Dict, List, Optional

from absl import logging

from bert_jax.io import filesystem
from bert_jax.runtime import outputs

METRICS_FILE = "metrics.jsonl"
# The local event-file folders of writers to Cloud Storage: PREFIX<pid>_<random>.
TENSORBOARD_BUFFER_PREFIX = "bert_jax_tensorboard_"


def _running(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:   # another user's process
    return True
  return True


def remove_orphaned_buffers(directory: Optional[str] = None) -> List[str]:
  """Removes the event-file folders (in `directory`, default the temporary directory) whose
  writing process no longer runs (killed before `close()`); returns them."""
  removed = []
  pattern = os.path.join(directory or tempfile.gettempdir(), TENSORBOARD_BUFFER_PREFIX + "*_*")
  for path in glob.glob(pattern):
    pid = os.path.basename(path)[len(TENSORBOARD_BUFFER_PREFIX):].split("_")[0]
    if pid.isdigit() and not _running(int(pid)):
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
  return removed

# Fields that depend on wall-clock time or on where the logging window began (a resumed run's
# first window is shorter: pairs_per_row averages other steps); everything else is a pure
# function of the run.
TIMING_FIELDS = ("sequences_per_sec", "tokens_per_sec", "real_tokens_per_sec", "steps_per_sec",
                 "examples_per_sec", "train_seconds",
                 "pairs_per_row")


def _clean(value):
  value = float(value)
  return value if math.isfinite(value) else str(value)  # JSON has no NaN/inf


def read_metrics(workdir: str, split: Optional[str] = None):
  """The records of `metrics.jsonl` (skipping a torn last line). A metrics.jsonl that is a link
out of the workdir, a FIFO or a device is refused (`filesystem.UnsafeNameError`), not read."""
  path = filesystem.confined(workdir, METRICS_FILE, held_by=workdir)
  records = []
  if not filesystem.exists(path):
    return records
  with filesystem.open(path) as f:
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
    self.enabled = outputs.is_writer()
    self.path = filesystem.join(workdir, METRICS_FILE)
    self._buffered = filesystem.is_url(self.path)   # whole-file rewrites at flush()
    self._lines: List[str] = []
    # The last step metrics.jsonl recorded beyond `resume_step` (lines cut), or None.
    self.recorded_beyond: Optional[int] = None
    self._tb = None
    self._tb_dir = filesystem.join(workdir, "tensorboard")
    # On Cloud Storage: the local folder the event file is written in, uploaded at flush().
    self._tb_local: Optional[str] = None
    if not self.enabled:
      return
    filesystem.makedirs(workdir)
    self._truncate_after(workdir, resume_step)
    # TensorFlow's event writer follows links: the folder and what is in it are the workdir's
    # own (a planted link to a folder outside it is refused by name, nothing written there).
    if filesystem.exists(self._tb_dir):
      filesystem.confined(workdir, "tensorboard", held_by=workdir, folder=True)
      filesystem.check_tree(self._tb_dir, held_by=self._tb_dir)
    try:
      import tensorflow as tf
      local = None
      if self._buffered:
        remove_orphaned_buffers()
        local = tempfile.mkdtemp(prefix=f"{TENSORBOARD_BUFFER_PREFIX}{os.getpid()}_")
      self._tb = tf.summary.create_file_writer(local or self._tb_dir)
      self._tb_local = local
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("TensorBoard summaries disabled: %s", e)

  def _truncate_after(self, workdir: str, step: int) -> None:
    records = read_metrics(workdir)
    # The lines at the restored step itself were logged before its checkpoint was saved, and a
    # resumed run does not log them again; a run from step 0 logs all of its lines.
    self._lines = [json.dumps(r) + "\n" for r in records if step > 0 and r["step"] <= step]
    self.recorded_beyond = max((r["step"] for r in records if r["step"] > step), default=None)
    filesystem.write_text(self.path, "".join(self._lines))

  def write(self, step: int, split: str, metrics: Dict[str, float]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), "split": split}
    record.update({k: _clean(v) for k, v in sorted(metrics.items())})
    line = json.dumps(record) + "\n"
    if self._buffered:
      self._lines.append(line)
    else:
      with filesystem.open(self.path, "a") as f:
        f.write(line)
    if self._tb is not None:
      import tensorflow as tf
      with self._tb.as_default(step=int(step)):
        for k, v in metrics.items():
          tf.summary.scalar(f"{split}/{k}", float(v))
      self._tb.flush()

  def flush(self) -> None:
    """Makes every logged line durable (Cloud Storage: rewrites the file whole and uploads the
    event file, both checked)."""
    if self.enabled and self._buffered:
      filesystem.write_text(self.path, "".join(self._lines))
      if self._tb_local is not None:
        self._tb.flush()
        filesystem.upload_tree(self._tb_local, self._tb_dir)

  def close(self) -> None:
    try:
      self.flush()
    finally:
      if self._tb is not None:
        self._tb.close()
      if self._tb_local is not None:
        shutil.rmtree(self._tb_local, ignore_errors=True)
        self._tb_local = None
