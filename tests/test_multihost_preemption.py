"""SIGTERM to one of 2 processes (a TPU maintenance event hits one host).

jax's preemption service (started by `jax.distributed.initialize`) catches the signal on that
host and all hosts agree on one step to save at (`bert_jax.runtime.preemption.Preemption`). Both
processes must save the same complete checkpoint and exit with 0, and 2 new processes must
resume from it and finish exactly as an uninterrupted 2-process run.
"""
import os
import signal
import time

from bert_jax.runtime.metric_writers import read_metrics
from tests import pretraining_fixtures as fx
from tests.test_multihost import (_launch, _outputs, _start, _wait,
                                  assert_ends_as_an_uninterrupted_run)
import pytest

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow

STEPS = 120
SIGNAL_AFTER = 30  # steps, past the first checkpoint
# Long enough a run that the signal lands mid-run (steps take 10-100 ms); async checkpoints
# every 20 steps, as in real runs, so a regular save can be in flight at the preemption.
OVERRIDES = {"num_train_steps": STEPS, "checkpoint_every_steps": 20, "eval_every_steps": 0,
             "log_every_steps": 1, "keep_checkpoints": 10, "async_checkpointing": True}
TIMEOUT = 120
SIGNALLED = 1  # not the coordinator (process 0 was also checked by hand: same result)


def _wait_for_step(workdir, procs, step):
  deadline = time.time() + TIMEOUT
  while not any(r["step"] >= step for r in read_metrics(workdir)):
    assert time.time() < deadline, f"no step {step} within {TIMEOUT} s"
    assert all(p.poll() is None for p in procs), "a process ended before the signal"
    time.sleep(0.02)


def test_sigterm_to_one_process_saves_one_step_on_both_and_resumes_exactly(tmp_path):
  experiment = fx.write_experiment(str(tmp_path), str(tmp_path / "data"), **OVERRIDES)
  fx.make_data(str(tmp_path / "data"))
  workdir = str(tmp_path / "work")
  procs = _start(experiment, workdir)
  try:
    _wait_for_step(workdir, procs, SIGNAL_AFTER)
    procs[SIGNALLED].send_signal(signal.SIGTERM)
    _wait(procs, TIMEOUT)
    outputs = _outputs(procs)
    for i, proc in enumerate(procs):
      assert proc.returncode == 0, f"process {i} failed:\n{outputs[i][1][-4000:]}"
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()

  # Both processes stopped at one agreed step and saved it.
  saved = []
  for out, _ in outputs:
    lines = [l for l in out.splitlines() if l.startswith("Preempted: checkpoint at step")]
    assert len(lines) == 1, out[-3000:]
    saved.append(int(lines[0].split()[4]))
  assert saved[0] == saved[1], saved
  step = saved[0]
  assert SIGNAL_AFTER < step < STEPS
  saves = os.path.join(workdir, "checkpoints")
  assert max(int(s) for s in os.listdir(saves) if s.isdigit()) == step
  assert not [s for s in os.listdir(saves) if not s.isdigit()], "unfinished save"
  assert {"process_0", "process_1"} <= set(os.listdir(os.path.join(saves, str(step), "data")))
  assert max(r["step"] for r in read_metrics(workdir)) == step

  # 2 new processes resume from that checkpoint and end exactly as an uninterrupted run.
  out = _launch(experiment, workdir)
  assert f"Resumed from the checkpoint at step {step}" in out
  assert_ends_as_an_uninterrupted_run(experiment, workdir, str(tmp_path / "reference"), STEPS)
