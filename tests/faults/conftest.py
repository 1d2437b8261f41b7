"""Fixtures of the fault tests: the four jobs' inputs, and one uninterrupted run of each job,
made on first use and shared by every test of a pytest process (tests leave them as found); a
small real disk that fills up."""
import os
import subprocess

import pytest

from tests.faults import job_runs


@pytest.fixture(scope="session")
def jobs(tmp_path_factory):
  return job_runs.JobRuns(str(tmp_path_factory.mktemp("jobs")))


@pytest.fixture(scope="session")
def reference(jobs):
  """reference(job) -> (its workdir, `job_runs.outcome` of it)."""
  runs = {}

  def get(job):
    if job not in runs:
      workdir = os.path.join(jobs.root, f"{job}-reference")
      result = jobs.run(job, workdir)
      assert result.returncode == 0, result.stderr[-3000:]
      runs[job] = workdir, job_runs.outcome(job, workdir)
    return runs[job]

  return get


# Set by .ci/run: CI runs as root, so a full-disk test that cannot mount its tmpfs there fails
# with the reason instead of skipping (a skip would let CI pass without them).
REQUIRE_FULL_DISK = "BERT_JAX_REQUIRE_FULL_DISK_TESTS"


def _cannot(reason: str):
  if os.environ.get(REQUIRE_FULL_DISK) == "1":
    pytest.fail(f"{reason} ({REQUIRE_FULL_DISK}=1: the full-disk tests must run here)",
                pytrace=False)
  pytest.skip(reason)


@pytest.fixture
def small_disk(tmp_path):
  """(mount point, mount(kib, remount=False)): a real tmpfs of `kib` KiB, mounted by the test
  (root only); `remount=True` resizes it in place, files kept: larger frees space, smaller (not
  below what is in use) fills the disk from outside while a job runs."""
  if os.geteuid() != 0:
    _cannot("mounting a small tmpfs needs root")
  mount_point = tmp_path / "disk"
  mount_point.mkdir()

  def mount(kib, remount=False):
    options = f"{'remount,' if remount else ''}size={kib}k"
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode:
      _cannot(f"cannot mount a tmpfs here: {result.stderr.strip()}")

  yield mount_point, mount
  subprocess.run(["umount", str(mount_point)], capture_output=True)

