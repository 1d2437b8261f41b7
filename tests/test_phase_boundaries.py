"""Phase boundaries (`config.init_optimizer_state`): a later phase of a recipe takes the earlier
phase's optimizer state with its parameters (the Adam moments and their bias-correction count),
while its own step, learning-rate schedule and input start at 0, as ModernBERT's phases did
(Composer's `reset_time` with the optimizer state loaded); False starts the moments at zero; a
state of other shapes, or a checkpoint without one, is refused naming the field."""
import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from bert_jax import parallel
from bert_jax.runtime import job as jobs
from bert_jax.runtime import optim
from bert_jax.tasks import registry
from bert_jax.tasks.jobs import init_checkpoint, pretraining
from tests import finetuning_fixtures as fx


def _experiment(arg):
  return importlib.import_module("experiments.pretrain_modernbert").get_config(arg)


def _flat(tree):
  """{path: array} of a tree (a TrainState's part, or the nested dicts Orbax reads back)."""
  return {jax.tree_util.keystr(path): np.asarray(x)
          for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def _saved_state(workdir, step):
  """The TrainState saved at `step`, read by Orbax alone (no target: nested dicts and lists)."""
  return ocp.StandardCheckpointer().restore(str(workdir / "checkpoints" / str(step) / "state"))


def test_the_schedule_restarts_while_the_moments_carry_on():
  """`optim.restart_schedules` on a StableAdamW state after 4 updates: the next update is the
  rate of the schedule's step 0 times the moments' step with bias-correction count 5; without
  it, the rate of step 4. A decay schedule, so the two rates differ."""
  schedule = optim.wsd_schedule(1e-2, 0, 8, 8, "1-sqrt")
  tx = optim.stable_adamw(schedule, 0.9, 0.98, 1e-6, 0.1, optim.decay_mask)
  rng = np.random.default_rng(0)
  params = {"dense": {"kernel": jnp.ones((3, 4))}, "LayerNorm": {"scale": jnp.ones((4,))}}
  grads = [jax.tree_util.tree_map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype),
                                  params) for _ in range(5)]
  state = tx.init(params)
  for g in grads[:4]:
    _, state = tx.update(g, state, params)
  carried = optim.restart_schedules(state, tx.init(params))
  adam, schedule_state = carried
  assert isinstance(schedule_state, optax.ScaleByScheduleState)
  assert int(adam.count) == 4 and int(schedule_state.count) == 0
  for key, value in _flat(state[0]).items():
    np.testing.assert_array_equal(_flat(adam)[key], value)

  direction, _ = optim.scale_by_stable_adam(0.9, 0.98, 1e-6, 0.1, optim.decay_mask).update(
      grads[4], state[0], params)
  for s, start in ((0, carried), (4, state)):
    updates, after = tx.update(grads[4], start, params)
    assert int(after[0].count) == 5 and int(after[1].count) == s + 1
    want = _flat(jax.tree_util.tree_map(lambda d: jnp.asarray(-schedule(s), d.dtype) * d,
                                        direction))
    for key, value in _flat(updates).items():
      np.testing.assert_allclose(value, want[key], rtol=1e-6, err_msg=f"{key} at step {s}")
  assert float(schedule(0)) > 2 * float(schedule(4)) > 0.0


def test_a_checkpoint_without_optimizer_state_is_refused(tmp_path):
  """A released or exported checkpoint (here save_pretrained's) holds parameters only."""
  checkpoint = fx.write_checkpoint(str(tmp_path / "ckpt"), architecture="modernbert",
                                   pad_token_id=0, type_vocab_size=1)
  with pytest.raises(ValueError, match=r"init_optimizer_state=True .* holds parameters only"):
    init_checkpoint.warm_start(checkpoint, None, None, None, None, optimizer_state=True)


def test_growth_does_not_carry_the_optimizer_state():
  config = _experiment("size=large,phase=extend,quick")
  assert config.init_optimizer_state
  config.init_checkpoint, config.init_tiling = "/some/base/workdir", "tile_from_middle"
  with pytest.raises(ValueError, match="init_optimizer_state=True .*init_tiling grows"):
    pretraining.check_config(config)
  assert not _experiment("phase=pretrain,quick").init_optimizer_state


def _warm_started(config, workdir):
  """The fresh state of `config`'s job in `workdir` after its warm start, on the host."""
  job = registry.job(config, str(workdir))
  par = parallel.create(config)
  state, _ = jobs.state_and_step(job, par)
  return jax.device_get(par.checkpointable(job.warm_start(state, par)))


@pytest.mark.slow
def test_the_extend_phase_starts_from_the_pretrain_phase_s_moments(tmp_path):
  """experiments/pretrain_modernbert.py's quick pretrain phase, then its extend phase from that
  workdir (init_optimizer_state=True, the experiment's): the extend run's starting state holds
  the pretrain checkpoint's parameters and moments, with the moments' count and a schedule count
  and step of 0, and its last checkpoint counts its own 4 steps on the schedule and 4 + 4 on the
  moments. With False the moments start at zero; another optimizer or layout is refused."""
  pretrain = _experiment("phase=pretrain,quick")
  registry.run_job(pretrain, str(tmp_path / "pretrain"))
  saved = _saved_state(tmp_path / "pretrain", pretrain.num_train_steps)
  saved_adam, saved_schedule = saved["opt_state"][0]   # stable_adamw, no gradient clipping
  assert int(saved_adam["count"]) == int(saved_schedule["count"]) == pretrain.num_train_steps

  extend = _experiment("phase=extend,quick")
  assert extend.init_optimizer_state and extend.optimizer.name == "stable_adamw"
  extend.init_checkpoint = str(tmp_path / "pretrain")
  job = registry.job(extend, str(tmp_path / "extend"))
  started = {}

  def warm_start(state, par):
    state = job.warm_start(state, par)
    # Copied now: the first step donates the state's buffers.
    started["state"] = jax.tree_util.tree_map(np.array, par.checkpointable(state))
    return state

  jobs.run(dataclasses.replace(job, warm_start=warm_start), str(tmp_path / "extend"),
           parallel.create(extend))
  start = started["state"]
  assert int(start.step) == 0 and int(start.total_skips) == 0
  adam, schedule_state = start.opt_state[0]
  assert int(adam.count) == pretrain.num_train_steps and int(schedule_state.count) == 0
  for name, ours, theirs in (("params", start.params, saved["params"]),
                             ("mu", adam.mu, saved_adam["mu"]), ("nu", adam.nu, saved_adam["nu"])):
    ours, theirs = _flat(ours), _flat(theirs)
    assert ours.keys() == theirs.keys(), name
    for key, value in theirs.items():
      np.testing.assert_array_equal(ours[key], value, err_msg=f"{name}{key}")
  assert any(np.any(v) for v in _flat(adam.nu).values())
  ended = _saved_state(tmp_path / "extend", extend.num_train_steps)
  assert int(ended["step"]) == extend.num_train_steps
  assert int(ended["opt_state"][0][1]["count"]) == extend.num_train_steps     # its own schedule
  assert int(ended["opt_state"][0][0]["count"]) == (                        # the moments' count
      pretrain.num_train_steps + extend.num_train_steps)

  # The same phase with the moments afresh: the parameters alone are the pretrain phase's.
  afresh = _experiment("phase=extend,quick")
  afresh.init_checkpoint, afresh.init_optimizer_state = str(tmp_path / "pretrain"), False
  state = _warm_started(afresh, tmp_path / "extend")   # its data, already built
  np.testing.assert_array_equal(_flat(state.params)["['bert']['final_norm']['scale']"],
                                _flat(saved["params"])["['bert']['final_norm']['scale']"])
  assert not any(np.any(v) for v in _flat(state.opt_state).values())

  # A state of other shapes: named, with the way out.
  for change, shown in (({"optimizer.name": "adamw"}, "opt_state"),
                        ({"model.scan_layers": True}, "layer")):
    other = _experiment("phase=extend,quick")
    other.init_checkpoint = str(tmp_path / "pretrain")
    for field, value in change.items():
      section, name = field.split(".")
      other[section][name] = value
    with pytest.raises(ValueError, match="init_optimizer_state=True") as refused:
      _warm_started(other, tmp_path / "extend")
    assert "init_optimizer_state=False" in str(refused.value) and shown in str(refused.value)
