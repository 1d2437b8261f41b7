"""One of 2 processes killed with SIGKILL (a host lost) mid-run.

The other must leave within a bounded time, with a non-zero exit and a message that says what
happened, never wait for ever; nothing complete is lost, and the same command on 2 new processes
resumes from the newest complete checkpoint and ends exactly as an uninterrupted run.

What bounds the wait:
* a survivor in a collective with the killed process (a training step) fails at once: the kernel
  resets the killed process's connections (gloo on CPU); so does one whose coordinator
  (process 0, which runs jax's coordination service) was killed;
* a survivor waiting only at a barrier of the coordination service (the end of an async
  checkpoint write, the last one of the run: no step follows it) fails once the killed process has
  missed its heartbeats for `--heartbeat_timeout_seconds` (30 s). With jax's default (100 s)
  process 0 waited there 82-93 s.
Processes log to `<workdir>.process<i>.out|err` (tests/test_multihost.py). Four launches of 2
processes and a heartbeat timeout: run with `python -m pytest --tier=slow tests/faults`.
"""
import os
import signal
import time

import pytest

from bert_jax.runtime.metric_writers import read_metrics
from tests import pretraining_fixtures as fx
from tests.test_multihost import (_launch, _outputs, _start,
                                  assert_ends_as_an_uninterrupted_run)

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow

STEPS = 20
EVERY = 5   # async checkpoints, as in real runs
OVERRIDES = {"num_train_steps": STEPS, "checkpoint_every_steps": EVERY, "eval_every_steps": 0,
             "log_every_steps": 1, "keep_checkpoints": 10, "async_checkpointing": True}
LEAVE_WITHIN = 60   # seconds from the kill to the survivor's exit: the heartbeat timeout + margin
START_WITHIN = 300  # seconds for the processes to reach the moment of the kill
# What the survivor says: our exit after an error (bert_jax/main.py), or jax's own when the
# coordination service reports the lost process before any Python call fails.
LEFT_MESSAGES = ("failed and leaves now, so that the others stop too",
                 "Terminating process because the JAX distributed service detected fatal errors")


def _complete_steps(workdir):
  return sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())


def _until(condition, procs, what):
  deadline = time.time() + START_WITHIN
  while not condition():
    if time.time() > deadline or any(p.poll() is not None for p in procs):
      for proc in procs:
        proc.kill()
      raise AssertionError(f"no {what} within {START_WITHIN} s, or a process ended first:\n"
                           + "\n".join(err[-2000:] for _, err in _outputs(procs)))
    time.sleep(0.002)


def _kill_and_time_the_survivor(procs, victim, kill):
  """Runs `kill()`, then waits for the other process; checks it left in time, with a non-zero
  status and a message saying why."""
  kill()
  killed_at = time.time()
  survivor = procs[1 - victim]
  while survivor.poll() is None and time.time() - killed_at < 2 * LEAVE_WITHIN:
    time.sleep(0.05)
  left_after = time.time() - killed_at
  if survivor.poll() is None:
    survivor.kill()
  procs[victim].wait()
  err = _outputs(procs)[1 - victim][1]
  assert left_after < LEAVE_WITHIN, f"the survivor left {left_after:.0f} s after the kill"
  assert survivor.returncode != 0, err[-3000:]
  assert any(m in err for m in LEFT_MESSAGES), err[-3000:]
  print(f"process {1 - victim} left {left_after:.1f} s after process {victim} was killed")


@pytest.mark.long_fault
def test_a_killed_process_ends_the_other_in_bounded_time_and_the_pair_resumes_exactly(tmp_path):
  fx.make_data(str(tmp_path / "data"))
  experiment = fx.write_experiment(str(tmp_path), str(tmp_path / "data"), **OVERRIDES)
  workdir = str(tmp_path / "work")

  # 1. The coordinator (process 0) killed mid-step, once a checkpoint is complete and a later
  # step logged (steps: 10-100 ms; an async save can commit a few steps after its own under load).
  procs = _start(experiment, workdir)

  def a_step_after_a_complete_checkpoint():
    complete = (_complete_steps(workdir)
                if os.path.isdir(os.path.join(workdir, "checkpoints")) else [])
    return bool(complete) and any(r["step"] > complete[-1] for r in read_metrics(workdir))

  _until(a_step_after_a_complete_checkpoint, procs, "a step after a complete checkpoint")
  _kill_and_time_the_survivor(procs, 0, procs[0].kill)
  complete = _complete_steps(workdir)
  assert complete and complete[-1] < STEPS, complete

  # 2. The same command resumes; process 1 killed while the run's last checkpoint is written:
  # stopped once its own part of the state is written (its temporary files are Orbax's), killed
  # while process 0 waits for it at the write's barrier (no step follows for a collective to
  # fail: the heartbeat timeout ends the wait).
  procs = _start(experiment, workdir)
  part = os.path.join(workdir, "checkpoints", f"{STEPS}.orbax-checkpoint-tmp",
                      "state.orbax-checkpoint-tmp", "array_metadatas", "process_1")
  _until(lambda: os.path.exists(part), procs, "last checkpoint")
  def stop_then_kill():
    procs[1].send_signal(signal.SIGSTOP)
    time.sleep(1)
    procs[1].kill()
  _kill_and_time_the_survivor(procs, 1, stop_then_kill)
  assert f"Resumed from the checkpoint at step {complete[-1]} " in _outputs(procs)[0][0]

  # 3. Nothing half-written is taken for complete: the same command resumes from the newest
  # complete checkpoint and ends exactly as an uninterrupted run.
  complete = _complete_steps(workdir)[-1]
  out = _launch(experiment, workdir)
  assert f"Resumed from the checkpoint at step {complete} " in out, out[-3000:]
  assert_ends_as_an_uninterrupted_run(experiment, workdir, str(tmp_path / "reference"), STEPS)
