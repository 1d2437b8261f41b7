"""Run in a subprocess with 4 simulated CPU devices: a batch warm-up step of k micro-batches
against one step on the whole batch, under the jit mesh and under pmap.

Prints one JSON line {"jit": max |param difference|, "pmap": ...}.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import functools  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax import parallel  # noqa: E402
from bert_jax.runtime import optim  # noqa: E402
from bert_jax.tasks.jobs import pretraining  # noqa: E402
from tests.test_train_step import synthetic_batch, tiny_config  # noqa: E402


def params_after(strategy: str, start_rows: int):
  config = tiny_config(parallelism=strategy, warmup_steps=0)   # step 0 moves the parameters
  model = pretraining.build_model(config)
  tx, schedule = optim.create_optimizer(config, config.num_train_steps)
  par = parallel.create(config)
  state = par.init_state(lambda: pretraining.create_train_state(config, model, tx,
                                                                jax.random.PRNGKey(0)))
  step = par.compile_step(functools.partial(
      pretraining.train_step, model=model, tx=tx, objective=config.objective,
      schedule=schedule, warmup_start_rows=start_rows))
  state, metrics = step(state, par.put_batch(synthetic_batch(batch=16)), jax.random.PRNGKey(1))
  if start_rows:
    assert float(par.metrics(metrics)["batch_size"]) == 16.0
  return jax.device_get(par.checkpointable(state).params)


def main():
  out = {}
  for strategy in ("jit", "pmap"):
    whole = params_after(strategy, 0)
    ramped = params_after(strategy, 4)   # k = 4 micro-batches of 4 rows, 1 per device
    out[strategy] = max(float(np.max(np.abs(a - b))) for a, b in zip(
        jax.tree_util.tree_leaves(whole), jax.tree_util.tree_leaves(ramped)))
  print(json.dumps(out))


if __name__ == "__main__":
  main()
