"""kill -9 while the demo builds its records into WORKDIR/data (half-written files, no DONE
marker): the same command builds them again from the start and ends exactly as an uninterrupted
run."""
import os
import signal
import subprocess
import sys
import time

from bert_jax.runtime.metric_writers import TIMING_FIELDS, read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _command(workdir):
  return [sys.executable, "-m", "bert_jax.main", "--config=experiments/pretrain_demo.py:quick",
          f"--workdir={workdir}"]


def _env():
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")


def _untimed(workdir):
  return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_metrics(workdir)]


def test_kill_9_during_data_preparation_then_rerun(tmp_path):
  reference, workdir = str(tmp_path / "reference"), str(tmp_path / "killed")
  subprocess.run(_command(reference), cwd=ROOT, env=_env(), check=True, capture_output=True,
                 timeout=600)
  process = subprocess.Popen(_command(workdir), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  data = os.path.join(workdir, "data")
  deadline = time.time() + 300
  # Killed once the corpus is written and the vocabulary or records are under way.
  while time.time() < deadline and not os.path.exists(os.path.join(data, "train.txt")):
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait(timeout=60)
  assert not os.path.exists(os.path.join(data, "DONE")), "killed too late: data was complete"
  assert not os.path.exists(os.path.join(workdir, "checkpoints"))

  rerun = subprocess.run(_command(workdir), cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=600)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  for name in ("train.txt", "vocab.txt", "train.tfrecord", "eval.tfrecord"):
    with open(os.path.join(data, name), "rb") as a, \
        open(os.path.join(reference, "data", name), "rb") as b:
      assert a.read() == b.read(), name
  assert _untimed(workdir) == _untimed(reference)
