"""Faults of Cloud Storage (the emulator of tests/test_cloud_storage.py) under
`python -m bert_jax.main`, as a user runs it.

* The emulator restarted mid-run, its contents lost (a store that lost its data, a bucket
  deleted; a typo in a bucket's name is the same case): the run stops with an error naming the
  path (it used to loop for ever in TensorFlow's `makedirs`, asking the store about the missing
  bucket again and again); no checkpoint that is gone is claimed; the same command, with the
  bucket back, starts again from step 0 and ends exactly as an uninterrupted run. A run that
  finds metrics.jsonl but none of its checkpoints says loudly that it starts over.
* In the slow tier (`--tier=slow`) (minutes each): kill -9 while a checkpoint is half written on gs://;
  GLUE fine-tuning through a 30 s outage (the emulator paused).
"""
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax import parallel
from bert_jax.io import checkpoints
from bert_jax.runtime import job as jobs
from bert_jax.runtime.metric_writers import read_metrics
from tests import demo_runs
from tests import finetuning_fixtures as ftx
from tests.test_cloud_storage import (BUCKET, _committed_steps, _create_bucket, _demo, _download,
                                      _env, _half_written_steps, _main, _outage_env,
                                      _own_emulator,
                                      _records,
                                      _start_demo_and_wait_for_a_checkpoint,
                                      _start_emulator, _step_folders,
                                      assert_glue_outputs_equal,
                                      emulator, local_demo)  # noqa: F401  (fixtures)
from tests.faults.test_jobs_on_cloud_storage import _copy
from tests.test_loop_actions import _toy_job

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow


STOP_WITHIN = 120   # seconds from the restart to the run's exit (the short retry budget: seconds)


def test_a_missing_bucket_is_an_error_naming_it_not_a_loop(tmp_path):
  """Our filesystem layer and Orbax's paths (etils.epath over tf.io.gfile) alike."""
  script = (
      "from etils import epath\n"
      "from bert_jax.io import filesystem, remote_storage, training_checkpoints\n"
      "for make in (filesystem.makedirs,\n"
      "             lambda p: epath.Path(p).mkdir(parents=True, exist_ok=True)):\n"
      "  try:\n"
      "    make('gs://no-such-bucket/run/checkpoints')\n"
      "  except remote_storage.MissingBucketError as e:\n"
      "    print(e)\n")
  with _own_emulator() as (_, url):
    run = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path),
                         env=dict(_outage_env(url)), capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  assert run.stdout.count("the bucket gs://no-such-bucket does not exist") == 2, run.stdout


def test_the_store_restarted_empty_mid_run_stops_it_and_the_rerun_says_it_starts_over(
    local_demo, tmp_path):  # noqa: F811
  with _own_emulator() as (store, url):
    proc = _start_demo_and_wait_for_a_checkpoint(url, "restart", str(tmp_path))
    store.kill()
    store.wait()
    restarted = time.time()
    port = int(url.rsplit(":", 1)[1])
    store, _ = _start_emulator(port=port)   # empty: no bucket, no objects
    try:
      try:
        output = proc.communicate(timeout=STOP_WITHIN)[0]
      except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)   # its threads' stacks (PYTHONFAULTHANDLER), then it ends
        pytest.fail(f"the run neither failed nor finished {STOP_WITHIN} s after the store lost "
                    "its bucket:\n" + proc.communicate()[0][-20000:])
      stopped_after = time.time() - restarted
      assert proc.returncode == 1, output[-5000:]
      assert f"the bucket gs://{BUCKET} does not exist" in output or "404" in output, \
          output[-5000:]
      assert f"gs://{BUCKET}/restart" in output, output[-5000:]

      # The bucket back, empty: the same command starts again from step 0, and says so.
      _create_bucket(url)
      assert not _committed_steps(url, "restart")
      again = subprocess.run(_demo(f"gs://{BUCKET}/restart"), cwd=str(tmp_path),
                             env=_outage_env(url), capture_output=True, text=True, timeout=600)
      assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
      assert "Resumed from" not in again.stdout
      ours = _records(_download(url, "restart/metrics.jsonl"))
    finally:
      store.kill()
      store.wait()
  assert ours == demo_runs.untimed_metrics(local_demo)
  print(f"the run stopped {stopped_after:.0f} s after the store lost its bucket:",
        [line for line in output.splitlines() if "Error" in line][-1])


def test_a_run_whose_checkpoints_are_gone_says_what_it_trains_again(tmp_path, capsys):
  """The loop, on any store: steps metrics.jsonl recorded past the checkpoint resumed from are
  announced as trained again, and a run with none of its checkpoints left says loudly that it
  starts from step 0 (it used to start over without a word)."""
  workdir = tmp_path / "toy"
  job = lambda: _toy_job(6, log_every_steps=1, checkpoint_every_steps=2)
  jobs.run(job(), str(workdir), parallel.JitParallel())
  capsys.readouterr()
  shutil.rmtree(workdir / "checkpoints" / "6")
  jobs.run(job(), str(workdir), parallel.JitParallel())
  out = capsys.readouterr().out
  assert "Resumed from the checkpoint at step 4" in out
  assert "metrics.jsonl went on to step 6: steps 5-6 are trained again." in out
  shutil.rmtree(workdir / "checkpoints")
  jobs.run(job(), str(workdir), parallel.JitParallel())
  out = capsys.readouterr().out
  assert "Resumed" not in out
  assert (f"!!! [toy] NO CHECKPOINT in {workdir / 'checkpoints'}, but metrics.jsonl records "
          "this run up to step 6") in out
  assert [r["step"] for r in read_metrics(str(workdir), "train")] == list(range(1, 7))


@pytest.mark.long_fault
def test_kill_9_during_a_checkpoint_write_on_gs_resumes_from_the_newest_complete_one(
    emulator, local_demo, tmp_path):  # noqa: F811
  """On Cloud Storage a checkpoint has no atomic rename: it is complete once its commit marker is
  written. Killed while one is half written (objects there, no marker), the run must resume from
  the one before it and end exactly as an uninterrupted run.

  The kill is made to land before the marker: once the bucket shows a step after a committed one
  without its marker, the run is stopped (SIGSTOP), requests it had sent whole are given time to
  land, and the bucket is looked at again; only a step still without its marker is killed (-9)
  (one whose marker landed meanwhile: the run goes on to its next checkpoint). After the kill the
  marker is still absent, the same command resumes from the newest committed step (before the
  half-written one), and every step's metrics and the final parameters are those of the
  uninterrupted local run."""
  prefix = "killed_mid_write"
  log = str(tmp_path / "killed.log")
  with open(log, "w") as out:
    proc = subprocess.Popen(_demo(f"gs://{BUCKET}/{prefix}"), cwd=str(tmp_path), env=_env(),
                            stdout=out, stderr=subprocess.STDOUT)
  read_log = lambda: open(log, encoding="utf-8", errors="replace").read()
  half_written, deadline = None, time.time() + 300
  try:
    while half_written is None:
      assert proc.poll() is None, "no checkpoint caught half written:\n" + read_log()[-3000:]
      assert time.time() < deadline, "no checkpoint caught half written in 300 s"
      if _half_written_steps(emulator, prefix):
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.5)   # a request the run had sent whole lands meanwhile
        still = _half_written_steps(emulator, prefix)
        if still:
          half_written = max(still)
        else:
          proc.send_signal(signal.SIGCONT)   # its marker came: wait for the next checkpoint
      time.sleep(0.005)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL
  time.sleep(0.5)
  committed = _committed_steps(emulator, prefix)
  assert half_written not in committed, f"the step {half_written} was committed after all"
  assert half_written in _step_folders(emulator, prefix), "its objects are gone"
  newest = max(committed)
  assert newest < half_written

  again = subprocess.run(_demo(f"gs://{BUCKET}/{prefix}"), cwd=str(tmp_path), env=_env(),
                         capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
  assert f"Resumed from the checkpoint at step {newest} " in again.stdout, again.stdout[-3000:]
  assert _records(_download(emulator, f"{prefix}/metrics.jsonl")) == demo_runs.untimed_metrics(
      local_demo)
  ours = checkpoints.flatten(checkpoints.load_pretrained(
      _copy(emulator, prefix, str(tmp_path / "copy")))[1])
  theirs = checkpoints.flatten(checkpoints.load_pretrained(local_demo)[1])
  assert ours.keys() == theirs.keys()
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
  print(f"killed with the checkpoint at step {half_written} half written; resumed from {newest}")


@pytest.mark.long_fault
def test_fine_tuning_on_gs_rides_out_a_30_s_outage(tmp_path):
  """GLUE fine-tuning with its workdir on gs://: the emulator paused (SIGSTOP) for 30 s after the
  first checkpoint, then continued. With the default retry budget (30 s without a byte, 6
  retries) the run waits and ends exactly as the same run on local disk."""
  glue = ftx.write_glue_dir(str(tmp_path / "glue"), dict(train=12, dev=10, test=5))
  ckpt = ftx.write_checkpoint(str(tmp_path / "ckpt"))
  flags = ["--config.max_seq_length=16", "--config.eval_batch_size=4",
           f"--config.init_checkpoint={ckpt}", f"--config.data.glue_dir={glue}"]
  config = "experiments/glue.py:task=mrpc,quick"
  local = str(tmp_path / "local")
  subprocess.run(_main(config, local, *flags), cwd=str(tmp_path), env=_env(), check=True,
                 capture_output=True, timeout=600)
  with _own_emulator() as (emulator_proc, url):
    env = dict(_env(), STORAGE_EMULATOR_HOST=url, PYTHONFAULTHANDLER="1")
    for name in ("BERT_JAX_STORAGE_TIMEOUT_SECS", "BERT_JAX_STORAGE_RETRIES",
                 "BERT_JAX_STORAGE_RETRY_DELAY_SECS"):
      env.pop(name, None)   # the defaults
    proc = subprocess.Popen(_main(config, f"gs://{BUCKET}/ft_outage", *flags), cwd=str(tmp_path),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while not _committed_steps(url, "ft_outage"):
      assert proc.poll() is None, "ended before its first checkpoint:\n" + proc.stdout.read()
      time.sleep(0.1)
    emulator_proc.send_signal(signal.SIGSTOP)
    time.sleep(30)
    emulator_proc.send_signal(signal.SIGCONT)
    try:
      output = proc.communicate(timeout=900)[0]
    except subprocess.TimeoutExpired:
      proc.send_signal(signal.SIGABRT)
      pytest.fail("the run did not end 15 minutes after the outage:\n"
                  + proc.communicate()[0][-20000:])
    assert proc.returncode == 0, output[-5000:]
    assert_glue_outputs_equal(url, "ft_outage", local)
