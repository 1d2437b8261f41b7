"""Test-wide settings: CPU only, fast compiles, no accelerator for TensorFlow."""
import os
import shutil

# Must happen before jax / tensorflow are imported anywhere.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Tiny test models are compile-bound: skip most XLA optimisation passes. Set through the
# environment so that subprocesses (the command-line tests) compile exactly like this process,
# which bitwise comparisons between the two rely on.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import jax  # noqa: E402

import bert_jax  # noqa: E402,F401  (first: it keeps Triton out of the process, see its __init__)

assert jax.config.read("jax_disable_most_optimizations")

import pytest  # noqa: E402


class _FineTunedRuns:
  """Quick fine-tuning runs of one random tiny encoder, by kind (tests/finetuning_fixtures.py
  `fine_tune` kinds, plus "encoder": the checkpoint itself), each made on first use."""

  def __init__(self, root: str):
    from tests import finetuning_fixtures
    self._fx = finetuning_fixtures
    self._root = root
    self._runs = {}

  def __getitem__(self, kind: str) -> str:
    if "encoder" not in self._runs:
      self._runs["encoder"] = self._fx.write_checkpoint(os.path.join(self._root, "ckpt"))
    if kind not in self._runs:
      self._runs[kind] = self._fx.fine_tune(self._root, kind, self._runs["encoder"])
    return self._runs[kind]


@pytest.fixture(scope="session")
def fine_tuned_runs(tmp_path_factory):
  """Shared by the test files that need a fine-tuned model (prediction, export), so that a
  pytest worker fine-tunes each kind once, not once per file. Tests must leave them as found."""
  return _FineTunedRuns(str(tmp_path_factory.mktemp("fine_tuned")))


# Two tiers. The fast tier (the default: `python -m pytest -n 2 tests`) is the unit tests and the
# quick end-to-end runs, within about 12 minutes on 2 cores. The slow tier (`--tier=slow`) is the
# rest: end-to-end runs of minutes, multi-process and fault tests (`slow`), and the fault tests
# that wait out a timeout or kill at a chosen moment (`long_fault`). `.ci/run` runs both;
# `--tier=all` runs everything in one go. Tests outside the chosen tier are deselected, not
# skipped: they are not missing, they run in the other tier.
TIER = "--tier"
SLOW_MARKERS = ("slow", "long_fault")


def pytest_addoption(parser):
  parser.addoption(TIER, choices=("fast", "slow", "all"), default="fast",
                   help="which tests to run: fast (default), slow (marked slow or long_fault), all")


# Tiny test models are compile-bound, and the tests compile the same programs again and again (the
# same tiny configs, in this process and in the command-line runs they start): JAX's persistent
# compilation cache, shared by every process of a test run and kept for the next run (and tier),
# turns the repeats into reads. A program goes in from a tenth of a second of compiling (JAX's
# default, a second, keeps out nearly all of ours; below a tenth are the single operations of
# eager code, thousands of them, cheaper to compile than to file). It lives in pytest's cache
# folder (.pytest_cache/d/), owned by this checkout, emptied when a run starts with it over
# COMPILE_CACHE_MAX_BYTES (JAX's own bound scans the whole folder at every write: far slower).
# BERT_JAX_TEST_COMPILE_CACHE=off runs without it, =DIR uses DIR.
COMPILE_CACHE_ENV = "BERT_JAX_TEST_COMPILE_CACHE"
COMPILE_CACHE_MAX_BYTES = 2 * 1024**3


def _folder_bytes(directory: str) -> int:
  return sum(entry.stat().st_size for entry in os.scandir(directory) if entry.is_file())


def _use_compilation_cache(config):
  directory = os.environ.get(COMPILE_CACHE_ENV)
  if directory == "off" or not (directory or hasattr(config, "cache")):  # -p no:cacheprovider
    return
  directory = directory or str(config.cache.mkdir("xla_compilation_cache"))
  # The run's first process (xdist's controller) sets the environment its workers inherit.
  if os.environ.get("JAX_COMPILATION_CACHE_DIR") != directory:
    if os.path.isdir(directory) and _folder_bytes(directory) > COMPILE_CACHE_MAX_BYTES:
      shutil.rmtree(directory)
    os.makedirs(directory, exist_ok=True)
  settings = {"jax_compilation_cache_dir": directory,
              "jax_persistent_cache_min_compile_time_secs": 0.1,
              "jax_persistent_cache_min_entry_size_bytes": -1}
  for name, value in settings.items():
    jax.config.update(name, value)            # this process (nothing has compiled yet)
    os.environ[name.upper()] = str(value)     # and the processes the tests start


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: an end-to-end or fault test of the slow tier (--tier=slow)")
  config.addinivalue_line("markers", "long_fault: a fault test of minutes, in the slow tier (--tier=slow)")
  _use_compilation_cache(config)


def pytest_collection_modifyitems(config, items):
  tier = config.getoption(TIER)
  if tier == "all":
    return
  want_slow = tier == "slow"
  kept, deselected = [], []
  for item in items:
    # Markers, not keywords: keywords hold the names of the folders above, and a checkout in a
    # folder named `slow` would put every test in the slow tier.
    is_slow = any(item.get_closest_marker(marker) for marker in SLOW_MARKERS)
    (kept if is_slow == want_slow else deselected).append(item)
  if deselected:
    config.hook.pytest_deselected(items=deselected)
    items[:] = kept
