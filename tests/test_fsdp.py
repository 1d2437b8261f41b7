"""config.fsdp: the train state's matrices split along `data` too (ZeRO-3), and
config.shard_optimizer_state: the optimizer moments alone (ZeRO-1); nothing else changes: on 8
simulated CPU devices (a subprocess) the pre-training loop gives the losses and parameters of the
replicated state, alone and with tensor parallelism; a checkpoint written with one setting
resumes with the other; `load_pretrained` reads an fsdp workdir.

Run as a script (`python tests/test_fsdp.py OUT_DIR`) it is that subprocess.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 20
QUERY = "bert/encoder/layer_0/attention/self/query/kernel"


@pytest.mark.parametrize("field", ["fsdp", "shard_optimizer_state"])
def test_a_sharded_state_with_pmap_is_a_clear_error(field):
  from bert_jax import parallel
  from tests.test_train_step import tiny_config
  with pytest.raises(ValueError, match=f"config.{field}=True.*parallelism='jit'"):
    parallel.create(tiny_config(parallelism="pmap", **{field: True}))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  out = tmp_path_factory.mktemp("fsdp")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", PYTHONPATH=ROOT,
             JAX_PLATFORMS="cpu")
  run = subprocess.run([sys.executable, os.path.abspath(__file__), str(out)],
                       capture_output=True, text=True, env=env, timeout=900)
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_state_is_split_along_data(report):
  specs = report["specs"]["8x1 fsdp"]
  for spec in specs[QUERY]:          # the kernel, Adam's mu and nu
    assert spec == ["data", None], spec
  assert specs["bert/encoder/layer_0/intermediate/dense/kernel"][0] == [None, "data"]
  assert specs["bert/encoder/layer_0/attention/self/query/bias"][0] == [None]   # vectors stay
  assert report["shard_shapes"]["8x1 fsdp"][QUERY] == [4, 32]
  # With tensor parallelism the other dimension goes to `model`.
  assert report["specs"]["4x2 fsdp"][QUERY][0] == ["data", "model"]
  assert report["specs"]["8x1"][QUERY][0] == [None, None]


def test_zero1_splits_the_moments_and_keeps_the_parameters_whole(report):
  specs = report["specs"]["8x1 zero1"]
  kernel, mu, nu = specs[QUERY]
  assert kernel == [None, None] and mu == nu == ["data", None], specs[QUERY]
  assert specs["bert/encoder/layer_0/intermediate/dense/kernel"][1:] == [[None, "data"]] * 2
  assert specs["bert/encoder/layer_0/attention/self/query/bias"][1] == [None]   # vectors stay


def test_fsdp_trains_as_the_replicated_state(report):
  losses = report["losses"]
  assert len(losses["8x1"]) == STEPS
  for name in ("8x1 fsdp", "4x2 fsdp", "8x1 zero1"):
    np.testing.assert_allclose(losses[name], losses["8x1"], rtol=1e-5, err_msg=name)
    assert report["max_param_diff"][name] < 1e-5, name


def test_a_checkpoint_resumes_with_the_other_setting(report):
  for name in ("fsdp -> replicated", "replicated -> fsdp", "zero1 -> replicated"):
    np.testing.assert_allclose(report["losses"][name], report["losses"]["8x1"], rtol=1e-5,
                               err_msg=name)
    assert report["max_param_diff"][name] < 1e-5, name


# ------------------------------------------------------------- the subprocess


def _run(out_dir, name, **overrides):
  """The pre-training loop on the fixture data; (workdir, losses)."""
  from bert_jax.runtime.metric_writers import read_metrics
  from bert_jax.tasks import registry
  from tests import pretraining_fixtures as fx
  config = fx.tiny_config(os.path.join(out_dir, "data"), num_train_steps=STEPS,
                          eval_every_steps=0, checkpoint_every_steps=10, keep_checkpoints=5,
                          async_checkpointing=False, **overrides)
  workdir = os.path.join(out_dir, name.replace(" ", "_").replace(">", ""))
  registry.run_job(config, workdir)
  return workdir, [r["loss"] for r in read_metrics(workdir, "train")]


def _resume(out_dir, source, name, **overrides):
  """`source` copied as it was at step 10, then trained to the end with `overrides`."""
  target = os.path.join(out_dir, name.replace(" ", "_").replace(">", ""))
  shutil.copytree(source, target)
  shutil.rmtree(os.path.join(target, "checkpoints", str(STEPS)))
  from bert_jax.runtime.metric_writers import read_metrics
  from bert_jax.tasks import registry
  from tests import pretraining_fixtures as fx
  config = fx.tiny_config(os.path.join(out_dir, "data"), num_train_steps=STEPS,
                          eval_every_steps=0, checkpoint_every_steps=10, keep_checkpoints=5,
                          async_checkpointing=False, **overrides)
  registry.run_job(config, target)
  return target, [r["loss"] for r in read_metrics(target, "train")]


def main(out_dir):
  import jax
  from bert_jax.io import checkpoints
  from bert_jax import parallel
  from tests.test_tensor_parallel import _layout, _setup
  from tests.test_train_step import tiny_config
  assert jax.device_count() == 8, jax.devices()
  runs = {"8x1": _run(out_dir, "8x1"), "8x1 fsdp": _run(out_dir, "8x1 fsdp", fsdp=True),
          "4x2 fsdp": _run(out_dir, "4x2 fsdp", fsdp=True, model_parallelism=2),
          "8x1 zero1": _run(out_dir, "8x1 zero1", shard_optimizer_state=True)}
  resumed = {"fsdp -> replicated": _resume(out_dir, runs["8x1 fsdp"][0], "fsdp -> replicated"),
             "replicated -> fsdp": _resume(out_dir, runs["8x1"][0], "replicated -> fsdp",
                                           fsdp=True),
             "zero1 -> replicated": _resume(out_dir, runs["8x1 zero1"][0],
                                            "zero1 -> replicated")}
  flat = lambda workdir: checkpoints.flatten(checkpoints.load_pretrained(workdir)[1])
  base = flat(runs["8x1"][0])
  workdirs = {name: run[0] for name, run in runs.items()}
  workdirs.update({name: run[0] for name, run in resumed.items()})
  report = {"losses": {name: run[1] for name, run in runs.items()},
            "max_param_diff": {}, "specs": {}, "shard_shapes": {}}
  report["losses"].update({name: run[1] for name, run in resumed.items()})
  for name, workdir in workdirs.items():
    params = flat(workdir)   # load_pretrained reads every layout
    assert params.keys() == base.keys(), name
    report["max_param_diff"][name] = max(float(np.abs(np.asarray(params[k]) - base[k]).max())
                                         for k in base)
  for name, overrides in (("8x1", {}), ("8x1 fsdp", {"fsdp": True}),
                          ("4x2 fsdp", {"fsdp": True, "model_parallelism": 2}),
                          ("8x1 zero1", {"shard_optimizer_state": True})):
    config = tiny_config(**overrides)
    state, _, _ = _setup(config, parallel.create(config))
    report["specs"][name], report["shard_shapes"][name] = _layout(state)
  print(json.dumps(report))


if __name__ == "__main__":
  sys.path.insert(0, ROOT)
  main(sys.argv[1])
