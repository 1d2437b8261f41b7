"""The pre-training loop end to end: learning, exact resume after kill -9, SIGTERM, corrupt
checkpoint fallback, non-finite abort, metrics.jsonl, export of the result."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax.io import checkpoints
from bert_jax.tasks.jobs import pretraining
from bert_jax.tasks import registry
from bert_jax.runtime.metric_writers import TIMING_FIELDS, read_metrics
from tests import pretraining_fixtures as fx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _losses(workdir):
  """metrics.jsonl without the wall-clock fields: must be bitwise reproducible."""
  return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_metrics(workdir)]


def _params(workdir):
  return checkpoints.flatten(checkpoints.load_pretrained(workdir)[1])


def _main_cmd(experiment, workdir):
  return [sys.executable, "-m", "bert_jax.main", f"--config={experiment}",
          f"--workdir={workdir}"]


def _env():
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  """An uninterrupted run of 12 steps (checkpoints at 4, 8, 12)."""
  base = tmp_path_factory.mktemp("reference")
  config = fx.tiny_config(str(base / "data"))
  result = registry.run_job(config, str(base / "work"))
  return base, config, result


def test_metrics_and_checkpoints_are_written(reference_run):
  base, config, result = reference_run
  workdir = str(base / "work")
  train = read_metrics(workdir, "train")
  assert [r["step"] for r in train] == list(range(1, 13))
  for key in ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "learning_rate",
              "grad_norm", "param_norm", "sequences_per_sec", "tokens_per_sec",
              "real_tokens_per_sec"):
    assert key in train[-1], key
  evals = read_metrics(workdir, "eval")
  # Padding exists in the fixture rows, so real tokens are fewer than row positions.
  assert 0 < train[-1]["real_tokens_per_sec"] < train[-1]["tokens_per_sec"]
  assert [r["step"] for r in evals] == [6, 12]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["12", "4", "8"]
  assert os.path.isdir(os.path.join(workdir, "tensorboard"))
  assert "eval_mlm_accuracy" in result
  # The workdir is a checkpoint load_pretrained accepts (e.g. phase 2's init_checkpoint).
  config_loaded, params = checkpoints.load_pretrained(workdir)
  assert config_loaded.vocab_size == len(fx.VOCAB) and "cls" in params


def test_rerun_of_a_finished_run_changes_nothing(reference_run):
  base, config, _ = reference_run
  before = _losses(str(base / "work"))
  registry.run_job(config, str(base / "work"))
  assert _losses(str(base / "work")) == before


@pytest.mark.slow
def test_kill_9_then_restart_is_bitwise_identical(reference_run, tmp_path):
  base, _, _ = reference_run
  experiment = fx.write_experiment(str(tmp_path), str(base / "data"))
  workdir = str(tmp_path / "work")
  proc = subprocess.Popen(_main_cmd(experiment, workdir), cwd=ROOT, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  # Kill hard once the step-4 checkpoint is complete and training went past it.
  while time.time() < deadline and proc.poll() is None:
    done = os.path.isdir(os.path.join(workdir, "checkpoints", "4"))
    if done and any(r["step"] >= 6 for r in read_metrics(workdir)):
      break
    time.sleep(0.05)
  assert proc.poll() is None, "the run finished before it could be killed"
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  restart = subprocess.run(_main_cmd(experiment, workdir), cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=300)
  assert restart.returncode == 0, restart.stderr[-3000:]
  assert "Resumed from the checkpoint at step" in restart.stdout
  assert _losses(workdir) == _losses(str(base / "work"))
  ours, reference = _params(workdir), _params(str(base / "work"))
  for name, value in reference.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)


@pytest.mark.slow   # two runs of the job (SIGTERM, then the same command): over 30 s
def test_sigterm_saves_exits_0_and_the_same_command_ends_bitwise_as_the_uninterrupted_run(
    reference_run, tmp_path):
  """SIGTERM mid-run: the step is saved ("Preempted: checkpoint at step N"), exit 0; the same
  command again resumes from N and ends as the uninterrupted run: every step's losses and
  accuracies (metrics.jsonl without wall-clock fields) and the final parameters, bitwise.
  Periodic checkpoints are off here (only the preemption's), so the resume can only be from it."""
  base, _, _ = reference_run
  experiment = fx.write_experiment(str(tmp_path), str(base / "data"),
                                   **{"checkpoint_every_steps": 1000})
  workdir = str(tmp_path / "work")
  proc = subprocess.Popen(_main_cmd(experiment, workdir), cwd=ROOT, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while time.time() < deadline and not any(r["step"] >= 3 for r in read_metrics(workdir)):
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  assert "Preempted: checkpoint at step" in out
  saved = [int(s) for s in os.listdir(os.path.join(workdir, "checkpoints"))]
  assert len(saved) == 1 and 3 <= saved[0] < 12, saved
  assert max(r["step"] for r in read_metrics(workdir)) == saved[0]

  restart = subprocess.run(_main_cmd(experiment, workdir), cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=300)
  assert restart.returncode == 0, restart.stderr[-3000:]
  assert f"Resumed from the checkpoint at step {saved[0]} " in restart.stdout, \
      restart.stdout[-3000:]
  assert _losses(workdir) == _losses(str(base / "work"))
  ours, reference = _params(workdir), _params(str(base / "work"))
  assert ours.keys() == reference.keys()
  for name, value in reference.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)


@pytest.mark.slow
def test_corrupt_newest_checkpoint_falls_back_to_previous(reference_run, tmp_path, capsys):
  base, config, _ = reference_run
  import shutil
  workdir = str(tmp_path / "work")
  shutil.copytree(str(base / "work"), workdir)
  # Truncate every file of the newest checkpoint's state.
  for root, _, files in os.walk(os.path.join(workdir, "checkpoints", "12", "state")):
    for name in files:
      with open(os.path.join(root, name), "r+b") as f:
        f.truncate(max(0, os.path.getsize(os.path.join(root, name)) // 3))
  registry.run_job(config, workdir)
  assert "CHECKPOINT AT STEP 12 IS UNREADABLE" in capsys.readouterr().out
  assert os.listdir(os.path.join(workdir, "checkpoints_corrupt"))
  # Steps 9..12 were recomputed from step 8 and match the original run exactly.
  assert _losses(workdir) == _losses(str(base / "work"))


def test_non_finite_loss_aborts_after_consecutive_skips(reference_run, tmp_path):
  base, _, _ = reference_run
  config = fx.tiny_config(str(base / "data"), learning_rate=1e38, max_consecutive_skips=3,
                          warmup_steps=0, **{"optimizer.clip_grad_norm": 0.0})
  with pytest.raises(pretraining.NonFiniteLossError, match="consecutive steps"):
    registry.run_job(config, str(tmp_path / "work"))
  skipped = [r for r in read_metrics(str(tmp_path / "work")) if r.get("skipped")]
  assert skipped, "non-finite steps are logged"


def test_a_run_learns(tmp_path):
  config = fx.tiny_config(str(tmp_path / "data"), num_train_steps=150, log_every_steps=25,
                          eval_every_steps=150, checkpoint_every_steps=150,
                          learning_rate=2e-3, warmup_steps=10, global_batch_size=16)
  result = registry.run_job(config, str(tmp_path / "work"))
  # Chance is 1/45; the repeated-word structure makes masked tokens predictable.
  assert result["eval_mlm_accuracy"] > 0.8, result


@pytest.mark.slow
def test_prng_impl_switch_changes_the_random_streams(reference_run, tmp_path):
  """`--config.prng_impl=rbg` reaches JAX before any key exists: another initialisation, and the
  run still trains (rbg is the fast-compiling choice on GPU)."""
  base, _, _ = reference_run
  experiment = fx.write_experiment(str(tmp_path), str(base / "data"))
  workdir = str(tmp_path / "work")
  subprocess.run(_main_cmd(experiment, workdir) + ["--config.prng_impl=rbg",
                                                   "--config.num_train_steps=2"],
                 cwd=ROOT, env=_env(), check=True, capture_output=True, timeout=300)
  rbg = read_metrics(workdir, "train")
  threefry = read_metrics(str(base / "work"), "train")
  assert [r["step"] for r in rbg] == [1, 2]
  assert np.isfinite(rbg[-1]["loss"])
  assert rbg[0]["param_norm"] != threefry[0]["param_norm"]
