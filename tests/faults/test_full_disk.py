"""A full disk: the workdir on a real small file system (tmpfs, mounted by the test; root
only) that fills up during a run. The run stops with an error that names what it was writing
and what complete is kept; once space is freed (the tmpfs remounted larger) the same command
ends exactly as an uninterrupted run.

Pre-training: the disk fills while a checkpoint after the first is written. GLUE fine-tuning
(MRPC, `job_runs`): while a checkpoint is written; while WORKDIR/best/ is written over the best
model before it, which stays whole and loadable (best/ is replaced by renames, never rewritten in
place); while the predictions are written at the end (the error names the file).
"""
import os
import re
import signal

from bert_jax.tasks.framework import best_model, finetuning
from bert_jax.tasks.tools import fine_tuned
from tests import finetuning_fixtures as fx
from tests.faults import job_runs
from tests import demo_runs
import pytest

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow
OVERRIDES = ["--config.num_train_steps=8", "--config.keep_checkpoints=10",
             "--config.eval_every_steps=8"]


def _demo(workdir):
  return demo_runs.run(workdir, *OVERRIDES)


def _kib(path):
  """KiB the files under `path` take on a disk (whole blocks, as a tmpfs counts them)."""
  return sum(os.stat(os.path.join(d, f)).st_blocks for d, _, files in os.walk(path)
             for f in files) // 2 + 1


def test_a_full_disk_stops_the_run_and_the_same_command_resumes(small_disk, tmp_path):
  reference = str(tmp_path / "reference")
  assert _demo(reference).returncode == 0
  checkpoints = os.path.join(reference, "checkpoints")
  # Room for the data, the metrics and two checkpoints (and half of one more), not a third.
  one = _kib(os.path.join(checkpoints, "4"))
  room = _kib(os.path.join(reference, "data")) + _kib(os.path.join(checkpoints, "2")) + one * 3 // 2
  mount_point, mount = small_disk
  mount(room)
  workdir = str(mount_point / "run")

  failed = _demo(workdir)
  assert failed.returncode != 0
  assert "CheckpointWriteError" in failed.stderr and "the disk is full" in failed.stderr
  # Which save meets the full disk depends on a few KiB of metadata: the message names it.
  newest = re.search(r"the checkpoint at step (\d+) is the newest complete one", failed.stderr)
  assert newest and newest.group(1) in ("2", "4"), failed.stderr[-2000:]
  assert os.path.join(workdir, "checkpoints") in failed.stderr
  assert newest.group(1) in os.listdir(os.path.join(workdir, "checkpoints"))

  mount(room * 4, remount=True)   # space freed
  resumed = _demo(workdir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resumed from the checkpoint at step {newest.group(1)}" in resumed.stdout
  assert demo_runs.untimed_metrics(workdir) == demo_runs.untimed_metrics(reference)


def _fails_on_a_full_disk(run, error: str):
  assert run.returncode != 0
  assert error in run.stderr and "the disk is full" in run.stderr, run.stderr[-3000:]


def test_glue_a_full_disk_during_a_checkpoint_resumes_to_the_same_result(jobs, reference,
                                                                         small_disk):
  reference_dir, uninterrupted = reference("glue")
  # Room for what the finished run holds (one checkpoint, best/, the metrics and predictions)
  # and half a checkpoint more: the checkpoint of step 2, written while step 1's is there,
  # does not fit.
  one = _kib(os.path.join(reference_dir, "checkpoints", str(uninterrupted["final_step"])))
  room = _kib(reference_dir) + one // 2
  mount_point, mount = small_disk
  mount(room)
  workdir = str(mount_point / "glue")

  failed = jobs.run("glue", workdir)
  _fails_on_a_full_disk(failed, "CheckpointWriteError")
  assert (f"Could not write the checkpoint at step 2 in {os.path.join(workdir, 'checkpoints')}"
          in failed.stderr)
  assert "the checkpoint at step 1 is the newest complete one" in failed.stderr
  assert job_runs.checkpoint_steps(workdir)[0] == {1}

  mount(room * 4, remount=True)   # space freed
  resumed = jobs.run("glue", workdir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Resumed from the checkpoint at step 1" in resumed.stdout
  job_runs.assert_same_outcome(job_runs.outcome("glue", workdir), uninterrupted)


def test_glue_a_full_disk_while_the_predictions_are_written(jobs, reference, small_disk,
                                                            tmp_path):
  reference_dir, uninterrupted = reference("glue")
  mount_point, mount = small_disk
  mount(64 << 10)
  workdir = str(mount_point / "glue")
  log = str(tmp_path / "glue")
  run = job_runs.Interruption(jobs.start("glue", workdir, log), workdir, log)
  run.stop_after_checkpoint(uninterrupted["final_step"])
  assert not os.path.exists(os.path.join(workdir, finetuning.RESULTS_FILE)), (
      "the run wrote its results before it could be stopped")
  mount(job_runs.used_kib(mount_point), remount=True)   # not a page more: the disk is full
  failed = run.deliver(signal.SIGCONT)
  assert failed.returncode != 0
  printed = job_runs.output(log)
  named = re.search(r"No space left on device: '([^']+)'", printed)
  assert named and os.path.dirname(named.group(1)) == workdir, printed[-3000:]
  assert os.path.basename(named.group(1)) in ("dev_predictions.tsv", "MRPC.tsv", "results.json")
  assert not [n for n in os.listdir(workdir) if n.endswith(".tmp")]   # no half-written file

  mount(64 << 10, remount=True)   # space freed
  resumed = jobs.run("glue", workdir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  job_runs.assert_same_outcome(job_runs.outcome("glue", workdir), uninterrupted)


def _improving_glue(jobs):
  """Flags for an MRPC run whose f1 improves after its first evaluation (a dev set with both
  labels, a learning rate that moves the predictions, an evaluation and checkpoint every step):
  best/ is written at step 1 and written over at step 2, with no checkpoint removed between.
  Its encoder has a large vocabulary (unused entries): best/ takes MBs, far more than the tens
  of KiB by which Orbax's files of a checkpoint vary from one run to the next."""
  glue_dir, checkpoint = (os.path.join(jobs.root, name) for name in ("glue_both", "ckpt_16k"))
  if not os.path.exists(glue_dir):
    fx.write_glue_dir(glue_dir, dict(train=16, dev=10), seed=1)
    vocab = list(fx.VOCAB) + [f"[unused{i}]" for i in range(16000)]
    fx.write_checkpoint(checkpoint, vocab=vocab, vocab_size=len(vocab))
  return (f"--config.data.glue_dir={glue_dir}", f"--config.init_checkpoint={checkpoint}",
          "--config.learning_rate=1e-2", "--config.eval_every_steps=1")


def test_glue_a_full_disk_while_best_is_written_keeps_the_best_before_it(jobs, small_disk,
                                                                         tmp_path):
  flags = _improving_glue(jobs)
  reference_dir = str(tmp_path / "reference")
  assert jobs.run("glue", reference_dir, *flags).returncode == 0
  uninterrupted = job_runs.outcome("glue", reference_dir)
  f1 = [r["f1"] for r in uninterrupted["metrics"] if r["split"] == "eval"]
  assert f1[1] > f1[0], f"the run's f1 does not improve at step 2: {f1}"
  # Room for what the finished run holds and half a best/ more: the checkpoint of step 1 fits
  # beside the first best/, the second best/ beside them does not.
  room = _kib(reference_dir) + _kib(os.path.join(reference_dir, "best")) // 2
  mount_point, mount = small_disk
  mount(room)
  workdir = str(mount_point / "glue")
  best = os.path.join(workdir, "best")

  failed = jobs.run("glue", workdir, *flags)
  _fails_on_a_full_disk(failed, "BestWriteError")
  assert f"Could not write the best model of step 2 in {best}.partial" in failed.stderr
  assert f"{best} holds the best model before it" in failed.stderr
  # The unfinished one removed (its space given back), the one before it whole and loadable.
  assert sorted(n for n in os.listdir(workdir) if n.startswith("best")) == ["best"]
  assert best_model.read_best_info(workdir)["step"] == 1
  assert fine_tuned.load(workdir).directory == best   # check_best: every file as recorded

  mount(room * 4, remount=True)   # space freed
  resumed = jobs.run("glue", workdir, *flags)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  job_runs.assert_same_outcome(job_runs.outcome("glue", workdir), uninterrupted)
