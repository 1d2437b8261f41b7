"""What a run's numbers depend on beyond its config: library versions, the CPU, the devices.

Training is bitwise reproducible for a given environment (the same config, versions and kind of
machine give the same `metrics.jsonl`), but not across environments: XLA compiles the CPU step
for the host's instruction set (AVX-512 and AMX on one machine, AVX2 on another), which changes
the order of floating-point sums, and a few ulps per step grow into visible differences over
thousands of steps (the demo's held-out MLM accuracy at step 3,000 was 0.200 on one 2-core CPU
and 0.189 on another with the same versions; README, "The main job"). So every start of a job
appends one line to `WORKDIR/environment.jsonl`: two runs whose numbers differ can be told apart
by it, and a resumed run that moved to another machine says so.

The line is written once the run's first job starts training (`recorded_when_started`, around
the run; `job_started`, from `runtime.job.run` once the checkpoint is restored or the run starts
fresh): a run refused before that (another architecture, another vocabulary, a held lock)
leaves the file as it was.
"""
import contextlib
import contextvars
import datetime
import importlib.metadata
import json
import os
import platform
import sys
from typing import Any, Dict, Iterator, List, Optional

import jax

from bert_jax.io import filesystem, training_checkpoints
from bert_jax.runtime import outputs

ENVIRONMENT_FILE = "environment.jsonl"

# The distributions whose version changes what a run computes (numerics, random streams, data).
PACKAGES = ("jax", "jaxlib", "libtpu", "flax", "optax", "orbax-checkpoint", "numpy",
            "tensorflow", "tensorflow-cpu", "tokenizers", "sentencepiece")
# CPU features that decide the kernels XLA:CPU generates (vector width, matrix units).
_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "asimd", "sve")


def _versions() -> Dict[str, str]:
  found = {}
  for name in PACKAGES:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      continue
  return found


def _cpu() -> Dict[str, Any]:
  """The host CPU's model name and the vector/matrix features XLA:CPU compiles for (Linux;
  elsewhere the processor string only)."""
  model, flags = platform.processor() or platform.machine(), set()
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
          model = value.strip()
        elif key in ("flags", "Features"):
          flags.update(value.split())
  except OSError:
    pass
  return {"model": model, "machine": platform.machine(), "cores": os.cpu_count(),
          "features": [f for f in _CPU_FLAGS if f in flags]}


def describe() -> Dict[str, Any]:
  """This process's environment as one JSON-serialisable dict."""
  devices: List[Any] = jax.devices()
  return {
      "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "python": platform.python_version(),
      "packages": _versions(),
      "bert_jax": training_checkpoints.written_by(),   # the version and the source's commit
      "cpu": _cpu(),
      "backend": jax.default_backend(),
      "devices": {"kind": devices[0].device_kind, "count": len(devices),
                  "processes": jax.process_count()},
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)),
  }


def record(workdir: str) -> Dict[str, Any]:
  """Appends `describe()` to WORKDIR/environment.jsonl (process 0) and returns it."""
  entry = describe()
  if outputs.is_writer():
    filesystem.makedirs(workdir)
    path = filesystem.confined(workdir, ENVIRONMENT_FILE, held_by=workdir)   # no link out
    previous = filesystem.read_text(path) if filesystem.exists(path) else ""
    # Rewritten whole rather than appended: Cloud Storage objects cannot be appended to.
    filesystem.write_text(path, previous + json.dumps(entry, sort_keys=True) + "\n")
  return entry


# The workdir whose environment line the next job to start writes (None: none pending).
_PENDING: "contextvars.ContextVar[Optional[str]]" = contextvars.ContextVar(
    "bert_jax_environment_pending", default=None)


@contextlib.contextmanager
def recorded_when_started(workdir: str) -> Iterator[None]:
  """Within: the first job that starts training (`job_started`) appends this process's
  environment to WORKDIR/environment.jsonl; a run that ends before any job starts (refused)
  writes nothing."""
  token = _PENDING.set(workdir)
  try:
    yield
  finally:
    _PENDING.reset(token)


def job_started() -> None:
  """A job starts training (its checkpoint restored or a fresh start, every check passed): the
  pending environment line is written (once per `recorded_when_started`)."""
  workdir = _PENDING.get()
  if workdir is not None:
    _PENDING.set(None)
    record(workdir)


def read(workdir: str) -> List[Dict[str, Any]]:
  """The entries of WORKDIR/environment.jsonl, oldest first (none if absent)."""
  path = filesystem.join(workdir, ENVIRONMENT_FILE)
  if not filesystem.exists(path):
    return []
  return [json.loads(line) for line in filesystem.read_text(path).splitlines() if line.strip()]
