"""The loop's actions: the training clock (paused during evaluation and checkpoints, saved with
each checkpoint, continued on resume: `train_seconds` in metrics.jsonl) and the profiler
(`config.profile_steps`)."""
import os
import time

import pytest

from bert_jax.runtime import loop
from bert_jax.runtime.metric_writers import read_metrics
from bert_jax.tasks.jobs import pretraining
from bert_jax.tasks import registry
from tests import pretraining_fixtures as fx


def test_the_clock_pauses():
  clock = loop.TrainClock(5.0)
  clock.start()
  time.sleep(0.05)
  with clock.paused():
    paused_at = clock.read()
    time.sleep(0.2)
    assert clock.read() == paused_at
  assert 5.04 < clock.read() < 5.2
  clock.stop()
  assert clock.read() == clock.seconds


def test_bad_profile_steps_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match="profile_steps='5'.*START,COUNT"):
    loop.Profiler("5", str(tmp_path))


@pytest.mark.slow
def test_train_seconds_leave_out_evaluation_and_continue_on_resume(tmp_path, monkeypatch):
  config = fx.tiny_config(str(tmp_path / "data"), num_train_steps=8, eval_every_steps=4,
                          checkpoint_every_steps=4, log_every_steps=2,
                          async_checkpointing=False, profile_steps="2,2")
  slow = pretraining.evaluate

  def slow_evaluate(*args, **kwargs):
    time.sleep(1.5)   # evaluation time must not count as training time
    return slow(*args, **kwargs)

  monkeypatch.setattr(pretraining, "evaluate", slow_evaluate)
  workdir = str(tmp_path / "work")
  config.num_train_steps = 4          # stop after the first checkpoint, as a preemption would
  registry.run_job(config, workdir)
  first = read_metrics(workdir, "train")[-1]["train_seconds"]
  config.num_train_steps = 8
  started = time.time()
  registry.run_job(config, workdir)
  elapsed = time.time() - started
  train = read_metrics(workdir, "train")
  seconds = [r["train_seconds"] for r in train]
  assert seconds == sorted(seconds) and seconds[0] > 0
  # The resumed run continued the clock saved at step 4 (not from 0) ...
  assert train[-1]["train_seconds"] > first
  # ... and the two evaluations of this run (3 s of sleep) are not in it.
  assert train[-1]["train_seconds"] - first < elapsed - 2.5
  traces = [f for _, _, files in os.walk(os.path.join(workdir, "profile")) for f in files]
  assert any(f.endswith((".xplane.pb", ".trace.json.gz")) for f in traces), traces


# ------------------------------------------------------------------- a toy job through runtime.job


def _toy_job(num_steps: int, evaluate=None, **settings):
  """w -> the mean of x by SGD: a job whose step takes no time worth measuring."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from bert_jax.runtime.job import Batches, Job
  from bert_jax.runtime.state import TrainState
  tx = optax.sgd(0.1)

  def train_step(state, batch, rng):
    loss_fn = lambda params: jnp.mean((params["w"] - batch["x"]) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return state.replace(step=state.step + 1, opt_state=opt_state,
                         params=optax.apply_updates(state.params, updates)), {"loss": loss}

  return Job(name="toy", model=None,
             init_state=lambda: TrainState.create({"w": jnp.zeros(())}, tx), param_axes=None,
             train_step=train_step, eval_step=None,
             example_batch=lambda rows: {"x": np.ones(rows, np.float32)},
             settings=loop.LoopSettings(num_steps, **settings),
             batches=lambda: Batches(lambda step: {"x": np.full(2, step % 3, np.float32)}),
             dropout_rng=jax.random.PRNGKey(0),
             evaluator=(lambda trainer: evaluate) if evaluate else None,
             eval_at=lambda step: step % 2 == 0)


class _Recorder(loop.Action):
  """Which hooks ran, and whether the clock was running at each."""

  def __init__(self, clock):
    self.clock, self.events = clock, []

  def _note(self, name):
    self.events.append((name, self.clock._since is not None))   # pylint: disable=protected-access

  def pause(self):
    self._note("pause")

  def resume(self):
    self._note("resume")

  def logged(self, step, line):
    self._note(f"logged {step}")


def test_the_clock_is_paused_for_evaluations_and_checkpoints(tmp_path, monkeypatch):
  from bert_jax import parallel
  from bert_jax.runtime import job as jobs
  readings = []

  def evaluate(state, step):
    first = trainer[0].clock.read()
    time.sleep(0.3)
    readings.append((first, trainer[0].clock.read()))
    return {"w": float(state.params["w"])}

  trainer, recorders = [], []
  make_trainer = loop.Trainer

  def recording_trainer(*args, **kwargs):
    trainer.append(make_trainer(*args, **kwargs))
    recorders.append(_Recorder(trainer[-1].clock))
    trainer[-1].actions.append(recorders[-1])
    return trainer[-1]

  monkeypatch.setattr(jobs, "Trainer", recording_trainer)
  workdir = str(tmp_path / "toy")
  job = _toy_job(4, evaluate, log_every_steps=2, checkpoint_every_steps=0)
  started = time.perf_counter()
  outcome = jobs.run(job, workdir, parallel.JitParallel())
  elapsed = time.perf_counter() - started
  assert not outcome.preempted and outcome.last["eval_w"] == outcome.last["eval_w"]
  # Inside an evaluation the clock stands still; two evaluations (0.6 s) are not training.
  assert len(readings) == 2 and all(a == b for a, b in readings)
  train = read_metrics(workdir, "train")
  assert [r["step"] for r in train] == [2, 4]
  assert train[-1]["train_seconds"] < elapsed - 0.55
  # Every action is paused (the clock first: stopped) around both evaluations and the final
  # checkpoint, and resumed after.
  events = recorders[0].events
  assert events == [("logged 2", True), ("pause", False), ("resume", False),
                    ("logged 4", True), ("pause", False), ("resume", False),
                    ("pause", False), ("resume", False)]


def test_the_clock_is_saved_with_the_checkpoint_and_restored(tmp_path):
  from bert_jax import parallel
  from bert_jax.io import training_checkpoints
  from bert_jax.runtime import job as jobs
  workdir = str(tmp_path / "toy")
  first = jobs.run(_toy_job(4, log_every_steps=1), workdir, parallel.JitParallel())
  saved = read_metrics(workdir, "train")[-1]["train_seconds"]
  checkpointer = training_checkpoints.TrainingCheckpointer(workdir, async_save=False)
  abstract = parallel.JitParallel().abstract_state(first.state)
  step, _ = checkpointer.restore_latest(abstract)
  checkpointer.close()
  # The checkpoint at the last step holds the clock as it stood there (paused to save).
  assert step == 4 and saved <= checkpointer.restored_clock < saved + 0.5
  resumed = jobs.run(_toy_job(8, log_every_steps=1), workdir, parallel.JitParallel())
  assert resumed.trainer.start_step == 4
  train = read_metrics(workdir, "train")
  assert [r["step"] for r in train] == list(range(1, 9))
  # The resumed run's clock goes on from the saved one, not from zero.
  assert checkpointer.restored_clock < train[4]["train_seconds"] < train[-1]["train_seconds"]


def test_the_profiler_writes_a_trace_of_the_asked_steps(tmp_path, capsys):
  from bert_jax import parallel
  from bert_jax.runtime import job as jobs
  workdir = str(tmp_path / "toy")
  jobs.run(_toy_job(6, log_every_steps=3, profile_steps="2,3"), workdir,
           parallel.JitParallel())
  traces = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(workdir, "profile"))
            for f in files if f.endswith((".xplane.pb", ".trace.json.gz"))]
  assert traces, os.listdir(workdir)
  assert "Profile of steps 3-5 written to" in capsys.readouterr().out
  # No profile without profile_steps.
  jobs.run(_toy_job(2, log_every_steps=1), str(tmp_path / "plain"), parallel.JitParallel())
  assert not os.path.exists(tmp_path / "plain" / "profile")


def test_a_trace_still_open_when_the_run_ends_is_written(tmp_path, capsys):
  from bert_jax import parallel
  from bert_jax.runtime import job as jobs
  workdir = str(tmp_path / "toy")
  jobs.run(_toy_job(3, log_every_steps=3, profile_steps="1,10"), workdir,
           parallel.JitParallel())
  assert "Profile of steps 2-3 written to" in capsys.readouterr().out
  assert os.listdir(os.path.join(workdir, "profile"))
