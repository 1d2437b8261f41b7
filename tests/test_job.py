"""One job spec (runtime.job): what trains is what `--compile_for` compiles and the benchmarks
time. The pre-training job's step is the function the training loop compiles, and the compile
report lowers that same function."""
import functools

import jax
import numpy as np
import pytest

from bert_jax import parallel
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
