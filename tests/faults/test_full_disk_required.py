"""The full-disk tests never skip silently in CI: `.ci/run` runs the slow tier with
`BERT_JAX_REQUIRE_FULL_DISK_TESTS=1`, under which a test that cannot mount its tmpfs (not root,
no tmpfs) fails with the reason; elsewhere it skips with the reason."""
import os

import pytest

from tests.faults import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_ci_runs_the_slow_tier_with_the_full_disk_tests_required():
  with open(os.path.join(ROOT, ".ci", "run")) as f:
    lines = [line.strip() for line in f if "--tier=slow" in line and not line.startswith("#")]
  assert lines == [f"{conftest.REQUIRE_FULL_DISK}=1 python -m pytest -n 2 tests --tier=slow"]


def test_a_full_disk_test_that_cannot_mount_fails_where_required_and_skips_elsewhere(
    monkeypatch):
  monkeypatch.setenv(conftest.REQUIRE_FULL_DISK, "1")
  with pytest.raises(pytest.fail.Exception, match="needs root .*must run here"):
    conftest._cannot("mounting a small tmpfs needs root")
  monkeypatch.delenv(conftest.REQUIRE_FULL_DISK)
  with pytest.raises(pytest.skip.Exception, match="needs root"):
    conftest._cannot("mounting a small tmpfs needs root")
