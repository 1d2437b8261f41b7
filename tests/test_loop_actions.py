"""The loop's actions: the training clock (paused during evaluation and checkpoints, saved with
each checkpoint, continued on resume: `train_seconds` in metrics.jsonl) and the profiler
(`config.profile_steps`)."""
import os
import time

import pytest

from bert_jax.runtime import loop
from bert_jax.runtime.metric_writers import read_metrics
from bert_jax.tasks import pretraining
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
  pretraining.train_and_evaluate(config, workdir)
  first = read_metrics(workdir, "train")[-1]["train_seconds"]
  config.num_train_steps = 8
  started = time.time()
  pretraining.train_and_evaluate(config, workdir)
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
