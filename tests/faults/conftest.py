"""Fixtures of the fault tests: the four jobs' inputs, and one uninterrupted run of each job,
made on first use and shared by every test of a pytest process (tests leave them as found)."""
import os

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
