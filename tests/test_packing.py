"""Packed rows (several NSP pairs per row) give the same losses as the unpacked pairs."""
import jax
import numpy as np

from bert_jax.tasks.jobs import pretraining
from data_pipelines import packing
from tests.test_train_step import synthetic_batch, tiny_config


def _short_pairs(count, seq=16, seed=0):
  """Unpacked instances no longer than seq // 2 + 2, each with its own masks and NSP label."""
  batch = synthetic_batch(seed, batch=count)
  rng = np.random.RandomState(seed)
  examples = []
  for i in range(count):
    length = rng.randint(5, seq // 2 + 2)
    ex = {k: np.array(v[i]) for k, v in batch.items()}
    ex["input_mask"] = (np.arange(seq) < length).astype(np.int32)
    ex["input_ids"] = ex["input_ids"] * ex["input_mask"] + (1 - ex["input_mask"]) * 0
    ex["input_ids"][:length] = np.maximum(ex["input_ids"][:length], 5)
    ex["segment_ids"] = ((np.arange(seq) >= length // 2) & (np.arange(seq) < length)).astype(
        np.int32)
    positions = np.sort(rng.choice(np.arange(1, length - 1), 2, replace=False))
    ex["masked_lm_positions"] = np.array([*positions, 0, 0], np.int32)
    ex["masked_lm_weights"] = np.array([1, 1, 0, 0], np.float32)
    examples.append(ex)
  return examples


def test_packing_layout():
  examples = _short_pairs(8)
  rows = packing.pack_examples(examples, 16, max_pairs_per_row=3, max_predictions_per_row=4)
  assert len(rows) < len(examples)
  packed_pairs = sum(int(r["nsp_weights"].sum()) for r in rows)
  assert packed_pairs == len(examples)
  for row in rows:
    k = int(row["nsp_weights"].sum())
    assert set(np.unique(row["sequence_ids"])) - {0} == set(range(1, k + 1))
    for slot in range(k):
      start = row["cls_positions"][slot]
      assert row["position_ids"][start] == 0 and row["sequence_ids"][start] == slot + 1


def test_packed_and_unpacked_losses_are_equal():
  config = tiny_config(objective="mlm_nsp")
  model = pretraining.build_model(config)
  params = pretraining.create_train_state(
      config, model, pretraining.optim.create_optimizer(config, 10)[0],
      jax.random.PRNGKey(0)).params
  examples = _short_pairs(8)
  unpacked = packing.stack(examples)
  rows = packing.stack(packing.pack_examples(examples, 16, 3, 4))
  ref = pretraining.loss_terms(model, params, unpacked, "mlm_nsp")
  got = pretraining.loss_terms(model, params, rows, "mlm_nsp")
  for key in ("mlm_nll", "mlm_weight", "nsp_nll", "nsp_weight", "mlm_correct", "nsp_correct"):
    np.testing.assert_allclose(float(got[key]), float(ref[key]), rtol=2e-5, err_msg=key)
  ref_loss, _ = pretraining.loss_from_terms(ref)
  got_loss, _ = pretraining.loss_from_terms(got)
  np.testing.assert_allclose(float(got_loss), float(ref_loss), rtol=2e-5)
