"""The newest checkpoint damaged on disk, every kind, against the checkpointer every job resumes
with (`io.training_checkpoints`; each job end to end:
test_kill_during_checkpoint_and_evaluation.py).

A damaged step is never resumed with other numbers: it is set aside to `checkpoints_corrupt/`
with a message naming it, and the one before it is restored exactly (with none before it, the run
starts from the beginning). Bytes changed inside the array files decode without any error from
Orbax or TensorStore: the checkpoint's fingerprints of its arrays are what catch them. A commit
marker missing from a local checkpoint (the rename is the commit there) leaves it usable. Only
damage that the checkpoint's own files prove is set aside (errors that prove nothing, and
checkpoints of another model: tests/faults/test_restore_errors.py).
"""
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.io import training_checkpoints
from bert_jax.runtime.state import TrainState
from tests.faults import damage


def _files(step_dir, name):
  return [os.path.join(d, f) for d, _, files in os.walk(step_dir) for f in files if f == name]


def _empty_files(step_dir):
  for d, _, files in os.walk(step_dir):
    for name in files:
      open(os.path.join(d, name), "w").close()


def _a_data_file_missing(step_dir):
  data_files = sorted(os.path.join(d, f) for d, _, files in os.walk(step_dir) for f in files
                      if os.path.basename(d) == "d")
  os.remove(data_files[0])


def _state_missing(step_dir):
  shutil.rmtree(os.path.join(step_dir, "state"))


def _metadata_garbage(step_dir):
  for path in _files(step_dir, "_METADATA"):
    with open(path, "w") as f:
      f.write("{not json")


def _data_files_truncated(step_dir):
  """The array data files alone cut to a third, their index whole (TensorStore: OUT_OF_RANGE,
  a byte range past the end of the file)."""
  data_dir = os.path.join(step_dir, "state", "d")
  for name in os.listdir(data_dir):
    path = os.path.join(data_dir, name)
    os.truncate(path, os.path.getsize(path) // 3)


def _record_garbage(step_dir):
  """The checkpoint's record (format, arrays, model) unparseable."""
  with open(os.path.join(step_dir, "record", "metadata"), "w") as f:
    f.write('{"format_version": 1, "arr')


KINDS = dict(damage.KINDS, empty_files=_empty_files, a_data_file_missing=_a_data_file_missing,
             state_missing=_state_missing, metadata_garbage=_metadata_garbage,
             data_files_truncated=_data_files_truncated, record_garbage=_record_garbage)


def _state(seed):
  rng = np.random.default_rng(seed)
  params = {"dense": {"kernel": jnp.asarray(rng.normal(size=(64, 32)), jnp.float32),
                      "bias": jnp.asarray(rng.normal(size=(32,)), jnp.float32)},
            "embedding": jnp.asarray(rng.normal(size=(100, 16)), jnp.bfloat16)}
  return TrainState.create(params, optax.adam(1e-3)).replace(step=jnp.int32(seed))


def _saved(workdir, steps):
  checkpointer = training_checkpoints.TrainingCheckpointer(workdir, keep=5, async_save=False)
  for step in steps:
    checkpointer.save(step, _state(step), train_seconds=float(step))
  checkpointer.close()


def _restore(workdir):
  checkpointer = training_checkpoints.TrainingCheckpointer(workdir, keep=5, async_save=False)
  abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(0))
  try:
    return checkpointer.restore_latest(abstract)
  finally:
    checkpointer.close()


def _assert_equal(state, expected):
  for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_newest_checkpoint_damaged(kind, tmp_path, capsys):
  workdir = str(tmp_path)
  _saved(workdir, [1, 2])
  step_dir = os.path.join(workdir, "checkpoints", "2")
  KINDS[kind](step_dir)
  step, state = _restore(workdir)
  if kind == "no_commit_marker":
    assert step == 2
    _assert_equal(state, _state(2))
    return
  assert step == 1, f"the damaged checkpoint was taken for a good one ({kind})"
  _assert_equal(state, _state(1))
  out = capsys.readouterr().out
  assert "CHECKPOINT AT STEP 2 IS UNREADABLE" in out
  assert "falling back to the previous checkpoint (step 1)" in out
  assert not os.path.exists(step_dir)
  assert os.listdir(os.path.join(workdir, "checkpoints_corrupt"))


def test_changed_bytes_in_a_state_of_many_arrays_are_set_aside(tmp_path, capsys):
  """With some twenty arrays and more OCDBT compresses its b-tree nodes: changed bytes then fail
  to decompress (TensorStore's "Error decoding b-tree node: ZSTD_decompressStream() failed",
  which carries no status code), where the small state's fail their checksum (DATA_LOSS)."""
  rng = np.random.default_rng(0)
  params = {f"layer_{i}": {"kernel": jnp.asarray(rng.normal(size=(16, 16)), jnp.float32),
                           "bias": jnp.asarray(rng.normal(size=(16,)), jnp.float32)}
            for i in range(20)}
  state = TrainState.create(params, optax.adam(1e-3))
  checkpointer = training_checkpoints.TrainingCheckpointer(str(tmp_path), async_save=False)
  for step in (1, 2):
    checkpointer.save(step, state.replace(step=jnp.int32(step)))
  checkpointer.close()
  damage.bytes_changed_throughout(str(tmp_path / "checkpoints" / "2"))
  checkpointer = training_checkpoints.TrainingCheckpointer(str(tmp_path), async_save=False)
  abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  step, restored = checkpointer.restore_latest(abstract)
  checkpointer.close()
  assert step == 1
  _assert_equal(restored, state.replace(step=jnp.int32(1)))
  out = capsys.readouterr().out
  assert "CHECKPOINT AT STEP 2 IS UNREADABLE" in out and "Error decoding" in out
  assert os.listdir(tmp_path / "checkpoints_corrupt")


def test_changed_bytes_are_named_and_the_only_checkpoint_means_starting_over(tmp_path, capsys):
  workdir = str(tmp_path)
  _saved(workdir, [3])
  damage.bytes_changed(os.path.join(workdir, "checkpoints", "3"))
  # Read directly (fine-tuning or export from a training workdir): a clear error naming it.
  checkpointer = training_checkpoints.TrainingCheckpointer(workdir, async_save=False)
  with pytest.raises(training_checkpoints.CheckpointDamagedError,
                     match=r"arrays read from .*checkpoints/3/state differ from what was saved"):
    checkpointer.restore_params(3)
  checkpointer.close()
  # Resumed: set aside, and with no checkpoint before it the run starts over.
  assert _restore(workdir) == (None, None)
  assert "there is no earlier checkpoint: the run starts from the beginning" in (
      capsys.readouterr().out)


def test_fingerprints_of_host_and_device_arrays_agree_and_name_what_changed():
  state = _state(4)
  on_host = jax.tree_util.tree_map(np.asarray, state)
  assert training_checkpoints.fingerprints(state) == training_checkpoints.fingerprints(on_host)
  changed = state.replace(params=dict(state.params, embedding=state.params["embedding"].at[
      3, 5].set(7)))
  differ = [k for k, v in training_checkpoints.fingerprints(changed).items()
            if training_checkpoints.fingerprints(state)[k] != v]
  assert differ == ["params/embedding"]
