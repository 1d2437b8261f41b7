"""A full disk during a checkpoint: the workdir on a real small file system (tmpfs, mounted by
the test; root only) fills up while a checkpoint after the first is written. The run stops with
an error that names the step, the directory and the newest complete checkpoint; once space is
freed the same command resumes from that checkpoint and ends exactly as an uninterrupted run."""
import os
import re
import subprocess

import pytest

from tests import demo_runs
OVERRIDES = ["--config.num_train_steps=8", "--config.keep_checkpoints=10",
             "--config.eval_every_steps=8"]


def _demo(workdir):
  return demo_runs.run(workdir, *OVERRIDES)


def _kib(path):
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
             for f in files) // 1024 + 1


@pytest.fixture
def small_disk(tmp_path):
  if os.geteuid() != 0:
    pytest.skip("mounting a small tmpfs needs root")
  mount_point = tmp_path / "disk"
  mount_point.mkdir()

  def mount(kib, remount=False):
    options = f"{'remount,' if remount else ''}size={kib}k"
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode:
      pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")

  yield mount_point, mount
  subprocess.run(["umount", str(mount_point)], capture_output=True)


def test_a_full_disk_stops_the_run_and_the_same_command_resumes(small_disk, tmp_path):
  reference = str(tmp_path / "reference")
  assert _demo(reference).returncode == 0
  checkpoints = os.path.join(reference, "checkpoints")
  # Room for the data, the metrics and two checkpoints (and half of one more), not a third.
  one = _kib(os.path.join(checkpoints, "4"))
  room = _kib(os.path.join(reference, "data")) + _kib(os.path.join(checkpoints, "2")) + one * 3 // 2
  mount_point, mount = small_disk
  mount(room)
  workdir = str(mount_point / "run")

  failed = _demo(workdir)
  assert failed.returncode != 0
  assert "CheckpointWriteError" in failed.stderr and "the disk is full" in failed.stderr
  # Which save meets the full disk depends on a few KiB of metadata: the message names it.
  newest = re.search(r"the checkpoint at step (\d+) is the newest complete one", failed.stderr)
  assert newest and newest.group(1) in ("2", "4"), failed.stderr[-2000:]
  assert os.path.join(workdir, "checkpoints") in failed.stderr
  assert newest.group(1) in os.listdir(os.path.join(workdir, "checkpoints"))

  mount(room * 4, remount=True)   # space freed
  resumed = _demo(workdir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resumed from the checkpoint at step {newest.group(1)}" in resumed.stdout
  assert demo_runs.untimed_metrics(workdir) == demo_runs.untimed_metrics(reference)
