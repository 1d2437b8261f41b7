"""The training checkpointer leaves the jax preemption service to the training loop."""
import logging
import threading

import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from bert_jax.io import training_checkpoints as tc


def test_only_the_training_loop_asks_the_preemption_service(tmp_path, monkeypatch):
  """Orbax's manager would ask too (its save, and its finalize thread with the saved step);
  the service agrees on a step from the last one each host passed it, so those calls could
  move the agreed step behind a host. The loop's own calls (`pretraining._Preemption`) stay."""
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
