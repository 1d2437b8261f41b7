"""The train step compiles once: later steps reuse the program (no silent recompilation)."""
import functools

import jax
import pytest

from bert_jax.runtime import optim
from bert_jax import parallel
from bert_jax.tasks.jobs import pretraining
from tests.test_train_step import synthetic_batch, tiny_config


@pytest.mark.parametrize("strategy", ["jit", "pmap"])
def test_no_recompilation_after_the_first_step(strategy):
  config = tiny_config(parallelism=strategy, grad_accum_steps=2)
  config.optimizer.name = "lamb"
  model = pretraining.build_model(config)
  tx, schedule = optim.create_optimizer(config, config.num_train_steps)
  par = parallel.create(config)
  state = par.init_state(
      lambda: pretraining.create_train_state(config, model, tx, jax.random.PRNGKey(0)))
  step = par.compile_step(functools.partial(
      pretraining.train_step, model=model, tx=tx, objective=config.objective,
      schedule=schedule, grad_accum_steps=config.grad_accum_steps))
  state, metrics = step(state, par.put_batch(synthetic_batch(0)), jax.random.PRNGKey(1))
  jax.block_until_ready(metrics)
  # After the first step nothing may compile again, whatever jax names the program.
  import logging
  compiles = []
  handler = logging.Handler()
  handler.emit = lambda record: compiles.append(record.getMessage())
  logger = logging.getLogger("jax")
  logger.addHandler(handler)
  try:
    with jax.log_compiles(True):
      for i in range(1, 4):
        state, metrics = step(state, par.put_batch(synthetic_batch(i)), jax.random.PRNGKey(1))
      jax.block_until_ready(metrics)
  finally:
    logger.removeHandler(handler)
  assert not [m[:80] for m in compiles if m.startswith("Compiling")]
