"""Keep freed host memory in the process, so that each training step does not fault it in again.

XLA's CPU runtime allocates every execution's temporaries as one block, freed when the step
ends: 896 MB for the BERT-mini pre-training step of benchmarks/RESULTS.md. glibc's malloc serves
a block that large with a fresh `mmap` and returns it with `munmap` on free, so the next step
page-faults all of it again: 230,000 minor faults and ~0.5 s of kernel time per BERT-mini step
on the 2-core benchmark machine, a fifth of the step's CPU time.

`keep_freed_memory()` sets three glibc options (`mallopt`) so that freed blocks stay in the
heap and are reused: no `mmap` for large blocks (M_MMAP_MAX 0), no trimming of the heap's top
(M_TRIM_THRESHOLD -1: never, as mallopt(3) documents), and one arena for all threads
(M_ARENA_MAX 1): a thread of a secondary arena could only get such a block by `mmap`, so without
it XLA's worker threads would keep faulting. Measured with the BERT-mini step: 0 faults per
step instead of 230,000 and the step about 1.3x faster (benchmarks/RESULTS.md). The cost: the
process keeps its peak heap (it does not give memory back to the system), which a training
process reaches every step anyway.

It must run before any other thread allocates (glibc gives a thread its arena at its first
allocation, and XLA's threads may then share one of those arenas), i.e. before TensorFlow or
JAX start: `bert_jax.main` calls it first thing. A notebook kernel already runs threads of its
own, and there it has no effect (measured: every step faulted as before); start the kernel with
the same options in its environment instead, which glibc reads at process start:
`MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1` (`ENVIRONMENT`).
`BERT_JAX_KEEP_HOST_MEMORY=0` turns it off. Outside glibc (macOS, musl) it does nothing.
"""
import ctypes
import ctypes.util
import os
import platform

from absl import logging

# (mallopt parameter number from malloc.h, the same option's environment variable, value).
# M_TRIM_THRESHOLD -1 turns trimming off. Its largest positive value (an int: 2 GiB) is not
# enough: a training loop that dispatches the next step before the last one ends holds two
# steps' temporaries, and for a MiniLM-sized fine-tuning step the heap top then passed 2 GiB and
# was trimmed and faulted in again every step (266,000 faults and ~2 s of kernel time per step).
_OPTIONS = ((-8, "MALLOC_ARENA_MAX", 1),                 # M_ARENA_MAX
            (-4, "MALLOC_MMAP_MAX_", 0),                 # M_MMAP_MAX
            (-1, "MALLOC_TRIM_THRESHOLD_", -1))          # M_TRIM_THRESHOLD

ENV_VAR = "BERT_JAX_KEEP_HOST_MEMORY"
# The same options for a process's environment (read by glibc at start).
ENVIRONMENT = " ".join(f"{name}={value}" for _, name, value in _OPTIONS)

_kept = False


def is_kept() -> bool:
  """Whether `keep_freed_memory()` applied its options in this process."""
  return _kept


def keep_freed_memory() -> bool:
  """Sets the glibc options above; True when they were applied.

  False (and nothing changes) outside Linux/glibc or when BERT_JAX_KEEP_HOST_MEMORY=0.
  """
  global _kept
  if os.environ.get(ENV_VAR, "1") == "0":
    return False
  if _kept:  # a second call (one script importing another) has nothing to do or warn about
    return True
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
  if _thread_count() > 1:
    logging.warning(
        "host_memory.keep_freed_memory() called after other threads started: their malloc "
        "arenas remain, so XLA's per-step temporaries may still be unmapped and faulted in "
        "again each step. Start the process with %s instead.", ENVIRONMENT)
  # mallopt returns 1 on success.
  _kept = all([mallopt(param, value) == 1 for param, _, value in _OPTIONS])
  return _kept


def _thread_count() -> int:
  try:
    return len(os.listdir("/proc/self/task"))
  except OSError:
    return 1
