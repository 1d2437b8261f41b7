"""Parallelism: the device mesh and logical-axis rules (`sharding`), and how a step is spread
over the devices (`strategies`: `jit` over the mesh or `pmap`), re-exported here."""
from bert_jax.parallel.strategies import PMAP_AXIS, JitParallel, PmapParallel, create

__all__ = ["PMAP_AXIS", "JitParallel", "PmapParallel", "create"]
