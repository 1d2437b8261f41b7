"""Fine-tuning through `python -m bert_jax.main`, interrupted as a cluster would: SIGKILL in the
middle of an epoch, then the same command again, ends bitwise where an uninterrupted run ends
(losses, parameters, dev predictions); SIGTERM saves a checkpoint and exits 0, and the same
command then ends bitwise as well."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax import tasks
from bert_jax.io import checkpoints
from bert_jax.runtime.metric_writers import TIMING_FIELDS, read_metrics
from experiments import glue as glue_experiment
from tests import finetuning_fixtures as fx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_EXAMPLES, BATCH = 48, 4          # 12 steps per epoch, 2 epochs
STEPS_PER_EPOCH = TRAIN_EXAMPLES // BATCH
OVERRIDES = {"max_seq_length": 16, "eval_batch_size": 4, "global_batch_size": BATCH,
             "checkpoint_every_steps": 5, "log_every_steps": 1,
             "data.max_train_examples": TRAIN_EXAMPLES}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("resume")
  return dict(glue=fx.write_glue_dir(str(root / "glue"), dict(train=TRAIN_EXAMPLES, dev=10)),
              ckpt=fx.write_checkpoint(str(root / "ckpt")), root=root)


def _command(data, workdir):
  flags = [f"--config.init_checkpoint={data['ckpt']}", f"--config.data.glue_dir={data['glue']}"]
  flags += [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
  return [sys.executable, "-m", "bert_jax.main", "--config=experiments/glue.py:task=mrpc,quick",
          f"--workdir={workdir}"] + flags


def _env():
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def reference(data):
  """The uninterrupted run, in this process."""
  config = glue_experiment.get_config("task=mrpc,quick")
  config.init_checkpoint, config.data.glue_dir = data["ckpt"], data["glue"]
  for key, value in OVERRIDES.items():
    section, _, field = key.rpartition(".")
    (config[section] if section else config)[field] = value
  workdir = str(data["root"] / "reference")
  tasks.run(config, workdir)
  return workdir


def _newest_checkpoint(workdir):
  directory = os.path.join(workdir, "checkpoints")
  steps = [int(s) for s in os.listdir(directory) if s.isdigit()] if os.path.isdir(
      directory) else []
  return max(steps, default=0)


def _assert_same_run(workdir, reference):
  strip = lambda records: [{k: v for k, v in r.items() if k not in TIMING_FIELDS}
                           for r in records]
  assert strip(read_metrics(workdir)) == strip(read_metrics(reference))
  ours = checkpoints.flatten(checkpoints.load_pretrained(os.path.join(workdir, "best"))[1])
  theirs = checkpoints.flatten(checkpoints.load_pretrained(os.path.join(reference, "best"))[1])
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
  for name in ("dev_predictions.tsv", "MRPC.tsv", os.path.join("best", "head.safetensors")):
    with open(os.path.join(workdir, name), "rb") as a, open(os.path.join(reference, name),
                                                            "rb") as b:
      assert a.read() == b.read(), name
  drop = lambda r: {k: v for k, v in r.items() if k != "train_seconds"}
  load = lambda d: json.load(open(os.path.join(d, "results.json"), encoding="utf-8"))
  assert drop(load(workdir)) == drop(load(reference))


@pytest.mark.slow
def test_sigkill_mid_epoch_then_rerun_is_bitwise_identical(data, reference, tmp_path):
  workdir = str(tmp_path / "killed")
  proc = subprocess.Popen(_command(data, workdir), cwd=ROOT, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  # Kill hard once a mid-epoch checkpoint is complete and training went past it.
  while time.time() < deadline and proc.poll() is None:
    saved = _newest_checkpoint(workdir)
    if saved and saved % STEPS_PER_EPOCH and any(
        r["step"] > saved for r in read_metrics(workdir)):
      break
    time.sleep(0.02)
  assert proc.poll() is None, "the run finished before it could be killed"
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert _newest_checkpoint(workdir) < 2 * STEPS_PER_EPOCH
  restart = subprocess.run(_command(data, workdir), cwd=ROOT, env=_env(), capture_output=True,
                           text=True, timeout=300)
  assert restart.returncode == 0, restart.stderr[-3000:]
  resumed = int(restart.stdout.split("Resumed from the checkpoint at step ")[1].split()[0])
  assert resumed % STEPS_PER_EPOCH, f"resumed at step {resumed}: not in the middle of an epoch"
  _assert_same_run(workdir, reference)


@pytest.mark.slow   # two runs of the job (SIGTERM, then the same command): over 30 s
def test_sigterm_saves_exits_0_and_the_rerun_finishes_the_same(data, reference, tmp_path):
  workdir = str(tmp_path / "preempted")
  proc = subprocess.Popen(_command(data, workdir) + ["--config.checkpoint_every_steps=0"],
                          cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  deadline = time.time() + 300
  while time.time() < deadline and not any(r["step"] >= 2 for r in read_metrics(workdir)):
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    time.sleep(0.02)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  assert "Preempted: checkpoint at step" in out
  saved = _newest_checkpoint(workdir)
  assert 2 <= saved < 2 * STEPS_PER_EPOCH
  assert max(r["step"] for r in read_metrics(workdir)) == saved
  assert not os.path.exists(os.path.join(workdir, "results.json"))
  restart = subprocess.run(_command(data, workdir) + ["--config.checkpoint_every_steps=0"],
                           cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
  assert restart.returncode == 0, restart.stderr[-3000:]
  assert f"Resumed from the checkpoint at step {saved}" in restart.stdout
  # Bitwise the uninterrupted run: metrics.jsonl, best/ (encoder and head), the prediction
  # files and results.json.
  _assert_same_run(workdir, reference)
