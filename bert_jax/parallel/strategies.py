"""How a train step is spread over devices: `jit` over a mesh (default) or `pmap`.

Both strategies give the loop the same operations (init the state, compile a train step and an
evaluation step, place a host batch, turn the state into a checkpointable tree and back), so the
training loops are written once. `config.parallelism`:

  jit   (default) one program for the global mesh; the batch is sharded along `data`, the state
        replicated (or, with `config.fsdp`, its matrices split along `data` too; with
        `config.shard_optimizer_state`, the optimizer moments only); XLA inserts
        the gradient all-reduce (reduce-scatter with fsdp). Works across hosts. With
        `config.model_parallelism` > 1 the mesh gains a `model` axis and the parameters and
        optimizer moments are sharded along it by their logical axis names (tensor
        parallelism; `bert_jax.parallel.sharding`), XLA inserting the activation all-reduces.
  pmap  the step runs per device with an explicit `axis_name`; the loss is normalised by the
        global weight totals and gradients are summed with `psum`, so the update equals a single
        device running the global batch. The classic multi-core TPU style.
"""
import functools
from typing import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_jax.parallel import sharding

PMAP_AXIS = "batch"


class UnderMesh:
  """A jitted function traced with its mesh as the context mesh (`jax.set_mesh`): what a kernel
  that runs per device (the splash attention, bert_jax/model/splash.py) reads to `shard_map`
  itself over the same devices. Called, or lowered ahead of time (the compile report)."""

  def __init__(self, jitted: Callable, mesh: Mesh):
    self.jitted, self.mesh = jitted, mesh

  def __call__(self, *args, **kwargs):
    with jax.set_mesh(self.mesh):
      return self.jitted(*args, **kwargs)

  def lower(self, *args, **kwargs):
    with jax.set_mesh(self.mesh):
      return self.jitted.lower(*args, **kwargs)


def _traced_within(fn: Callable, context: Callable) -> Callable:
  """`fn` run (and so traced, under jit) inside the context manager `context()` gives."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with context():
      return fn(*args, **kwargs)
  return wrapped


class JitParallel:
  name = "jit"

  def __init__(self, config=None, devices=None):
    self.mesh = sharding.create_mesh(config, devices)
    self.rules = sharding.logical_axis_rules(config)
    self.fsdp = sharding.fsdp(config)
    self.optimizer_sharded = sharding.shard_optimizer_state(config)
    self.state_sharding = None

  def init_state(self, init_fn: Callable, param_axes=None):
    """`param_axes`: the parameters' logical axis names (`sharding.logical_axes`); with them the
    parameters and optimizer moments are sharded by the rules (and along `data` with
    config.fsdp), without them replicated."""
    self._check_axes(param_axes)
    state, self.state_sharding = sharding.create_sharded_state(
        init_fn, self.mesh, param_axes, self.rules, self.fsdp, self.optimizer_sharded)
    return state

  def abstract_init_state(self, init_fn: Callable, param_axes=None):
    """What `init_state` would place, as shapes only: `jax.ShapeDtypeStruct`s with the
    shardings `init_state` gives (kept, as `init_state` keeps them, for `compile_step` and
    `compile_eval`). Nothing is computed or placed: a compile for devices that are not here
    (`--compile_for`, `runtime.job.abstract_state_and_step`)."""
    self._check_axes(param_axes)
    abstract = jax.eval_shape(init_fn)
    self.state_sharding = sharding.init_shardings(abstract, self.mesh, param_axes, self.rules,
                                                  self.fsdp, self.optimizer_sharded)
    return sharding.abstract(abstract, self.state_sharding)

  def abstract_batch(self, batch):
    """A global batch (every host's rows) as the shapes `put_batch` gives the step: sharded
    along `data`."""
    return sharding.abstract(batch, sharding.batch_sharding(self.mesh))

  def abstract_replicated(self, tree):
    """`tree` as shapes replicated on every device (the step's random key)."""
    return sharding.abstract(tree, sharding.replicated(self.mesh))

  def _check_axes(self, param_axes) -> None:
    for name, on in (("fsdp", self.fsdp), ("shard_optimizer_state", self.optimizer_sharded)):
      if on and param_axes is None:
        raise ValueError(f"config.{name}=True needs the parameters' logical axes (param_axes)")

  def place_state(self, host_state):
    return jax.device_put(host_state, self.state_sharding)

  def params_sharding(self):
    """Where `checkpointable(state).params` lives (what evaluation helpers compile against)."""
    return self.state_sharding.params

  def compile_step(self, step_fn: Callable, donate: bool = True) -> Callable:
    if self.optimizer_sharded:   # ZeRO-1: the gradients stay where the parameters are
      step_fn = _traced_within(step_fn, lambda: sharding.gradients_placed_like(
          self.state_sharding.params))
    return UnderMesh(jax.jit(step_fn,
                             in_shardings=(self.state_sharding, sharding.batch_sharding(self.mesh),
                                           sharding.replicated(self.mesh)),
                             out_shardings=(self.state_sharding, sharding.replicated(self.mesh)),
                             donate_argnums=(0,) if donate else ()), self.mesh)

  def compile_eval(self, eval_fn: Callable) -> Callable:
    """`eval_fn(params, batch) -> sums` over the global batch: each host passes its own rows
    (`put_batch`) and XLA all-reduces the sums, so every host gets the totals of all hosts."""
    return UnderMesh(jax.jit(eval_fn, in_shardings=(self.state_sharding.params,
                                                    sharding.batch_sharding(self.mesh)),
                             out_shardings=sharding.replicated(self.mesh)), self.mesh)

  def put_batch(self, batch):
    return sharding.shard_batch(batch, self.mesh)

  def checkpointable(self, state):
    return state

  def abstract_state(self, state):
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)

  def from_checkpoint(self, state):
    return state

  def metrics(self, device_metrics):
    return jax.device_get(device_metrics)


class PmapParallel:
  name = "pmap"

  def __init__(self):
    self.devices = jax.local_devices()
    self.mesh = sharding.create_mesh()  # for jit-compiled helpers (evaluation); pmap needs none

  def init_state(self, init_fn: Callable, param_axes=None):
    del param_axes  # pmap replicates the whole state on every device
    return self.place_state(jax.device_get(jax.jit(init_fn)()))

  def params_sharding(self):
    # checkpointable(state).params is one host copy: evaluation replicates it.
    return sharding.replicated(self.mesh)

  def place_state(self, host_state):
    # One copy per local device along a leading axis (what pmap's in_axes=0 expects).
    n = len(self.devices)
    stacked = NamedSharding(Mesh(np.asarray(self.devices), (PMAP_AXIS,)), P(PMAP_AXIS))
    return jax.tree_util.tree_map(
        lambda x: jax.device_put(np.broadcast_to(np.asarray(x)[None], (n,) + np.shape(x)),
                                 stacked), host_state)

  def compile_step(self, step_fn: Callable, donate: bool = True) -> Callable:
    return jax.pmap(functools.partial(step_fn, axis_name=PMAP_AXIS), axis_name=PMAP_AXIS,
                    in_axes=(0, 0, None), donate_argnums=(0,) if donate else ())

  def compile_eval(self, eval_fn: Callable) -> Callable:
    """`eval_fn(params, batch) -> sums`, summed over every device (and host) with `psum`."""
    summed = jax.pmap(lambda params, batch: jax.lax.psum(eval_fn(params, batch), PMAP_AXIS),
                      axis_name=PMAP_AXIS)
    # Every device holds the same totals after the psum; keep the first copy.
    return lambda params, batch: jax.tree_util.tree_map(lambda x: x[0], summed(params, batch))

  def put_batch(self, batch):
    n = len(self.devices)

    def split(x):
      x = np.asarray(x)
      if x.shape[0] % n:
        raise ValueError(f"per-host batch {x.shape[0]} is not divisible by {n} local devices")
      return x.reshape((n, x.shape[0] // n) + x.shape[1:])

    return jax.tree_util.tree_map(split, batch)

  def checkpointable(self, state):
    # Every replica holds the same values; checkpoint one copy. Across processes a shard keeps
    # the replica axis as a leading 1 (one process: it is squeezed), so drop it by shape.
    return jax.tree_util.tree_map(
        lambda x: np.asarray(x.addressable_shards[0].data).reshape(x.shape[1:]), state)

  def abstract_state(self, state):
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  self.checkpointable(state))

  def from_checkpoint(self, state):
    return self.place_state(jax.device_get(state))

  def metrics(self, device_metrics):
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[0], jax.device_get(device_metrics))


def create(config) -> "JitParallel | PmapParallel":
  """The parallelism of `config.parallelism` (`jit` over the device mesh, or `pmap`): how a job's
  state, batches and steps are placed and compiled (`runtime.job.state_and_step` takes it).
  `pmap` with a sharded state or model parallelism is refused, naming what to use."""
  name = config.parallelism
  if name == "jit":
    return JitParallel(config)
  if name == "pmap":
    for name, on in (("fsdp", sharding.fsdp(config)),
                     ("shard_optimizer_state", sharding.shard_optimizer_state(config))):
      if on:
        raise ValueError(f"config.{name}=True shards the state over the jit mesh; "
                         "config.parallelism='pmap' keeps a whole copy per device: use "
                         f"config.parallelism='jit', or set config.{name}=False")
    if sharding.model_parallelism(config) > 1:
      raise ValueError(f"config.parallelism='pmap' is data-parallel only, but "
                       f"config.model_parallelism={config.model_parallelism}; use "
                       "config.parallelism='jit' for tensor parallelism")
    return PmapParallel()
  raise ValueError(f"config.parallelism={name!r}: expected 'jit' or 'pmap'")
