"""Device mesh and placement: the batch is sharded along `data`, the train state replicated.

One code path serves one CPU, every core of a TPU VM and several hosts: `jit` compiles the step
for the global mesh, and each host contributes its own slice of the global batch
(`jax.make_array_from_process_local_data`).
"""
from typing import Callable, Dict, Iterable, Iterator, Tuple

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def create_mesh(config=None) -> Mesh:
  """A 1-D mesh over every device of every process, along the `data` axis."""
  devices = np.asarray(jax.devices())
  return Mesh(devices.reshape(-1), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def shard_batch(batch, mesh: Mesh):
  """Host-local numpy batch (this process's rows) -> global jax.Arrays sharded along `data`."""
  sharding = batch_sharding(mesh)
  return jax.tree_util.tree_map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch)


def create_sharded_state(init_fn: Callable, mesh: Mesh) -> Tuple[object, object]:
  """Runs `init_fn` under jit with the state placed on the mesh; returns (state, shardings)."""
  abstract = jax.eval_shape(init_fn)
  shardings = jax.tree_util.tree_map(lambda _: replicated(mesh), abstract)
  state = jax.jit(init_fn, out_shardings=shardings)()
  return state, shardings


def every_process(flag: bool) -> bool:
  """True when `flag` is True on every process (a collective: all processes must call it)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.all(multihost_utils.process_allgather(np.asarray(flag, np.bool_))))


def lockstep(batches: Iterable[Dict[str, np.ndarray]],
             blank: Dict[str, np.ndarray]) -> Iterator[Dict[str, np.ndarray]]:
  """This process's batches, continued with `blank` until every process has run out.

  A finite pass (evaluation) over per-host shards gives hosts different numbers of batches, but
  every global step is a collective that all hosts must enter. A host that ran out contributes
  `blank`, a batch whose weights are all zero, so the global sums are those of the real data.
  """
  iterator = iter(batches)
  while True:
    batch = next(iterator, None)
    if every_process(batch is None):
      return
    yield blank if batch is None else batch
