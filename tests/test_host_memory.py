"""bert_jax.runtime.host_memory: freed large blocks stay in the process instead of being faulted in again.

Each check runs in a fresh interpreter: the glibc options are process-wide and must be set before
other threads allocate.
"""
import os
import platform
import subprocess
import sys

import pytest

from bert_jax.runtime import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Allocates, touches and frees a block (256 MB unless SIZE is set; as XLA's CPU runtime does
# with each step's temporaries) four times; prints whether the options applied and the minor page
# faults per round after the first.
_ROUNDS = r"""
import ctypes, os, resource
from bert_jax.runtime import host_memory
kept = host_memory.keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = int(os.environ.get("SIZE", 256 << 20))
def round_trip():
  block = libc.malloc(size)
  ctypes.memset(block, 1, size)
  libc.free(block)
round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
  round_trip()
print(kept, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 3)
"""

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the options are glibc's; elsewhere keep_freed_memory() does nothing")


def _run(code, keep: str, **env_vars) -> subprocess.CompletedProcess:
  env = dict(os.environ, BERT_JAX_KEEP_HOST_MEMORY=keep, PYTHONPATH=ROOT, **env_vars)
  return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=120, check=True)


@glibc_only
def test_a_freed_block_is_reused_without_page_faults():
  kept, faults = _run(_ROUNDS, keep="1").stdout.split()
  assert kept == "True"
  assert int(faults) < 50        # the block comes back from the heap, already mapped


@glibc_only
def test_a_block_over_2_gib_is_kept_too():
  """The heap top is never trimmed: M_TRIM_THRESHOLD's largest positive value (2 GiB) trimmed a
  free top this large each round (two steps' temporaries of a MiniLM fine-tuning loop)."""
  kept, faults = _run(_ROUNDS, keep="1", SIZE=str(9 << 28)).stdout.split()      # 2.25 GiB
  assert kept == "True"
  assert int(faults) < 50


@glibc_only
def test_the_documented_environment_does_the_same_without_the_call():
  env = dict(item.split("=") for item in host_memory.ENVIRONMENT.split())
  kept, faults = _run(_ROUNDS, keep="0", SIZE=str(9 << 28), **env).stdout.split()
  assert kept == "False"                                     # only the environment acted
  assert int(faults) < 50


@glibc_only
def test_turned_off_every_round_faults_the_block_in_again():
  kept, faults = _run(_ROUNDS, keep="0").stdout.split()
  assert kept == "False"
  assert int(faults) > 100       # 65,536 pages of 4 KiB (128 with transparent huge pages)


@glibc_only
def test_the_training_entry_point_keeps_freed_memory():
  kept, = _run("import bert_jax.main\nfrom bert_jax.runtime import host_memory\n"
               "print(host_memory.is_kept())", keep="1").stdout.split()
  assert kept == "True"


@glibc_only
def test_a_late_call_says_to_set_the_environment_instead():
  code = ("import threading\n"
          "done = threading.Event()\n"
          "threading.Thread(target=lambda: (bytearray(1 << 20), done.wait())).start()\n"
          "from bert_jax.runtime import host_memory\n"
          "host_memory.keep_freed_memory()\n"
          "done.set()\n")
  out = _run(code, keep="1")
  assert "after other threads started" in out.stderr
  assert host_memory.ENVIRONMENT in out.stderr


def test_turned_off_by_the_environment(monkeypatch):
  monkeypatch.setenv(host_memory.ENV_VAR, "0")
  assert host_memory.keep_freed_memory() is False


@glibc_only
def test_a_second_call_after_threads_started_is_silent():
  # One benchmark script importing another calls it twice, the second time after JAX started.
  code = ("import threading\n"
          "from bert_jax.runtime import host_memory\n"
          "assert host_memory.keep_freed_memory()\n"
          "done = threading.Event()\n"
          "threading.Thread(target=done.wait).start()\n"
          "print(host_memory.keep_freed_memory())\n"
          "done.set()\n")
  out = _run(code, keep="1")
  assert out.stdout.split() == ["True"]
  assert "after other threads started" not in out.stderr
