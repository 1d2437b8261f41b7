"""Test-wide settings: CPU only, fast compiles, no accelerator for TensorFlow."""
import os

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


# Fault tests that wait out a timeout or kill at a chosen moment (minutes of wall time, several
# runs each) run only when asked: `python -m pytest --long-faults tests/faults`.
LONG_FAULTS = "--long-faults"


def pytest_addoption(parser):
  parser.addoption(LONG_FAULTS, action="store_true", default=False,
                   help="also run the fault tests marked long_fault (minutes each)")


def pytest_configure(config):
  config.addinivalue_line("markers", f"long_fault: a fault test run only with {LONG_FAULTS}")


def pytest_collection_modifyitems(config, items):
  if config.getoption(LONG_FAULTS):
    return
  skip = pytest.mark.skip(reason=f"a long fault test (minutes): run with {LONG_FAULTS}")
  for item in items:
    if "long_fault" in item.keywords:
      item.add_marker(skip)
