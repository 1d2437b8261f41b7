"""Run in a subprocess with 8 simulated CPU devices: single device vs jit-mesh vs pmap.

Prints one JSON line {"strategy": [train losses..., eval loss], ..., "max_param_diff": {...}}.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import functools  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax.runtime import optim
from bert_jax import parallel
from bert_jax.tasks.jobs import pretraining  # noqa: E402
from tests.test_train_step import synthetic_batch, tiny_config  # noqa: E402

STEPS = 3


def run(strategy):
  config = tiny_config(parallelism=strategy if strategy != "single" else "jit")
  model = pretraining.build_model(config)
  tx, schedule = optim.create_optimizer(config, config.num_train_steps)
  init = lambda: pretraining.create_train_state(config, model, tx, jax.random.PRNGKey(0))
  step_fn = functools.partial(pretraining.train_step, model=model, tx=tx,
                              objective=config.objective, schedule=schedule)
  eval_fn = functools.partial(pretraining.eval_step, model=model, objective=config.objective)
  eval_batch = dict(synthetic_batch(STEPS, batch=16),
                    example_weight=(np.arange(16) < 11).astype(np.float32))  # 5 padding rows
  losses = []
  if strategy == "single":
    state = jax.jit(init)()
    step = jax.jit(step_fn)
    for i in range(STEPS):
      state, metrics = step(state, synthetic_batch(i, batch=16), jax.random.PRNGKey(1))
      losses.append(float(metrics["loss"]))
    eval_loss = pretraining.loss_from_terms(jax.jit(eval_fn)(state.params, eval_batch))[0]
    return losses + [float(eval_loss)], jax.device_get(state.params)
  par = parallel.create(config)
  state = par.init_state(init)
  step = par.compile_step(step_fn)
  for i in range(STEPS):
    state, metrics = step(state, par.put_batch(synthetic_batch(i, batch=16)),
                          jax.random.PRNGKey(1))
    losses.append(float(par.metrics(metrics)["loss"]))
  # Evaluation sums over every device's rows (the last "loss" of the report).
  eval_loss = pretraining.loss_from_terms(
      par.compile_eval(eval_fn)(state.params, par.put_batch(eval_batch)))[0]
  return losses + [float(eval_loss)], jax.device_get(par.checkpointable(state).params)


def main():
  assert jax.device_count() == 8, jax.devices()
  results = {name: run(name) for name in ("single", "jit", "pmap")}
  report = {name: losses for name, (losses, _) in results.items()}
  base = results["single"][1]
  report["max_param_diff"] = {
      name: max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(
          jax.tree_util.tree_leaves(base), jax.tree_util.tree_leaves(results[name][1])))
      for name in ("jit", "pmap")}
  print(json.dumps(report))


if __name__ == "__main__":
  main()
