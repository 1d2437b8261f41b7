"""One job spec (runtime.job): what trains is what `--compile_for` compiles and the benchmarks
time. The pre-training job's step is the function the training loop compiles, and the compile
report lowers that same function."""
import functools

from bert_jax.tasks import compile_report, pretraining
from tests.test_train_step import tiny_config


def test_the_compile_report_compiles_the_jobs_own_step(monkeypatch):
  config = tiny_config()
  job = pretraining.make_job(config)
  assert isinstance(job.train_step, functools.partial)
  assert job.train_step.func is pretraining.train_step
  built = []
  make_job = pretraining.make_job

  def recording(config):
    built.append(make_job(config))
    return built[-1]

  monkeypatch.setattr(pretraining, "make_job", recording)
  # pylint: disable-next=protected-access
  steps = compile_report._pretraining_steps(config, global_batch=8)
  assert built and steps.train_step is built[-1].train_step
  assert steps.eval_step is built[-1].eval_step
  assert steps.train_batch["input_ids"].shape == (8, config.max_seq_length)
  assert steps.model_flops == pretraining.model_flops(config, 8) > 0
  # The loop's training state comes from the same job (same initial parameters).
  import jax
  import numpy as np
  a, b = jax.jit(job.init_state)(), jax.jit(built[-1].init_state)()
  assert all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a.params),
                                                  jax.tree_util.tree_leaves(b.params)))
