"""The fine-tuning jobs (GLUE MRPC, SQuAD, the feature-based tagger) with their workdir on Cloud
Storage (the emulator of tests/test_cloud_storage.py), each run as a user runs it
(`python -m bert_jax.main`), faulted as on local disk (test_kill_during_checkpoint_and_evaluation):

1. kill -9 once a checkpoint of step 2 or later is committed in the bucket (on Cloud Storage a
   step is complete when its commit marker is written; there is no rename): the same command
   resumes from the newest committed step;
2. SIGTERM at the same moment (a preemption): the run saves its step in the bucket and exits 0;
   the same command resumes from that step;
3. kill -9, then the newest committed checkpoint damaged in the bucket (a byte changed in every KiB
   of its array data objects, downloaded and uploaded back over the same names: the values
   decode, to other numbers; one byte in the middle of the largest object can lie where no array
   is read from, as it does for the tagger): the same command does not take it, sets it aside in
   checkpoints_corrupt/ and starts over (these jobs keep one checkpoint).
Either way the last run ends exactly as the uninterrupted run on local disk: metrics.jsonl without
wall-clock fields, results.json, the prediction files, best/ and the final parameters, byte for
byte, all read from a copy of the bucket made over the emulator's own API.
"""
import os
import re
import signal
import time

import pytest

from tests import demo_runs
from tests.faults import damage, job_runs
from tests.faults.job_runs import output, train_dir
from tests import test_cloud_storage
from tests.test_cloud_storage import (BUCKET, _committed_steps, _download, _no_local_gs_folder,
                                      _objects, _upload)

FINE_TUNING = ("glue", "squad", "tagger")
emulator = test_cloud_storage.emulator   # the fixture: one emulator for this module's tests


def _copy(url, prefix, directory):
  """The bucket's objects under `prefix` as files under `directory` (folder objects, names that
  end in "/", become folders); returns `directory`."""
  for name in _objects(url, prefix + "/"):
    path = os.path.join(directory, os.path.relpath(name, prefix))
    if name.endswith("/"):
      os.makedirs(path, exist_ok=True)
      continue
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
      f.write(_download(url, name))
  return directory


def _step_folders(url, prefix):
  """Every step number with an object under `prefix`/checkpoints/, committed or not."""
  depth = prefix.count("/") + 2
  return {int(n.split("/")[depth]) for n in _objects(url, f"{prefix}/checkpoints/")
          if n.count("/") > depth and n.split("/")[depth].isdigit()}


def _damage(url, step_prefix, kind, scratch):
  """`damage.apply(kind)` to a checkpoint step in the bucket: the step copied to `scratch`,
  damaged there, every file it changed uploaded back over its object."""
  local = _copy(url, step_prefix, scratch)
  files = [os.path.join(d, f) for d, _, names in os.walk(local) for f in names]
  before = {path: _read(path) for path in files}
  damage.apply(kind, local)
  changed = {path: _read(path) for path in files if _read(path) != before[path]}
  assert changed, f"{kind} changed nothing in {step_prefix}"
  for path, data in changed.items():
    _upload(url, f"{step_prefix}/{os.path.relpath(path, local)}", data)


def _read(path):
  with open(path, "rb") as f:
    return f.read()


class _GsRuns:
  """One job's command with its workdir at gs://BUCKET/`prefix`, started from a scratch folder
  (where a `gs:` path mistaken for a local one would leave a folder)."""

  def __init__(self, jobs, job, url, prefix, scratch):
    self.jobs, self.job, self.url, self.prefix, self.scratch = jobs, job, url, prefix, scratch
    self.workdir = f"gs://{BUCKET}/{prefix}"
    self.directory = train_dir(job, prefix)   # the loop's folder, as an object name prefix
    self.env = {"STORAGE_EMULATOR_HOST": url}

  def killed_after_a_checkpoint(self, step=2, timeout=300, signum=signal.SIGKILL):
    """The job started, and sent `signum` once a checkpoint of `step` or later is committed in
    the bucket; returns the newest committed step once it has ended (SIGTERM: the step it saved
    on the way out)."""
    log = os.path.join(self.scratch, "killed")
    process = self.jobs.start(self.job, self.workdir, log, cwd=self.scratch, **self.env)
    deadline = time.time() + timeout
    try:
      while max(_committed_steps(self.url, self.directory), default=0) < step:
        assert process.poll() is None, (f"the run ended (exit {process.returncode}) before a "
                                        f"checkpoint of step {step}:\n{output(log)[-4000:]}")
        assert time.time() < deadline, f"no checkpoint of step {step} in {timeout} s"
        time.sleep(0.05)
    finally:
      process.send_signal(signum)
      process.wait(timeout=300)
    if signum == signal.SIGKILL:
      assert process.returncode == -signal.SIGKILL, "the run ended before it was killed"
    else:   # a preemption: the run saves its step and leaves cleanly
      assert process.returncode == 0, output(log)[-3000:]
      saved = re.search(r"Preempted: checkpoint at step (\d+) saved", output(log))
      assert saved, output(log)[-3000:]
      assert int(saved.group(1)) == max(_committed_steps(self.url, self.directory))
    return max(_committed_steps(self.url, self.directory))

  def rerun(self):
    """The same command to its end; its output."""
    result = self.jobs.run(self.job, self.workdir, cwd=self.scratch, **self.env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout

  def assert_ends_as(self, expected):
    """No half-written step left in the bucket, and the outcome of the local reference."""
    assert _step_folders(self.url, self.directory) == set(
        _committed_steps(self.url, self.directory)), "a step without its commit marker was left"
    ours = job_runs.outcome(self.job, _copy(self.url, self.prefix,
                                            os.path.join(self.scratch, "copy")))
    job_runs.assert_same_outcome(ours, expected)
    _no_local_gs_folder(self.scratch, demo_runs.ROOT)


def _resumed_step(text):
  found = re.search(r"Resumed from the checkpoint at step (\d+) in gs://", text)
  return int(found.group(1)) if found else None


def _long_except(kept):
  """The jobs as parameters, all but `kept` long fault tests (`--long-faults`)."""
  return [job if job == kept else pytest.param(job, marks=pytest.mark.long_fault)
          for job in FINE_TUNING]


@pytest.mark.parametrize("job", FINE_TUNING)
def test_killed_after_a_checkpoint_on_gs_resumes_from_the_bucket(job, jobs, reference, emulator,
                                                                  tmp_path):
  _, expected = reference(job)
  runs = _GsRuns(jobs, job, emulator, f"{job}-killed", str(tmp_path))
  newest = runs.killed_after_a_checkpoint()
  text = runs.rerun()
  assert _resumed_step(text) == newest, text[-3000:]
  runs.assert_ends_as(expected)


@pytest.mark.parametrize("job", _long_except("glue"))
def test_sigterm_on_gs_saves_leaves_and_the_same_command_resumes(job, jobs, reference, emulator,
                                                                 tmp_path):
  _, expected = reference(job)
  runs = _GsRuns(jobs, job, emulator, f"{job}-preempted", str(tmp_path))
  newest = runs.killed_after_a_checkpoint(signum=signal.SIGTERM)
  text = runs.rerun()
  assert _resumed_step(text) == newest, text[-3000:]
  runs.assert_ends_as(expected)


@pytest.mark.parametrize("job", _long_except("glue"))
def test_newest_checkpoint_damaged_on_gs_is_set_aside_and_the_run_ends_as_the_reference(
    job, jobs, reference, emulator, tmp_path):
  _, expected = reference(job)
  runs = _GsRuns(jobs, job, emulator, f"{job}-damaged", str(tmp_path))
  newest = runs.killed_after_a_checkpoint()
  _damage(emulator, f"{runs.directory}/checkpoints/{newest}", "bytes_changed_throughout",
          str(tmp_path / "damaged"))
  text = runs.rerun()
  assert f"CHECKPOINT AT STEP {newest} IS UNREADABLE" in text, text[-3000:]
  assert (_resumed_step(text) or 0) < newest, text[-3000:]
  assert any(n.startswith(f"{runs.directory}/checkpoints_corrupt/{newest}-")
             for n in _objects(emulator, f"{runs.directory}/checkpoints_corrupt/"))
  runs.assert_ends_as(expected)
