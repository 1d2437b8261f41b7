"""The training checkpointer: it leaves the jax preemption service to the training loop; what it
records with each checkpoint (format, arrays, model) and how a restore error is told apart
(another model, a newer format: named, nothing moved); a NaN state is never written; the
workdir's bert_config.json is kept unless the architecture is the same. (Damaged checkpoints:
tests/faults/test_damaged_checkpoint.py; storage and resource errors at restore and whole runs:
tests/faults/test_restore_errors.py.)"""
import errno
import json
import logging
import os
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from jax.experimental import multihost_utils

from bert_jax.io import training_checkpoints as tc
from bert_jax import families
from bert_jax.model import layers
from bert_jax.model.config import BertConfig
from tests.faults import damage


def test_only_the_training_loop_asks_the_preemption_service(tmp_path, monkeypatch):
  """Orbax's manager would ask too (its save, and its finalize thread with the saved step);
  the service agrees on a step from the last one each host passed it, so those calls could
  move the agreed step behind a host. The loop's own calls (`runtime.preemption.Preemption`)
  stay."""
  calls = []

  def record(step):
    calls.append((step, threading.current_thread().name))
    return False

  monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point", record)
  checkpointer = tc.TrainingCheckpointer(str(tmp_path), keep=2, async_save=True)
  for step in (1, 2, 3):
    checkpointer.save(step, {"w": jnp.full((3,), float(step))}, force=True)
  checkpointer.close()
  assert calls == []
  assert checkpointer.latest_step() == 3


def test_restore_params_reads_the_saved_tree_without_orbax_warnings(tmp_path, caplog):
  """Fine-tuning and export read a workdir's parameters in this process's topology; reading the
  saved tree's shapes must not send orbax looking for step metadata inside the item folder."""
  checkpointer = tc.TrainingCheckpointer(str(tmp_path), async_save=False)
  state = {"params": {"w": jnp.arange(6.0).reshape(2, 3)}, "step": jnp.asarray(7)}
  checkpointer.save(7, state, force=True)
  with caplog.at_level(logging.WARNING):
    params = checkpointer.restore_params(7)
  checkpointer.close()
  np.testing.assert_array_equal(params["w"], np.arange(6.0).reshape(2, 3))
  assert not [r for r in caplog.records if "Metadata file does not exist" in r.getMessage()]


# ------------------------------------------------------------------ restore errors (issue 41)


def _model(**overrides):
  """A one-layer pre-training model and a state of its parameters' shapes (random values: only
  shapes are traced, nothing compiled); the model's config is what a checkpoint records of it."""
  config = BertConfig.named("tiny", vocab_size=64, max_position_embeddings=16,
                            num_hidden_layers=1, **overrides)
  model = families.of(config).pretraining_model(config, use_nsp=True)
  shapes = jax.eval_shape(lambda: layers.init_params(model, jax.random.PRNGKey(0)))
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.normal(size=s.shape), s.dtype), shapes)
  return model, {"params": params, "step": jnp.int32(5)}


def _abstract(state):
  return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)


def _save(workdir, state, model=None, step=5):
  """A checkpoint as a job writes it: the checkpointer first restores (none here), which gives it
  the model it records."""
  checkpointer = tc.TrainingCheckpointer(workdir, async_save=False)
  assert checkpointer.restore_latest(_abstract(state), model=model) == (None, None)
  checkpointer.save(step, state, train_seconds=2.0)
  checkpointer.close()


def _restore(workdir, state, model=None):
  checkpointer = tc.TrainingCheckpointer(workdir, async_save=False)
  try:
    return checkpointer.restore_latest(_abstract(state), model=model)
  finally:
    checkpointer.close()




def test_a_checkpoint_of_another_model_names_what_differs_and_stays(tmp_path):
  workdir = str(tmp_path)
  model, state = _model()
  _save(workdir, state, model)
  before = damage.contents(workdir)
  wider, wider_state = _model(hidden_size=256, num_attention_heads=4, intermediate_size=1024)
  with pytest.raises(tc.CheckpointMismatchError) as error:
    _restore(workdir, wider_state, wider)
  message = str(error.value)
  assert "hidden_size: 128 -> 256" in message and "intermediate_size: 512 -> 1024" in message
  assert "num_attention_heads: 2 -> 4" in message
  assert re.search(r"params/bert/\S+ \(\d+, 128\) -> \(\d+, 256\)", message), message
  assert "Nothing was moved" in message
  # Another activation: the same arrays, another function of them.
  relu, relu_state = _model(hidden_act="relu")
  with pytest.raises(tc.CheckpointMismatchError, match="hidden_act: 'gelu' -> 'relu'"):
    _restore(workdir, relu_state, relu)
  assert damage.contents(workdir) == before
  assert not os.path.exists(os.path.join(workdir, "checkpoints_corrupt"))
  # How it is computed may change: another dtype, attention kind, kernels, dropout.
  runtime, _ = _model(dtype="bfloat16", attention="xla", kernels="textbook", remat=True,
                      hidden_dropout_prob=0.0)
  step, restored = _restore(workdir, state, runtime)
  assert step == 5
  np.testing.assert_array_equal(restored["params"]["bert"]["pooler"]["dense"]["kernel"],
                                state["params"]["bert"]["pooler"]["dense"]["kernel"])


def test_a_checkpoint_written_before_records_restores_and_is_compared(tmp_path):
  """The layout of the checkpoints written before the `record` item: state, fingerprints and
  clock (Orbax's own manager, as the checkpointer then called it)."""
  state = {"params": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}, "step": jnp.int32(4)}
  manager = ocp.CheckpointManager(epath.Path(tmp_path / "checkpoints"),
                                  item_names=("state", "data", "clock", "fingerprints"))
  manager.save(4, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), fingerprints=ocp.args.JsonSave(tc.fingerprints(state)),
      clock=ocp.args.JsonSave({"train_seconds": 3.5})))
  manager.wait_until_finished()
  manager.close()
  assert not (tmp_path / "checkpoints" / "4" / "record").exists()
  checkpointer = tc.TrainingCheckpointer(str(tmp_path), async_save=False)
  step, restored = checkpointer.restore_latest(_abstract(state))
  checkpointer.close()
  assert step == 4 and checkpointer.restored_clock == 3.5
  np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
  # Compared through Orbax's own metadata of the arrays.
  before = damage.contents(str(tmp_path))
  other = {"params": {"w": jnp.zeros((3, 3)), "b": jnp.ones(3), "c": jnp.ones(1)},
           "step": jnp.int32(0)}
  with pytest.raises(tc.CheckpointMismatchError,
                     match=r"params/w \(2, 3\) -> \(3, 3\)[\s\S]*only in this run's state: "
                           r"params/c"):
    _restore(str(tmp_path), other)
  assert damage.contents(str(tmp_path)) == before


def test_a_checkpoint_of_a_newer_format_is_refused_by_name(tmp_path):
  workdir = str(tmp_path)
  _, state = _model()
  _save(workdir, state)
  record = tmp_path / "checkpoints" / "5" / "record" / "metadata"
  saved = json.loads(record.read_text())
  assert saved["format_version"] == tc.FORMAT_VERSION
  assert saved["arrays"]["params/bert/pooler/dense/kernel"] == [[128, 128], "float32"]
  record.write_text(json.dumps(dict(saved, format_version=tc.FORMAT_VERSION + 1,
                                    written_by="bert_jax 9.0")))
  before = damage.contents(workdir)
  with pytest.raises(tc.CheckpointFormatError,
                     match=rf"written by bert_jax 9.0 in checkpoint format "
                           rf"{tc.FORMAT_VERSION + 1}; .* reads formats up to "
                           rf"{tc.FORMAT_VERSION}"):
    _restore(workdir, state)
  checkpointer = tc.TrainingCheckpointer(workdir, async_save=False)
  with pytest.raises(tc.CheckpointFormatError):   # fine-tuning or export from this workdir
    checkpointer.restore_params(5)
  checkpointer.close()
  assert damage.contents(workdir) == before


@pytest.mark.parametrize("kind", ["bytes_changed_throughout", "truncated"])
def test_a_checkpoint_that_does_not_read_back_keeps_the_older_one(tmp_path, kind):
  """keep=1, asynchronous saves: step 2 written whole by Orbax, then damaged before the
  read-back (as a store that accepted it and lost or changed it): the read-back names step 2,
  and step 1, the newest verified one, is not deleted."""
  state = {"params": {"w": jnp.arange(4096.0).reshape(64, 64)}, "step": jnp.int32(1)}
  checkpointer = tc.TrainingCheckpointer(str(tmp_path), keep=1, async_save=True)
  checkpointer.save(1, state, force=True)
  checkpointer.wait()
  checkpointer.save(2, dict(state, step=jnp.int32(2)), force=True)
  checkpointer._manager.wait_until_finished()   # written, not yet read back  # pylint: disable=protected-access
  damage.apply(kind, str(tmp_path / "checkpoints" / "2"))
  with pytest.raises(tc.CheckpointWriteError,
                     match=r"checkpoint at step 2 .* did not read back whole .* No older "
                           r"checkpoint was deleted: the newest verified checkpoint, step 1, is "
                           r"kept"):
    checkpointer.wait()
  checkpointer.close(verify=False)
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]


def test_a_state_with_nan_or_inf_is_never_written(tmp_path):
  """The good checkpoint stays the newest: a NaN state would push it out of the last `keep`."""
  workdir = str(tmp_path)
  state = {"params": {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}, "opt": {"mu": jnp.ones(3)},
           "step": jnp.int32(1), "key": jax.random.key(0)}
  checkpointer = tc.TrainingCheckpointer(workdir, keep=1, async_save=True)
  checkpointer.save(1, state)
  checkpointer.wait()
  bad = dict(state, params={"w": state["params"]["w"].at[2, 1].set(jnp.nan), "b": jnp.zeros(3)},
             opt={"mu": jnp.full(3, jnp.inf)}, step=jnp.int32(2))
  with pytest.raises(tc.NonFiniteStateError,
                     match=r"step 2 .*: 2 of 5 arrays .* NaN or infinity \(first: opt/mu, "
                           r"params/w\)\. Nothing was written and the newest checkpoint, step 1"):
    checkpointer.save(2, bad)
  checkpointer.close()
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]
  step, restored = _restore(workdir, state)
  assert step == 1
  np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])


def test_bert_config_json_is_kept_unless_the_architecture_is_the_same(tmp_path, capsys):
  workdir = str(tmp_path)
  config = BertConfig.named("tiny", vocab_size=64)
  tc.keep_model_config(config, workdir)
  path = tmp_path / tc.BERT_CONFIG
  written = path.read_text()
  assert json.loads(written)["hidden_size"] == 128
  for other in (config.replace(hidden_size=256, num_attention_heads=4),
                config.replace(layer_norm_eps=1e-6),
                BertConfig.named("tiny", vocab_size=64, architecture="modernbert",
                                 type_vocab_size=1, pad_token_id=0)):
    with pytest.raises(tc.CheckpointMismatchError) as error:
      tc.keep_model_config(other, workdir)
    assert str(path) in str(error.value) and "Nothing was changed" in str(error.value)
    assert path.read_text() == written
  assert "hidden_size: 128 -> 256" in str(
      pytest.raises(tc.CheckpointMismatchError, tc.keep_model_config,
                    config.replace(hidden_size=256, num_attention_heads=4), workdir).value)
  # Compute-only and training-only fields may change: the file records the new run's.
  faster = config.replace(dtype="bfloat16", scan_layers=True, attention="xla",
                          hidden_dropout_prob=0.0)
  tc.check_model_config(faster, workdir)   # said when checked (the run's start); not written
  assert "hidden_dropout_prob: 0.1 -> 0.0" in capsys.readouterr().out
  assert path.read_text() == written
  tc.keep_model_config(faster, workdir)   # written once the job starts
  assert json.loads(path.read_text())["dtype"] == "bfloat16"


@pytest.mark.parametrize("error, kind", [
    # What XLA and TensorStore say when memory runs out at restore, and the storage layers past
    # their retry budget: never taken for damage.
    (ValueError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.50GiB."),
     "transient"),
    (MemoryError(), "transient"),
    (ValueError("UNAVAILABLE: Error reading gs://b/run/checkpoints/9/state/d/x"), "transient"),
    (OSError(errno.EIO, "Input/output error"), "transient"),
    (ValueError("DATA_LOSS: Error reading local file: checksum mismatch"), "damaged"),
    # Bytes changed in an OCDBT file of a larger state (seen with BERT-tiny and Adam): no code.
    (ValueError('Error opening "zarr" driver: Error reading "step/.zarray" in OCDBT database: '
                "Error decoding b-tree node: ZSTD_decompressStream() failed: Data corruption "
                "detected; at byte 14"), "damaged"),
    (ValueError("OUT_OF_RANGE: Requested byte range [0, 693) is not valid for value of size 231"),
     "damaged"),
    (ValueError("NOT_FOUND: Error reading local file .../state/d/abc"), "missing"),
    (RuntimeError("something no one foresaw"), "transient"),
])
def test_what_a_restore_error_proves(error, kind):
  assert tc.restore_error_kind(error) == kind


def test_written_by_names_the_version_and_the_source_commit(tmp_path):
  """`written_by` tells two states of the code apart: the version, and in a git checkout the
  commit (`+changes` when tracked files differ from it); environment.jsonl records the same."""
  import subprocess
  from bert_jax.runtime import environment
  _, state = _model()
  _save(str(tmp_path), state)
  saved = json.loads((tmp_path / "checkpoints" / "5" / "record" / "metadata").read_text())
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if not os.path.exists(os.path.join(root, ".git")):
    assert saved["written_by"] == f"bert_jax {tc._version()}"
    return
  commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
  assert re.fullmatch(rf"bert_jax \S+ \(git {commit}(\+changes)?\)", saved["written_by"])
  assert environment.describe()["bert_jax"] == saved["written_by"]
