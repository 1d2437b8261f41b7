"""TPU slices described without a TPU: accelerator types (`v4-8`, `v5litepod-16`, `v6e-8`, ...)
as devices the real TPU compiler (`libtpu`) can compile for, and the chips' published numbers.

`slice_devices("v4-32")` returns compile-only devices of that slice (16 chips on 4 hosts, each
with its coordinates and host index) from `jax.experimental.topologies`; a mesh over them gives a
program its real shardings, and `jax.jit(...).lower(...).compile()` runs the real TPU compiler
on this machine (`bert_jax.tasks.tools.compile_report`). Needs `libtpu` (`pip install "jax[tpu]"`).

The accelerator types are the ones Cloud TPU's `--accelerator-type` takes: v4 and v5p count
TensorCores (two per chip: `v4-8` is 4 chips), v5e (`v5litepod-N`, also written `v5e-N`) and
v6e count chips. Slices are laid out as Cloud TPU VMs are: 4 chips per host, except the 8-chip
single-host v5e / v6e VMs.
"""
import dataclasses
import glob
import math
import os
import re
from typing import List, Tuple

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Generation:
  """A TPU generation's compiler name and its published per-chip numbers (Cloud TPU docs)."""
  name: str                    # as in the topology string: "v4", "v5e", "v5", "v6e"
  device_kind: str             # what JAX reports
  chip_config: str             # "megacore": one device per chip over both TensorCores
  dimensions: int              # of the chip grid (v4 / v5p: 3-D torus; v5e / v6e: 2-D)
  cores_per_chip_in_name: int  # v4-8 and v5p-8 count TensorCores, v5e / v6e count chips
  hbm_bytes: int               # per chip
  peak_bf16_flops: float       # per chip, per second
  hbm_bandwidth: float         # bytes per second, per chip


GENERATIONS = {
    "v4": Generation("v4", "TPU v4", "megacore", 3, 2, 32 * GIB, 275e12, 1228e9),
    # Published as "95 GB", in the binary unit of v5e's "16 GB" and v4's 32 GiB: the compiler
    # calls 95.74 GiB of a v5p chip usable (15.75 of 16 on v5e, 30.75 of 32 on v4).
    "v5p": Generation("v5", "TPU v5", "megacore", 3, 2, 95 * GIB, 459e12, 2765e9),
    "v5e": Generation("v5e", "TPU v5 lite", "default", 2, 1, 16 * GIB, 197e12, 819e9),
    "v6e": Generation("v6e", "TPU v6 lite", "default", 2, 1, 32 * GIB, 918e12, 1640e9),
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e"}


@dataclasses.dataclass(frozen=True)
class Slice:
  """One accelerator type: its generation, chips, chip grid and hosts."""
  accelerator_type: str
  generation: Generation
  chips: int
  grid: Tuple[int, ...]
  chips_per_host: Tuple[int, ...]

  @property
  def topology_name(self) -> str:
    return f"{self.generation.name}:{'x'.join(map(str, self.grid))}"

  @property
  def num_hosts(self) -> int:
    return self.chips // math.prod(self.chips_per_host)


def _grid(chips: int, dimensions: int) -> Tuple[int, ...]:
  """The chip grid of a slice: powers of two, as square as they go (2x2x1, 2x2x2, 2x2x4, 2x4x4,
  4x4x4, ...; 2x2, 2x4, 4x4, 4x8, ...), as Cloud TPU lays slices out."""
  if chips < 4 or chips & (chips - 1):
    raise ValueError(f"{chips} chips: a slice has a power of two of at least 4 chips")
  if dimensions == 2:
    small = 2 ** (int(math.log2(chips)) // 2)
    return small, chips // small
  grid = [2, 2, 1]
  while math.prod(grid) < chips:   # double the smallest axis, the last one on a tie
    axis = min(range(3), key=lambda a: (grid[a], -a))
    grid[axis] *= 2
  return tuple(grid)


def parse(accelerator_type: str) -> Slice:
  """`v4-32`, `v5p-8`, `v5litepod-16` (or `v5e-16`), `v6e-8`, ... -> a `Slice`."""
  match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", accelerator_type.strip().lower())
  name = match and _ALIASES.get(match.group(1), match.group(1))
  if not match or name not in GENERATIONS:
    raise ValueError(f"Unknown accelerator type {accelerator_type!r}: expected e.g. v4-8, v4-32, "
                     f"v5litepod-8, v5litepod-256, v5p-8, v6e-8 ({sorted(GENERATIONS)} slices)")
  generation = GENERATIONS[name]
  count = int(match.group(2))
  if count % generation.cores_per_chip_in_name:
    raise ValueError(f"{accelerator_type}: {name} slices count TensorCores, two per chip")
  chips = count // generation.cores_per_chip_in_name
  grid = _grid(chips, generation.dimensions)
  # Cloud TPU VMs: 4 chips per host; v5e / v6e also come as one 8-chip host.
  single_host_eight = generation.dimensions == 2 and chips == 8
  per_host = (2, 4, 1) if single_host_eight else (2, 2, 1)
  return Slice(accelerator_type, generation, chips, grid, per_host)


def slice_devices(accelerator_type: str) -> List:
  """Compile-only devices of the slice (needs libtpu); they carry coordinates and host index."""
  spec = parse(accelerator_type)
  if not glob.glob("/dev/accel*") and not os.path.exists("/dev/vfio"):
    # No TPU here: libtpu only compiles, so several processes (parallel tests, a run beside a
    # check) may load it at once instead of the second failing on its lockfile.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    from jax.experimental import topologies
    description = topologies.get_topology_desc(
        platform="tpu", topology_name=spec.topology_name,
        chip_config_name=spec.generation.chip_config, chips_per_host_bounds=spec.chips_per_host,
        num_slices=1)
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(f"Cannot describe a {accelerator_type} slice ({spec.topology_name}): "
                       f"{type(e).__name__}: {e}. The TPU compiler comes with "
                       "pip install 'jax[tpu]' (libtpu, the version jax pins).") from e
  return list(description.devices)
