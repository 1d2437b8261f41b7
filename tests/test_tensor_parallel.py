"""Tensor parallelism: a (data, model) mesh with parameters sharded by their logical axis names.

On 8 simulated CPU devices (a subprocess: the device count is fixed when jax starts), a mesh of
4 data x 2 model must train exactly like 1 device with the same global batch, really split the
attention, FFN and vocabulary arrays (and their Adam moments) along `model`, write a checkpoint
that restores on 8 x 1 (data only), and run the pre-training loop end to end; the fine-tuning
loop (GLUE MRPC) on 4 x 2 must give the same losses, metrics and predictions as on 8 x 1.
Run as a script (`python tests/test_tensor_parallel.py OUT_DIR`) it is that subprocess.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3
QUERY = "bert/encoder/layer_0/attention/self/query/kernel"


# ------------------------------------------------------------- in this process (1 device)


def _logical_axes(scan_layers):
  import jax
  import jax.numpy as jnp
  from bert_jax.tasks.jobs import pretraining
  from bert_jax.parallel import sharding
  from tests.test_train_step import tiny_config
  config = tiny_config()
  config.model.scan_layers = scan_layers
  model = pretraining.build_model(config)
  return sharding.logical_axes(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_every_parameter_maps_to_distinct_mesh_axes(scan_layers):
  import flax.linen as nn
  from flax import traverse_util
  from bert_jax.parallel import sharding
  axes = traverse_util.flatten_dict(_logical_axes(scan_layers), sep="/")
  layer = "bert/encoder/layer/layer" if scan_layers else "bert/encoder/layer_0"
  stacked = ("layers",) if scan_layers else ()
  # Megatron: q/k/v and the FFN input column-parallel, their output projections row-parallel.
  assert tuple(axes[f"{layer}/attention/self/query/kernel"]) == stacked + ("embed", "joined_kv")
  assert tuple(axes[f"{layer}/attention/output/dense/kernel"]) == stacked + ("joined_kv", "embed")
  assert tuple(axes[f"{layer}/intermediate/dense/kernel"]) == stacked + ("embed", "mlp")
  assert tuple(axes[f"{layer}/output/dense/kernel"]) == stacked + ("mlp", "embed")
  # A square H->H kernel must not name one logical axis twice (flax rejects it).
  for rules in (sharding.DEFAULT_RULES, (("embed", "model"),)):
    for path, names in axes.items():
      assert len(set(n for n in names if n)) == len([n for n in names if n]), path
      mesh_axes = [a for a in nn.logical_to_mesh_axes(tuple(names), rules) if a]
      assert len(set(mesh_axes)) == len(mesh_axes), (path, mesh_axes)


def test_bad_model_parallelism_is_a_clear_error():
  import jax
  from bert_jax import parallel
  from tests.test_train_step import tiny_config
  devices = jax.device_count()
  with pytest.raises(ValueError, match="config.model_parallelism=.* does not divide"):
    parallel.create(tiny_config(model_parallelism=devices + 1))
  with pytest.raises(ValueError, match="config.model_parallelism"):
    parallel.create(tiny_config(model_parallelism=0))
  with pytest.raises(ValueError, match="pmap.*data-parallel only"):
    parallel.create(tiny_config(parallelism="pmap", model_parallelism=2))


# ------------------------------------------------------------- 8 simulated devices


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  out = tmp_path_factory.mktemp("tp")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", PYTHONPATH=ROOT)
  run = subprocess.run([sys.executable, os.path.abspath(__file__), str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.strip().splitlines()[-1])


def test_4x2_mesh_trains_like_one_device(report):
  np.testing.assert_allclose(report["losses"]["4x2"], report["losses"]["single"], rtol=1e-5)
  assert report["max_param_diff"] < 1e-5
  assert report["mesh"] == {"data": 4, "model": 2}


def test_parameters_and_adam_moments_are_sharded_along_model(report):
  specs, shards = report["specs"], report["shard_shapes"]
  # The query kernel [H=32, H=32], and its Adam mu and nu: column-parallel, half per device.
  assert len(specs[QUERY]) == 3, specs[QUERY]
  for spec in specs[QUERY]:
    assert spec == [None, "model"]
  assert shards[QUERY] == [32, 16]
  assert specs["bert/encoder/layer_0/attention/output/dense/kernel"][0] == ["model", None]
  assert specs["bert/encoder/layer_0/intermediate/dense/kernel"][0] == [None, "model"]
  assert specs["bert/embeddings/word_embeddings/embedding"][0] == ["model", None]  # V=98
  assert specs["bert/pooler/dense/kernel"][0] == [None, None]
  assert specs["step"] == [[]]  # scalars (and optimizer counts) replicated


def test_a_4x2_checkpoint_restores_on_8x1(report):
  assert report["restored_mesh"] == {"data": 8}
  assert report["restored_equal"] is True


def test_pretraining_loop_with_model_parallelism(report):
  e2e = report["e2e"]
  assert e2e["query_spec"] == [None, "model"]
  # V=45 is odd: the vocabulary stays replicated rather than padded.
  assert e2e["vocab_spec"] == [None, None]
  np.testing.assert_allclose(e2e["losses"]["4x2"], e2e["losses"]["8x1"], rtol=1e-5)
  assert len(e2e["losses"]["4x2"]) == 4 and np.all(np.isfinite(e2e["losses"]["4x2"]))


def test_fine_tuning_with_model_parallelism(report):
  ft = report["finetune"]
  assert ft["query_spec"] == [None, "model"]
  assert ft["mesh"] == {"data": 4, "model": 2}
  np.testing.assert_allclose(ft["losses"]["4x2"], ft["losses"]["8x1"], rtol=1e-5)
  assert len(ft["losses"]["4x2"]) == len(ft["losses"]["8x1"]) >= 2
  assert ft["dev"]["4x2"].keys() == ft["dev"]["8x1"].keys()
  for name, value in ft["dev"]["8x1"].items():
    assert abs(ft["dev"]["4x2"][name] - value) < 1e-5, name
  # The best checkpoint was gathered from the shards and written whole.
  assert ft["best_query_shape"] == [32, 32]
  assert ft["predictions"]["4x2"] == ft["predictions"]["8x1"]


# ------------------------------------------------------------- the subprocess


def _path(key_path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
                  for k in key_path)


def _setup(config, par=None):
  """(initial state, compiled step, batch placement) on one device (`par` None) or `par`'s mesh."""
  import functools
  import jax
  import jax.numpy as jnp
  from bert_jax.runtime import optim
  from bert_jax.tasks.jobs import pretraining
  from bert_jax.parallel import sharding
  model = pretraining.build_model(config)
  tx, schedule = optim.create_optimizer(config, config.num_train_steps)
  init = lambda: pretraining.create_train_state(config, model, tx, jax.random.PRNGKey(0))
  step_fn = functools.partial(pretraining.train_step, model=model, tx=tx,
                              objective=config.objective, schedule=schedule)
  if par is None:
    return jax.jit(init)(), jax.jit(step_fn), lambda batch: batch
  axes = sharding.logical_axes(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
  return par.init_state(init, axes), par.compile_step(step_fn), par.put_batch


def _train(config, par=None):
  """STEPS steps on the same global batches; (final state, losses)."""
  import jax
  from tests.test_train_step import synthetic_batch
  state, step, put = _setup(config, par)
  losses = []
  for i in range(STEPS):
    state, metrics = step(state, put(synthetic_batch(i, batch=16)), jax.random.PRNGKey(1))
    losses.append(float(metrics["loss"]))
  return state, losses


def _spec(named_sharding, ndim):
  """The mesh axis of every dimension (PartitionSpec leaves trailing replicated ones out)."""
  spec = list(named_sharding.spec)
  return spec + [None] * (ndim - len(spec))


def _layout(state):
  """Mesh specs of every state leaf, keyed by parameter path (param, mu, nu share a key)."""
  import jax
  specs, shard_shapes = {}, {}
  for key_path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    path = _path(key_path)
    key = next((path.split(f"{p}/", 1)[1] for p in ("params", "mu", "nu")
                if f"{p}/" in path), path)
    specs.setdefault(key, []).append(_spec(leaf.sharding, leaf.ndim))
    shard_shapes[key] = list(leaf.addressable_shards[0].data.shape)
  return specs, shard_shapes


def _e2e(out_dir):
  """The real loop with model_parallelism=2 and =1; the sharding the loop used, its losses."""
  from bert_jax import parallel
  from bert_jax.tasks import registry
  from bert_jax.runtime.metric_writers import read_metrics
  from tests import pretraining_fixtures as fx
  used, create = [], parallel.create

  def recording_create(config):  # keeps the loop's `par`, to read the shardings it used
    used.append(create(config))
    return used[-1]

  parallel.create = recording_create
  losses = {}
  try:
    for name, model_parallelism in (("4x2", 2), ("8x1", 1)):
      config = fx.tiny_config(os.path.join(out_dir, "data"), num_train_steps=4,
                              eval_every_steps=0, checkpoint_every_steps=4,
                              async_checkpointing=False, model_parallelism=model_parallelism)
      workdir = os.path.join(out_dir, f"e2e_{name}")
      registry.run_job(config, workdir)
      losses[name] = [r["loss"] for r in read_metrics(workdir, "train")]
  finally:
    parallel.create = create
  params = used[0].state_sharding.params
  query = params["bert"]["encoder"]["layer_0"]["attention"]["self"]["query"]["kernel"]
  vocab = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  return {"losses": losses, "query_spec": _spec(query, 2), "vocab_spec": _spec(vocab, 2)}


def _finetune(out_dir):
  """GLUE MRPC fine-tuning on 4 x 2 and 8 x 1: losses, dev metrics, predictions, layout."""
  from bert_jax.io import checkpoints
  from bert_jax import parallel
  from bert_jax import tasks
  from bert_jax.runtime.metric_writers import read_metrics
  from experiments import glue as glue_experiment
  from tests import finetuning_fixtures as fx
  glue_dir = fx.write_glue_dir(os.path.join(out_dir, "glue"), dict(train=32, dev=10, test=5))
  ckpt = fx.write_checkpoint(os.path.join(out_dir, "ckpt_ft"))
  used, create = [], parallel.create

  def recording_create(config):
    used.append(create(config))
    return used[-1]

  parallel.create = recording_create
  report = {"losses": {}, "dev": {}, "predictions": {}}
  try:
    for name, model_parallelism in (("4x2", 2), ("8x1", 1)):
      config = glue_experiment.get_config("task=mrpc,quick")
      config.init_checkpoint, config.data.glue_dir = ckpt, glue_dir
      config.max_seq_length, config.eval_batch_size, config.global_batch_size = 16, 4, 8
      config.model_parallelism = model_parallelism
      workdir = os.path.join(out_dir, f"ft_{name}")
      results = tasks.run(config, workdir)
      report["losses"][name] = [r["loss"] for r in read_metrics(workdir, "train")]
      report["dev"][name] = results["dev"]
      with open(os.path.join(workdir, "dev_predictions.tsv"), encoding="utf-8") as f:
        report["predictions"][name] = f.read()
      if name == "4x2":
        _, best = checkpoints.load_pretrained(os.path.join(workdir, "best"))
        query = best["bert"]["encoder"]["layer_0"]["attention"]["self"]["query"]["kernel"]
        report["best_query_shape"] = list(np.shape(query))
  finally:
    parallel.create = create
  sharded = used[0].state_sharding.params["bert"]["encoder"]["layer_0"]["attention"]["self"]
  report["query_spec"] = _spec(sharded["query"]["kernel"], 2)
  report["mesh"] = dict(used[0].mesh.shape)
  return report


def main(out_dir):
  import jax
  from bert_jax import parallel
  from bert_jax.io import training_checkpoints as tc
  from tests.test_train_step import tiny_config
  assert jax.device_count() == 8, jax.devices()
  config = tiny_config(model_parallelism=2)
  config.model.vocab_size = 98  # divisible by 2: the vocabulary is split too
  single, single_losses = _train(config)
  par = parallel.create(config)
  state, losses = _train(config, par)
  specs, shard_shapes = _layout(state)

  # Save on 4 x 2, restore on 8 x 1 (data only).
  checkpointer = tc.TrainingCheckpointer(os.path.join(out_dir, "ckpt"), keep=1, async_save=False)
  checkpointer.save(STEPS, par.checkpointable(state), force=True)
  checkpointer.close()
  config.model_parallelism = 1
  par8 = parallel.create(config)
  fresh, _, _ = _setup(config, par8)
  _, restored = tc.TrainingCheckpointer(os.path.join(out_dir, "ckpt")).restore_latest(
      par8.abstract_state(fresh))
  leaves = lambda tree: [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(tree))]
  restored_equal = all(np.array_equal(a, b) for a, b in zip(leaves(restored), leaves(state)))
  restored_mesh = restored.params["bert"]["pooler"]["dense"]["kernel"].sharding.mesh

  report = {
      "mesh": dict(par.mesh.shape), "losses": {"single": single_losses, "4x2": losses},
      "max_param_diff": max(float(np.abs(a - b).max()) for a, b in
                            zip(leaves(single.params), leaves(state.params))),
      "specs": specs, "shard_shapes": shard_shapes,
      "restored_mesh": dict(restored_mesh.shape),
      "restored_equal": bool(restored_equal and len(leaves(restored)) == len(leaves(state))),
      "e2e": _e2e(out_dir), "finetune": _finetune(out_dir)}
  print(json.dumps(report))


if __name__ == "__main__":
  sys.path.insert(0, ROOT)
  main(sys.argv[1])
