"""kill -9 and SIGTERM during a checkpoint write and during an evaluation, then the newest
checkpoint damaged, for every job (pre-training, GLUE, SQuAD, the feature-based tagger), each
run as a user runs it (`python -m bert_jax.main`).

One job is interrupted five times in turn, as a preemptible cluster would, each time with the same
command again:
1. kill -9 while Orbax writes a checkpoint (its temporary step directory exists): the run dies,
   the half-written step is never taken for a checkpoint, the next run resumes from the newest
   complete one;
2. SIGTERM during an evaluation: the evaluation finishes and is logged, the step's checkpoint is
   saved, the run exits 0;
3. SIGTERM while a checkpoint is written: that write completes, the run saves once more at the
   next step and exits 0;
4. kill -9 during an evaluation: the run dies; no evaluation line of that step is left;
5. the newest checkpoint damaged on disk (bytes changed throughout its array files, files
   truncated, or its commit marker gone; one kind per job, every kind against the checkpointer
   in test_damaged_checkpoint.py):
   the next run sets it aside and goes on from the one before (or, where a job keeps one
   checkpoint, from the start); a marker missing on a local disk, where the rename is the
   commit, leaves a good checkpoint that is used.
After the four interruptions (1-4) the workdir is copied: the same command in the workdir
itself then runs to the end, and that run, which stands on the four resumes, ends exactly as the
uninterrupted run: metrics.jsonl without wall-clock fields, results.json, prediction files,
best/ and the final parameters, byte for byte. The damage (5) is done to the copy, taken as it
was after the fourth interruption, and its own run (the same command with the copy as its
workdir) is checked on its own: the damaged checkpoint set aside (or, for the commit marker,
used), and again the uninterrupted run's outcome. (GLUE and the tagger keep one checkpoint, so
their damaged run starts over from step 0 and says nothing of the resumes before it: hence the
comparison before the damage.)
"""
import os
import re
import shutil
import signal

import pytest

from tests.faults import damage, job_runs
from tests.faults.job_runs import JOBS, Interruption, checkpoint_steps, output, train_dir

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow

DAMAGE = {"pretraining": "bytes_changed_throughout", "glue": "truncated",
          "squad": "no_commit_marker", "tagger": "bytes_changed_throughout"}


def _resumed_step(text):
  found = re.search(r"Resumed from the checkpoint at step (\d+)", text)
  return int(found.group(1)) if found else 0


class _Runs:
  """The same command, started again and again in one workdir."""

  def __init__(self, jobs, job, workdir, eval_steps):
    self.jobs, self.job, self.workdir, self.eval_steps = jobs, job, workdir, eval_steps
    self.directory = train_dir(job, workdir)
    self.count = 0

  def start(self):
    self.count += 1
    log = f"{self.workdir}-{self.count}"   # each run's output in its own files
    return Interruption(self.jobs.start(self.job, self.workdir, log), self.directory, log), log


def _kill_9_during_checkpoint_write(runs):
  interruption, log = runs.start()
  step = interruption.stop_during_checkpoint_write()
  complete, _ = checkpoint_steps(runs.directory)
  assert interruption.deliver(signal.SIGKILL).returncode == -signal.SIGKILL
  after, writing = checkpoint_steps(runs.directory)
  assert step not in after and step in writing, "the half-written step must stay temporary"
  return max(complete)


def _sigterm_during_evaluation(runs, after_step):
  interruption, log = runs.start()
  step = interruption.stop_during_evaluation(runs.eval_steps, after_step)
  process = interruption.deliver(signal.SIGTERM)
  text = output(log)
  assert process.returncode == 0, text[-3000:]
  assert _resumed_step(text) == after_step, "the run did not resume where the last one stopped"
  assert f"Preempted: checkpoint at step {step} saved" in text, text[-3000:]
  evaluated = [r for r in job_runs.read_metrics(runs.directory)
               if r["split"] == "eval" and r["step"] == step]
  assert len(evaluated) == 1, "the interrupted evaluation is logged once"
  assert step in checkpoint_steps(runs.directory)[0]
  return step


def _sigterm_during_checkpoint_write(runs, after_step):
  interruption, log = runs.start()
  step = interruption.stop_during_checkpoint_write()
  process = interruption.deliver(signal.SIGTERM)
  text = output(log)
  assert process.returncode == 0, text[-3000:]
  assert _resumed_step(text) == after_step
  # The write goes on to its end; the run saves once more at a later step and leaves.
  saved = re.search(r"Preempted: checkpoint at step (\d+) saved", text)
  assert saved and int(saved.group(1)) > step, text[-3000:]
  complete, writing = checkpoint_steps(runs.directory)
  assert not writing and max(complete) == int(saved.group(1))
  return max(complete)


def _kill_9_during_evaluation(runs, after_step):
  interruption, log = runs.start()
  step = interruption.stop_during_evaluation(runs.eval_steps, after_step)
  complete, _ = checkpoint_steps(runs.directory)
  assert interruption.deliver(signal.SIGKILL).returncode == -signal.SIGKILL
  assert _resumed_step(output(log)) == after_step
  assert not [r for r in job_runs.read_metrics(runs.directory)
              if r["split"] == "eval" and r["step"] == step]
  return max(complete)


@pytest.mark.slow
@pytest.mark.parametrize("job", JOBS)
def test_interrupted_five_times_then_the_same_command_ends_as_an_uninterrupted_run(
    job, jobs, reference, tmp_path):
  _, expected = reference(job)
  eval_steps = {r["step"] for r in expected["metrics"] if r["split"] == "eval"}
  runs = _Runs(jobs, job, str(tmp_path / "run"), eval_steps)

  newest = _kill_9_during_checkpoint_write(runs)
  newest = _sigterm_during_evaluation(runs, newest)
  newest = _sigterm_during_checkpoint_write(runs, newest)
  newest = _kill_9_during_evaluation(runs, newest)
  damaged = str(tmp_path / "damaged")   # the workdir as the fourth interruption left it
  shutil.copytree(runs.workdir, damaged, symlinks=True)

  # The four resumes: the same command goes on from the newest checkpoint to the end and ends as
  # the uninterrupted run.
  resumed = runs.jobs.run(job, runs.workdir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _resumed_step(resumed.stdout) == newest, resumed.stdout[-3000:]
  assert not checkpoint_steps(runs.directory)[1], "a temporary step directory was left"
  job_runs.assert_same_outcome(job_runs.outcome(job, runs.workdir), expected)

  # The damage, on its own: the newest checkpoint of the copy damaged, then the same command.
  kind = DAMAGE[job]
  directory = train_dir(job, damaged)
  damage.apply(kind, os.path.join(directory, "checkpoints", str(newest)))
  final = runs.jobs.run(job, damaged)
  assert final.returncode == 0, final.stderr[-3000:]
  assert not checkpoint_steps(directory)[1], "a temporary step directory was left"
  if kind == "no_commit_marker":   # a local disk commits by renaming: the checkpoint is good
    assert _resumed_step(final.stdout) == newest
  else:
    assert f"CHECKPOINT AT STEP {newest} IS UNREADABLE" in final.stdout
    assert _resumed_step(final.stdout) < newest
    assert os.listdir(os.path.join(directory, "checkpoints_corrupt"))
  job_runs.assert_same_outcome(job_runs.outcome(job, damaged), expected)
