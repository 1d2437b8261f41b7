"""Run in a subprocess with 8 simulated CPU devices: the embedding job's loss and gradients on
one device with the whole batch vs the jit mesh and pmap over 8 devices (each with 2 of the 16
pairs, the negatives gathered from all of them), plain and by gradient caching; and one real
train step of the job on each (on the mesh also by gradient caching).

Prints one JSON line {"runs": {name: {"loss": relative difference, "gradients": largest
difference relative to the largest gradient}}, "all_gather_shapes": [...]}.
"""
import json
import os
import re
import sys
import tempfile

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax import parallel  # noqa: E402
from bert_jax.parallel import sharding  # noqa: E402
from bert_jax.runtime import job as jobs  # noqa: E402
from bert_jax.runtime import step as step_core  # noqa: E402
from bert_jax.tasks.jobs import embeddings  # noqa: E402
from tests import embedding_fixtures as efx  # noqa: E402

PAIRS = 16
RNG = jax.random.PRNGKey(3)


def _loss_and_gradients(objective, chunk: int, axis_name=None):
  def run(params, batch):
    totals = objective.totals(batch)
    if axis_name:
      totals = jax.lax.psum(totals, axis_name)
    grads, terms = step_core.gradients(params, batch, RNG, objective, totals,
                                       grad_cache_rows=chunk)
    if axis_name:
      grads, terms = jax.lax.psum((grads, terms), axis_name)
    return objective.loss(terms, totals), grads
  return run


def _difference(result, reference):
  (loss, grads), (ref_loss, ref_grads) = result, reference
  scale = max(float(np.max(np.abs(g))) for g in jax.tree_util.tree_leaves(ref_grads))
  pairs = zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads))
  worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in pairs)
  return {"loss": abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
          "gradients": worst / scale}


def main():
  assert jax.device_count() == 8, jax.devices()
  root = tempfile.mkdtemp()
  config = efx.quick_config(root, global_batch_size=PAIRS, **{"data.num_negatives": 2,
                                                               "embedding.symmetric": True})
  inputs = embeddings.read_inputs(config, root)
  batch = {k: v[:PAIRS] for k, v in inputs.arrays.items()}
  job = embeddings.make_job(config, inputs)
  params = jax.device_get(jax.jit(job.init_state)().params)
  objective = lambda axis_name=None: embeddings.embedding_objective(
      job.model, config.embedding.scale, config.embedding.symmetric, axis_name)

  # One device, the whole batch: the reference.
  reference = jax.jit(_loss_and_gradients(objective(), 0))(params, batch)
  runs, gathers = {}, []
  # The jit mesh: one logical batch split along `data`; the compiler gathers the documents.
  par = parallel.JitParallel(config)
  assert par.mesh.shape["data"] == 8
  for chunk in (0, 1):
    compiled = parallel.strategies.UnderMesh(jax.jit(
        _loss_and_gradients(objective(), chunk),
        in_shardings=(sharding.replicated(par.mesh), sharding.batch_sharding(par.mesh)),
        out_shardings=sharding.replicated(par.mesh)), par.mesh)
    runs[f"jit, grad_cache_chunk={chunk}"] = _difference(
        compiled(params, par.put_batch(batch)), reference)
    if chunk == 0:
      text = compiled.lower(params, par.put_batch(batch)).compile().as_text()
      gathers = sorted(set(re.findall(r"= (\w+\[[\d,]*\])[^ ]* all-gather", text)))
  # pmap: each device its own rows, the negatives gathered with jax.lax.all_gather.
  pmap = parallel.PmapParallel()
  for chunk in (0, 1):
    compiled = jax.pmap(_loss_and_gradients(objective(parallel.PMAP_AXIS), chunk,
                                            parallel.PMAP_AXIS),
                        axis_name=parallel.PMAP_AXIS, in_axes=(None, 0))
    loss, grads = compiled(params, pmap.put_batch(batch))
    runs[f"pmap, grad_cache_chunk={chunk}"] = _difference(
        (loss[0], jax.tree_util.tree_map(lambda g: g[0], grads)), reference)
  # One real step of the job (the strategy's compiled step, the optimizer, the metrics); on the
  # mesh also by gradient caching (its chunk loops drawing from the step's own key).
  single = parallel.JitParallel(config, devices=jax.devices()[:1])
  cached_config = config.copy_and_resolve_references()
  cached_config.grad_cache_chunk = 1
  cached = embeddings.make_job(cached_config, inputs)
  steps = {}
  for name, strategy, the_job in (("single", single, job), ("jit", par, job),
                                  ("pmap", pmap, job), ("jit, grad_cache_chunk=1", par, cached)):
    state, step = jobs.state_and_step(the_job, strategy)
    _, metrics = step(state, strategy.put_batch(batch), RNG)
    steps[name] = strategy.metrics(metrics)
  for name in ("jit", "pmap", "jit, grad_cache_chunk=1"):
    ours, theirs = steps[name], steps["single"]
    runs[f"{name} train step"] = {
        "loss": float(abs(ours["loss"] - theirs["loss"]) / theirs["loss"]),
        "gradients": float(abs(ours["grad_norm"] - theirs["grad_norm"]) / theirs["grad_norm"])}
  print(json.dumps({"runs": runs, "all_gather_shapes": gathers}, indent=None))


if __name__ == "__main__":
  main()
