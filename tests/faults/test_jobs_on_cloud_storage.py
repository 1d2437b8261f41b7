"""The fine-tuning jobs (GLUE MRPC, SQuAD, the feature-based tagger) with their workdir on Cloud
Storage (the emulator of tests/test_cloud_storage.py), each run as a user runs it
(`python -m bert_jax.main`), faulted as on local disk (test_kill_during_checkpoint_and_evaluation):

1. kill -9 once a checkpoint of step 2 or later is committed in the bucket (on Cloud Storage a
   step is complete when its commit marker is written; there is no rename): the same command
   resumes from the newest committed step (GLUE; SQuAD and the tagger resume from it in 4);
2. SIGTERM at the same moment (a preemption): the run saves its step in the bucket and exits 0;
   the same command resumes from that step (GLUE);
3. kill -9, then the newest committed checkpoint damaged in the bucket (a byte changed in every KiB
   of its array data objects, downloaded and uploaded back over the same names: the values
   decode, to other numbers; one byte in the middle of the largest object can lie where no array
   is read from, as it does for the tagger): the same command does not take it, sets it aside in
   checkpoints_corrupt/ and starts over (these jobs keep one checkpoint);
4. kill -9 while a checkpoint after a committed one is half written in the bucket (objects of the
   step there, its commit marker not): the same command resumes from the committed step, never
   the half-written one;
5. a storage outage past the retry budget (the test's own emulator paused with SIGSTOP, the
   budget cut to seconds): the run ends with exit status 1 and an error naming its gs:// path
   within a bounded time; with the store back, the same command resumes from the newest
   committed step.
SQuAD runs on GLUE's task framework, loop and checkpoints: it is the mid-write case (4) here, whose
resume is the hardest and whose end checks its own files (predictions, n-best) from the bucket;
the tagger, a job of its own, has every case but 1 and 2, GLUE every case.
Either way the last run ends exactly as the uninterrupted run on local disk: metrics.jsonl without
wall-clock fields, results.json, the prediction files, best/ and the final parameters, byte for
byte, all read from a copy of the bucket made over the emulator's own API.
"""
import os
import re
import signal
import subprocess
import time

import pytest

from tests import demo_runs
from tests.faults import damage, job_runs
from tests.faults.job_runs import output, train_dir
from tests import test_cloud_storage
from tests.test_cloud_storage import (BUCKET, SHORT_BUDGET, _committed_steps, _download,
                                      _half_written_steps, _no_local_gs_folder, _objects,
                                      _own_emulator, _step_folders, _upload)

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow

FINE_TUNING = ("glue", "squad", "tagger")
# The jobs of the damaged-checkpoint and outage cases: SQuAD runs on GLUE's task framework, loop
# and checkpoints (its case here is the mid-write one).
OWN_LOOPS = ("glue", "tagger")
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
  (where a `gs:` path mistaken for a local one would leave a folder); `env`: variables added to
  its environment (a retry budget)."""

  def __init__(self, jobs, job, url, prefix, scratch, **env):
    self.jobs, self.job, self.url, self.prefix, self.scratch = jobs, job, url, prefix, scratch
    self.workdir = f"gs://{BUCKET}/{prefix}"
    self.directory = train_dir(job, prefix)   # the loop's folder, as an object name prefix
    self.env = dict(env, STORAGE_EMULATOR_HOST=url)

  def newest(self):
    """The newest committed step in the bucket (0: none)."""
    return max(_committed_steps(self.url, self.directory), default=0)

  def start_and_wait(self, moment, what, log="killed", timeout=300):
    """The job started in the background; (its process, its log) once `moment(process)` is
    true. A run that ends first, or a moment not come in `timeout` s, fails the test (the run
    killed)."""
    log = os.path.join(self.scratch, log)
    process = self.jobs.start(self.job, self.workdir, log, cwd=self.scratch, **self.env)
    deadline = time.time() + timeout
    try:
      while not moment(process):
        assert process.poll() is None, (f"the run ended (exit {process.returncode}) before "
                                        f"{what}:\n{output(log)[-4000:]}")
        assert time.time() < deadline, f"not {what} in {timeout} s"
        time.sleep(0.01)
    except BaseException:
      process.kill()
      process.wait()
      raise
    return process, log

  def killed_after_a_checkpoint(self, step=2, signum=signal.SIGKILL):
    """The job started, and sent `signum` once a checkpoint of `step` or later is committed in
    the bucket; returns the newest committed step once it has ended (SIGTERM: the step it saved
    on the way out)."""
    process, log = self.start_and_wait(lambda _: self.newest() >= step,
                                       f"a checkpoint of step {step}")
    process.send_signal(signum)
    process.wait(timeout=300)
    if signum == signal.SIGKILL:
      assert process.returncode == -signal.SIGKILL, "the run ended before it was killed"
    else:   # a preemption: the run saves its step and leaves cleanly
      assert process.returncode == 0, output(log)[-3000:]
      saved = re.search(r"Preempted: checkpoint at step (\d+) saved", output(log))
      assert saved, output(log)[-3000:]
      assert int(saved.group(1)) == self.newest()
    return self.newest()

  def killed_during_a_checkpoint_write(self):
    """The job killed (-9) while it writes a checkpoint after a committed one: objects of the
    step in the bucket, its commit marker not. Seen from outside, the run is stopped (SIGSTOP)
    and looked at again, so that it is killed only if the step is still without its marker;
    returns (that step, the newest committed one)."""
    def half_written(process):
      if not _half_written_steps(self.url, self.directory):
        return False
      process.send_signal(signal.SIGSTOP)
      if _half_written_steps(self.url, self.directory):
        return True
      process.send_signal(signal.SIGCONT)   # its marker came meanwhile: wait for the next one
      return False

    process, _ = self.start_and_wait(half_written, "a checkpoint caught half written")
    step = max(_half_written_steps(self.url, self.directory))
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=300)
    time.sleep(0.5)   # a request the run had sent whole still lands
    assert step not in _committed_steps(self.url, self.directory), \
        f"the step {step} was committed after all"
    return step, self.newest()

  def stopped_by_an_outage(self, store, step=2, timeout=150):
    """The job started, the store (its process) paused once a checkpoint of `step` or later is
    committed, and continued once the run has ended; (its exit status, its output, seconds from
    the pause to its end). A run still there after `timeout` s fails the test."""
    process, log = self.start_and_wait(lambda _: self.newest() >= step,
                                       f"a checkpoint of step {step}", log="outage")
    store.send_signal(signal.SIGSTOP)
    paused = time.time()
    try:
      process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      process.send_signal(signal.SIGABRT)   # its threads' stacks (PYTHONFAULTHANDLER), then it ends
      process.wait()
      pytest.fail(f"the run neither went on nor stopped {timeout} s into the outage:\n"
                  + output(log)[-20000:])
    finally:
      store.send_signal(signal.SIGCONT)
    return process.returncode, output(log), time.time() - paused

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


def _long_except(kept, jobs=FINE_TUNING):
  """`jobs` as parameters, all but `kept` long fault tests (`--tier=slow`)."""
  return [job if job == kept else pytest.param(job, marks=pytest.mark.long_fault)
          for job in jobs]


@pytest.mark.parametrize("job", ["glue"])
def test_killed_after_a_checkpoint_on_gs_resumes_from_the_bucket(job, jobs, reference, emulator,
                                                                  tmp_path):
  """GLUE only: SQuAD and the tagger are killed the same way in the two tests below (then their
  checkpoint damaged), and resume from the newest committed step with a half-written one beside
  it (kill -9 mid-write), which asks more of them than this."""
  _, expected = reference(job)
  runs = _GsRuns(jobs, job, emulator, f"{job}-killed", str(tmp_path))
  newest = runs.killed_after_a_checkpoint()
  text = runs.rerun()
  assert _resumed_step(text) == newest, text[-3000:]
  runs.assert_ends_as(expected)


@pytest.mark.parametrize("job", ["glue"])
def test_sigterm_on_gs_saves_leaves_and_the_same_command_resumes(job, jobs, reference, emulator,
                                                                 tmp_path):
  """GLUE only: the save on the way out is the fine-tuning loop's for every job, and SQuAD and
  the tagger are preempted (SIGTERM during a checkpoint write and during an evaluation) in
  test_kill_during_checkpoint_and_evaluation.py."""
  _, expected = reference(job)
  runs = _GsRuns(jobs, job, emulator, f"{job}-preempted", str(tmp_path))
  newest = runs.killed_after_a_checkpoint(signum=signal.SIGTERM)
  text = runs.rerun()
  assert _resumed_step(text) == newest, text[-3000:]
  runs.assert_ends_as(expected)


@pytest.mark.parametrize("job", _long_except("glue", OWN_LOOPS))
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


@pytest.mark.parametrize("job", _long_except("glue"))
def test_kill_9_during_a_checkpoint_write_on_gs_resumes_from_the_newest_committed_step(
    job, jobs, reference, emulator, tmp_path):
  _, expected = reference(job)
  runs = _GsRuns(jobs, job, emulator, f"{job}-mid-write", str(tmp_path))
  half_written, newest = runs.killed_during_a_checkpoint_write()
  assert 0 < newest < half_written
  text = runs.rerun()
  assert _resumed_step(text) == newest, text[-3000:]
  runs.assert_ends_as(expected)
  print(f"killed with step {half_written} half written; resumed from {newest}")


@pytest.mark.long_fault
@pytest.mark.parametrize("job", OWN_LOOPS)
def test_a_storage_outage_past_the_retry_budget_ends_the_job_and_the_same_command_resumes(
    job, jobs, reference, tmp_path):
  """The store paused (its own emulator) after a committed checkpoint and left paused: the run
  stops with exit status 1 and an error naming its gs:// path, within a bounded time (the short
  retry budget); with the store back, the same command resumes from the newest committed step
  and ends as the uninterrupted local run."""
  _, expected = reference(job)
  with _own_emulator() as (store, url):
    runs = _GsRuns(jobs, job, url, f"{job}-outage", str(tmp_path), PYTHONFAULTHANDLER="1",
                   **SHORT_BUDGET)
    returncode, text, stopped_after = runs.stopped_by_an_outage(store)
    error = text[text.rfind("Traceback (most recent call last)"):]
    assert returncode == 1, text[-5000:]
    assert f"{runs.workdir}/" in error and "retry attempts failed" in error, text[-5000:]
    assert "Remote storage did not answer within the retry budget" in error, text[-5000:]
    newest = runs.newest()
    text = runs.rerun()
    assert _resumed_step(text) == newest, text[-3000:]
    runs.assert_ends_as(expected)
  print(f"the run stopped {stopped_after:.0f} s into the outage; resumed from step {newest}:",
        [line for line in error.splitlines() if runs.workdir in line][-1][:300])
