"""The step watchdog (`config.step_timeout_seconds`, bert_jax/runtime/actions.py `StepWatchdog`):
a run whose input stops, or whose step never finishes on the device, ends with status 124 and the
stacks of every thread on stderr and in the workdir, instead of hanging for good; compilation,
a slow first step and evaluations do not trip it.

Each run is a real job through `runtime.job.run` (the loop every job trains on) in its own
process (`python -m tests.test_watchdog MODE WORKDIR`): a small jitted step, a dataset and an
evaluation that sleep where each test asks."""
import os
import subprocess
import sys
import threading
import time

import pytest

from bert_jax.runtime import actions, loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOUND = 2.0       # seconds: config.step_timeout_seconds of the runs below
TIMEOUT = 180


def _run(mode, workdir):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  started = time.monotonic()
  result = subprocess.run([sys.executable, "-m", "tests.test_watchdog", mode, str(workdir)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
  return result, time.monotonic() - started


def _assert_stopped_with_stacks(result, workdir, where):
  """Status 124, the watchdog's line, and the stuck frame (`where`) among the stacks on stderr
  and in the workdir's file."""
  assert result.returncode == actions.WATCHDOG_EXIT_STATUS, (result.returncode,
                                                            result.stderr[-3000:])
  assert "Step watchdog:" in result.stderr
  assert "step_timeout_seconds=2" in result.stderr
  assert f'in {where}' in result.stderr, result.stderr[-3000:]
  with open(os.path.join(workdir, "watchdog_stacks.process_0.txt")) as f:
    dumped = f.read()
  assert f'in {where}' in dumped and "Thread 0x" in dumped
  assert "DONE" not in result.stdout


@pytest.mark.slow
def test_an_input_that_blocks_ends_the_run_with_stacks(tmp_path):
  result, seconds = _run("blocked_input", tmp_path / "work")
  _assert_stopped_with_stacks(result, tmp_path / "work", "_sleeping_batch")
  assert "no batch for step 4 in 2 s" in result.stderr
  # Steps 1-3 trained; the wait for batch 4 was cut short (it would sleep an hour).
  assert "batch 3 given" in result.stdout and "batch 4 given" not in result.stdout
  assert seconds < TIMEOUT


def test_a_step_that_never_finishes_ends_the_run_with_stacks(tmp_path):
  """The step's device computation stops (a host callback that sleeps, as a collective whose
  partner hangs): the host has dispatched it and waits."""
  result, _ = _run("stuck_step", tmp_path / "work")
  _assert_stopped_with_stacks(result, tmp_path / "work", "_stuck_callback")
  # On CPU the step runs inside its dispatch; on an accelerator it is in flight: either way, it
  # is the step that is late.
  assert "step 4 has not finished" in result.stderr


def test_compilation_a_slow_first_step_and_evaluations_do_not_trip_it(tmp_path):
  """The first step (compilation, then a 3 s sleep) and the evaluation at step 4 (3 s) are
  longer than the bound; the run finishes."""
  result, _ = _run("slow_but_fine", tmp_path / "work")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "DONE" in result.stdout and "Step watchdog" not in result.stderr
  assert not os.path.exists(tmp_path / "work" / "watchdog_stacks.process_0.txt")


class _DeviceArray:
  """Stands in for a step's output on an accelerator: in flight until the test says."""

  def __init__(self):
    self.done = False

  def is_ready(self):
    return self.done


def test_steps_in_flight_are_timed_one_by_one_as_they_finish():
  """The loop dispatches ahead of the device: a queue of steps is no hang as long as each
  finishes within the bound of the one before; the oldest one that does not is named."""
  watchdog = actions.StepWatchdog(1.0, "/nonexistent", process_index=0)   # no thread started
  t0 = time.monotonic()
  first, second, third = _DeviceArray(), _DeviceArray(), _DeviceArray()
  watchdog.before_step(0, {})
  watchdog.after_step(1, (None, {"loss": first}))
  assert watchdog.overdue(t0 + 100) is None
  first.done = True                           # the first step (compilation) finished: armed
  t1 = time.monotonic()
  assert watchdog.overdue(t1) is None
  for step, output in ((2, second), (3, third)):
    watchdog.before_step(step - 1, {})
    watchdog.after_step(step, (None, {"loss": output}))
  assert watchdog.overdue(t1 + 0.9) is None
  second.done = True
  t2 = t1 + 0.9   # step 2 finished (seen now); step 3 may take the bound from here
  assert watchdog.overdue(t2) is None
  assert watchdog.overdue(t2 + 0.9) is None
  late = watchdog.overdue(t2 + 1.2)
  assert late and late.startswith("step 3 has not finished 1 s after it could start"), late
  # An evaluation or a checkpoint (the loop waited for every step first) does not count.
  third.done = True
  watchdog.pause()
  assert watchdog.overdue(t2 + 100) is None
  watchdog.resume()
  t3 = time.monotonic()
  assert watchdog.overdue(t3 + 0.5) is None
  assert watchdog.overdue(t3 + 1.5).startswith("no batch for step 4")


def test_an_evaluation_or_a_save_is_watched_with_its_own_bound():
  """A pause (evaluation, checkpoint save) does not count against the step bound; past
  `pause_seconds` it is late itself, named by its own field."""
  watchdog = actions.StepWatchdog(1.0, "/nonexistent", process_index=0, pause_seconds=5.0)
  watchdog.pause()
  t0 = time.monotonic()
  assert watchdog.overdue(t0 + 4.0) is None
  late = watchdog.overdue(t0 + 6.0)
  assert late and late.startswith("an evaluation or a checkpoint save has not finished") and \
      "config.pause_timeout_seconds=5" in late, late
  watchdog.resume()
  assert watchdog.overdue(time.monotonic()) is None
  unwatched = actions.StepWatchdog(1.0, "/nonexistent", process_index=0)   # pause_seconds=0
  unwatched.pause()
  assert unwatched.overdue(time.monotonic() + 1e6) is None


def test_on_by_default_with_bounds_no_healthy_run_meets():
  from experiments import common_defaults
  settings = loop.LoopSettings(num_steps=1)
  assert (settings.step_timeout_seconds, settings.pause_timeout_seconds) == (3600.0, 21600.0)
  config = common_defaults.get_config()
  assert (config.step_timeout_seconds, config.pause_timeout_seconds) == (3600.0, 21600.0)


def test_off_when_both_bounds_are_0():
  watchdog = actions.StepWatchdog(0, "/nonexistent", pause_seconds=0)
  watchdog.start(0)
  assert not watchdog.enabled
  assert "step-watchdog" not in [t.name for t in threading.enumerate()]
  watchdog.end(0)


# --------------------------------------------------------------------- the job in a process

def _sleeping_batch(step, mode):
  """This run's dataset: batch `step` (0-based), or a wait of an hour where the mode says."""
  import numpy as np
  if mode == "blocked_input" and step == 3:
    time.sleep(3600)
  print(f"batch {step + 1} given", flush=True)
  return {"x": np.full(2, step % 3, np.float32), "stall": np.full(2, step + 1, np.int32)}


def _stuck_callback(step, mode):
  if (mode == "stuck_step" and int(step) == 4) or (mode == "slow_but_fine" and int(step) == 1):
    time.sleep(3600 if mode == "stuck_step" else 3.0)
  return step


def _job(mode, num_steps):
  import functools
  import jax
  import jax.numpy as jnp
  import optax
  from jax.experimental import io_callback
  from bert_jax.runtime.job import Batches, Job
  from bert_jax.runtime.state import TrainState
  tx = optax.sgd(0.1)
  callback = functools.partial(_stuck_callback, mode=mode)

  def train_step(state, batch, rng):
    # The callback runs inside the step's computation: a sleep there is a step that does not
    # finish (an effect, so the compiler keeps it).
    stall = io_callback(callback, jax.ShapeDtypeStruct((), jnp.int32), batch["stall"][0])
    loss_fn = lambda params: jnp.mean((params["w"] - batch["x"]) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return state.replace(step=state.step + 1, opt_state=opt_state,
                         params=optax.apply_updates(state.params, updates)), {
                             "loss": loss + 0.0 * stall.astype(jnp.float32)}

  def evaluate(state, step):
    if step == 4:
      time.sleep(3.0)   # longer than the bound, mid-run: evaluations do not count
    return {"w": float(state.params["w"])}

  import numpy as np
  return Job(name="watchdog", model=None,
             init_state=lambda: TrainState.create({"w": jnp.zeros(())}, tx), param_axes=None,
             train_step=train_step, eval_step=None,
             example_batch=lambda rows: {"x": np.ones(rows, np.float32),
                                         "stall": np.ones(rows, np.int32)},
             settings=loop.LoopSettings(num_steps, log_every_steps=3, step_timeout_seconds=BOUND),
             batches=lambda: Batches(functools.partial(_sleeping_batch, mode=mode)),
             dropout_rng=jax.random.PRNGKey(0),
             evaluator=(lambda trainer: evaluate) if mode == "slow_but_fine" else None,
             eval_at=lambda step: step == 4)


def _main(mode, workdir):
  from bert_jax import parallel
  from bert_jax.runtime import job as jobs
  jobs.run(_job(mode, 8), workdir, parallel.JitParallel())
  print("DONE", flush=True)


if __name__ == "__main__":
  if len(sys.argv) != 3:
    pytest.exit("usage: python -m tests.test_watchdog MODE WORKDIR")
  _main(sys.argv[1], sys.argv[2])
