"""kill -9 while the demo builds its records into WORKDIR/data (half-written files, no DONE
marker): the same command builds them again from the start and ends exactly as an uninterrupted
run."""
import os
import signal
import subprocess
import time

import pytest

from tests import demo_runs


@pytest.mark.slow
def test_kill_9_during_data_preparation_then_rerun(tmp_path):
  reference, workdir = str(tmp_path / "reference"), str(tmp_path / "killed")
  assert demo_runs.run(reference).returncode == 0
  process = subprocess.Popen(demo_runs.command(workdir), cwd=demo_runs.ROOT, env=demo_runs.env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  data = os.path.join(workdir, "data")
  deadline = time.time() + 300
  # Killed once the corpus is written and the vocabulary or records are under way.
  while time.time() < deadline and not os.path.exists(os.path.join(data, "train.txt")):
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait(timeout=60)
  assert not os.path.exists(os.path.join(data, "DONE")), "killed too late: data was complete"
  assert not os.path.exists(os.path.join(workdir, "checkpoints"))

  rerun = demo_runs.run(workdir)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  for name in ("train.txt", "vocab.txt", "train.tfrecord", "eval.tfrecord"):
    with open(os.path.join(data, name), "rb") as a, \
        open(os.path.join(reference, "data", name), "rb") as b:
      assert a.read() == b.read(), name
  assert demo_runs.untimed_metrics(workdir) == demo_runs.untimed_metrics(reference)
