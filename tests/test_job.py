"""One job spec (runtime.job): what trains is what `--compile_for` compiles and the benchmarks
time. The pre-training job's step is the function the training loop compiles, and the compile
report lowers that same function."""
import functools

import jax
import numpy as np
import pytest

from bert_jax import parallel
from bert_jax.runtime import job as jobs
from bert_jax.runtime import loop
from bert_jax.tasks.jobs import pretraining
from bert_jax.tasks.tools import compile_report
from tests.test_train_step import tiny_config


def _recording_make_job(monkeypatch):
  built = []
  make_job = pretraining.make_job

  def recording(config):
    built.append(make_job(config))
    return built[-1]

  monkeypatch.setattr(pretraining, "make_job", recording)
  return built


def test_the_compile_report_builds_the_jobs_own_step(monkeypatch):
  config = tiny_config()
  job = pretraining.make_job(config)
  assert isinstance(job.train_step, functools.partial)
  assert job.train_step.func is pretraining.train_step
  built = _recording_make_job(monkeypatch)
  compiled = compile_report.build_job(config)
  assert built and compiled is built[-1]
  assert compiled.example_batch(8)["input_ids"].shape == (8, config.max_seq_length)
  assert compiled.model_flops(8) == pretraining.model_flops(config, 8) > 0
  # Nothing of the data is read to build a job (a compile needs none).
  assert compiled.batches is not None and compiled.evaluator is None
  # The loop's training state comes from the same job (same initial parameters).
  a, b = jax.jit(job.init_state)(), jax.jit(compiled.init_state)()
  assert all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a.params),
                                                  jax.tree_util.tree_leaves(b.params)))


def test_compile_for_lowers_the_function_that_trains(monkeypatch, tmp_path):
  """The function `--compile_for` hands the strategy to compile is the job's `train_step`, the
  same object the training loop (`runtime.job.run`) compiles."""
  pytest.importorskip("libtpu", reason="the TPU compiler comes with pip install 'jax[tpu]'")
  config = tiny_config(global_batch_size=8)
  config.eval_batch_size = 8
  built = _recording_make_job(monkeypatch)
  compiled_steps = []
  compile_step = parallel.JitParallel.compile_step

  def recording(self, step_fn, donate=True):
    compiled_steps.append(step_fn)
    return compile_step(self, step_fn, donate)

  monkeypatch.setattr(parallel.JitParallel, "compile_step", recording)
  report = compile_report.run(config, str(tmp_path), "v5litepod-4")
  assert report["fits"] and len(built) == 1
  assert compiled_steps == [built[0].train_step]


class _Recorder(loop.Action):
  """Every call the loop makes on it, in order; adds a field to the training lines."""

  def __init__(self):
    self.calls = []

  def start(self, step):
    self.calls.append(("start", step))

  def before_step(self, step, batch):
    self.calls.append(("before_step", step))

  def after_step(self, step, outputs):
    self.calls.append(("after_step", step))

  def log(self, step, state):
    self.calls.append(("log", step))
    return {"recorded_step": float(step)}

  def logged(self, step, line):
    self.calls.append(("logged", step, line["recorded_step"]))

  def pause(self):
    self.calls.append(("pause",))

  def resume(self):
    self.calls.append(("resume",))

  def end(self, step):
    self.calls.append(("end", step))


def _two_step_job() -> jobs.Job:
  """A job of one dense layer, its batch a pure function of the step: two steps, no evaluation,
  the training line and the checkpoint at the last step."""
  import flax.linen as nn
  import jax.numpy as jnp
  import optax
  from bert_jax.runtime.state import TrainState
  model, tx = nn.Dense(1), optax.sgd(0.1)
  batch = {"x": np.ones((2, 3), np.float32)}

  def train_step(state, batch, rng):
    del rng
    loss = lambda params: jnp.mean(model.apply({"params": params}, batch["x"]) ** 2)
    value, grads = jax.value_and_grad(loss)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                         opt_state=opt_state), {"loss": value}

  return jobs.Job(
      name="two steps", model=model,
      init_state=lambda: TrainState.create(
          model.init(jax.random.PRNGKey(0), batch["x"])["params"], tx),
      param_axes=None, train_step=train_step, eval_step=None, example_batch=lambda rows: batch,
      settings=loop.LoopSettings(num_steps=2, log_every_steps=100),
      batches=lambda: jobs.Batches(lambda step: batch), dropout_rng=jax.random.PRNGKey(1))


def test_the_loop_runs_the_actions_a_run_is_given(tmp_path):
  """`run(..., actions=)` hang on the loop of `runtime.job.run`: called at every point, after
  the loop's own, their fields in metrics.jsonl."""
  from bert_jax.runtime.metric_writers import read_metrics
  recorder = _Recorder()
  outcome = jobs.run(_two_step_job(), str(tmp_path), parallel.create(tiny_config()),
                     actions=(recorder,))
  assert not outcome.preempted and outcome.trainer.actions[-1] is recorder
  assert recorder.calls == [("start", 0), ("before_step", 0), ("after_step", 1),
                            ("before_step", 1), ("after_step", 2), ("log", 2),
                            ("logged", 2, 2.0), ("pause",), ("resume",), ("end", 2)]
  assert read_metrics(str(tmp_path), "train")[-1]["recorded_step"] == 2.0
