"""Statistics and invariants of THE masking implementation (data_pipelines/masking.py), directly
and through the tf.data training pipeline that uses it for dynamic masking."""
import numpy as np
import pytest
import tensorflow as tf

from data_pipelines import features as F
from data_pipelines import input_pipeline
from data_pipelines import masking as M
from tests import pretraining_fixtures as fx

SPECIAL = M.SpecialTokens(cls_id=2, sep_id=3, pad_id=0, mask_id=4, vocab_size=1000)
SEQ, ROWS = 128, 3000


def _random_batch(seed=0, rows=ROWS, seq=SEQ, continuation_rate=0.0):
  """[CLS] A [SEP] B [SEP] rows of random lengths with ids >= 10 (never special)."""
  rng = np.random.RandomState(seed)
  ids = np.zeros((rows, seq), np.int64)
  mask = np.zeros((rows, seq), np.int64)
  cont = np.zeros((rows, seq), np.int64)
  for r in range(rows):
    length = rng.randint(8, seq + 1)
    len_a = rng.randint(1, length - 3 + 1 - 1)
    row = rng.randint(10, SPECIAL.vocab_size, size=length)
    row[0], row[len_a + 1], row[length - 1] = SPECIAL.cls_id, SPECIAL.sep_id, SPECIAL.sep_id
    ids[r, :length], mask[r, :length] = row, 1
    if continuation_rate:
      candidates = (row != SPECIAL.cls_id) & (row != SPECIAL.sep_id)
      prev_candidate = np.concatenate([[False], candidates[:-1]])
      cont[r, :length] = (rng.rand(length) < continuation_rate) & candidates & prev_candidate
  return ids, mask, cont


def _mask(ids, mask, cont, seed=(1, 2), **config):
  config = M.MaskingConfig(**dict(dict(max_predictions_per_seq=20), **config))
  out = M.mask_batch(ids, mask, cont, config=config, special=SPECIAL, seed=tf.constant(seed,
                                                                                      tf.int64))
  return {k: v.numpy() for k, v in out.items()}


def _check_invariants(ids, mask, out, max_predictions):
  positions, weights = out[F.MASKED_LM_POSITIONS], out[F.MASKED_LM_WEIGHTS]
  assert positions.shape == (len(ids), max_predictions)
  for r in range(len(ids)):
    real = positions[r][weights[r] > 0]
    assert list(real) == sorted(set(real)), "sorted, no duplicates"
    assert np.all(positions[r][weights[r] == 0] == 0), "padding positions are 0"
    assert np.all(out[F.MASKED_LM_IDS][r][weights[r] == 0] == 0)
    assert np.all(weights[r][:len(real)] == 1.0) and np.all(weights[r][len(real):] == 0.0)
    assert np.all(mask[r, real] == 1), "only real tokens"
    assert not np.isin(ids[r, real], [SPECIAL.cls_id, SPECIAL.sep_id]).any(), "never CLS/SEP"
    np.testing.assert_array_equal(out[F.MASKED_LM_IDS][r][:len(real)], ids[r, real])
    unchosen = np.ones(ids.shape[1], bool)
    unchosen[real] = False
    np.testing.assert_array_equal(out[F.INPUT_IDS][r][unchosen], ids[r][unchosen])


def test_budget_rate_and_80_10_10():
  ids, mask, cont = _random_batch()
  out = _mask(ids, mask, cont)
  _check_invariants(ids, mask, out, 20)
  lengths = mask.sum(1)
  expected = np.minimum(20, np.maximum(1, np.round(lengths * 0.15))).astype(int)
  # Every piece is its own word, so the budget is always filled exactly.
  np.testing.assert_array_equal(out[F.MASKED_LM_WEIGHTS].sum(1).astype(int), expected)

  chosen = out[F.MASKED_LM_WEIGHTS] > 0
  pos = out[F.MASKED_LM_POSITIONS]
  new = np.take_along_axis(out[F.INPUT_IDS], pos, 1)[chosen]
  original = out[F.MASKED_LM_IDS][chosen]
  n = chosen.sum()
  as_mask = np.mean(new == SPECIAL.mask_id)
  kept = np.mean(new == original)
  random_token = 1 - as_mask - kept
  # 3 binomial standard deviations at n ~ 50k.
  tol = 3 * np.sqrt(0.1 * 0.9 / n)
  assert abs(as_mask - 0.8) < 3 * np.sqrt(0.16 / n), as_mask
  # A random id equals the original with probability 1/vocab, which counts as "kept".
  assert abs(kept - (0.1 + 0.1 / SPECIAL.vocab_size)) < tol, kept
  assert abs(random_token - 0.1) < tol, random_token
  # Random replacements are spread over the vocabulary.
  replaced = new[(new != SPECIAL.mask_id) & (new != original)]
  assert len(np.unique(replaced)) > 0.8 * min(len(replaced), SPECIAL.vocab_size - 10)


def test_positions_are_uniform_over_the_sequence():
  ids, mask, cont = _random_batch(seed=3)
  ids[:, :], mask[:, :] = 100, 1  # full rows, every position but the ends is a candidate
  ids[:, 0], ids[:, -1] = SPECIAL.cls_id, SPECIAL.sep_id
  out = _mask(ids, mask, cont)
  counts = np.bincount(out[F.MASKED_LM_POSITIONS][out[F.MASKED_LM_WEIGHTS] > 0],
                       minlength=SEQ)[1:-1]
  expected = counts.sum() / len(counts)
  chi2 = np.sum((counts - expected) ** 2 / expected)
  assert chi2 < len(counts) + 5 * np.sqrt(2 * len(counts)), chi2  # df ~ 125


@pytest.mark.parametrize("mixture,mask_share,same_share", [("100/0/0", 1.0, 0.0),
                                                            ("80/20/0", 0.8, 0.2),
                                                            ("0/0/100", 0.0, 0.0)])
def test_appendix_c2_mixtures(mixture, mask_share, same_share):
  ids, mask, cont = _random_batch(seed=4, rows=800)
  config = M.MaskingConfig.from_mixture(mixture, max_predictions_per_seq=20)
  out = {k: v.numpy() for k, v in M.mask_batch(ids, mask, cont, config=config, special=SPECIAL,
                                                seed=tf.constant([5, 6], tf.int64)).items()}
  chosen = out[F.MASKED_LM_WEIGHTS] > 0
  new = np.take_along_axis(out[F.INPUT_IDS], out[F.MASKED_LM_POSITIONS], 1)[chosen]
  original = out[F.MASKED_LM_IDS][chosen]
  assert abs(np.mean(new == SPECIAL.mask_id) - mask_share) < 0.02
  assert abs(np.mean(new == original) - same_share) < 0.02 + 1 / SPECIAL.vocab_size


def test_bad_mixtures_are_refused():
  with pytest.raises(ValueError, match="add up to 100"):
    M.MaskingConfig.from_mixture("80/10/20")
  with pytest.raises(ValueError, match="MASK/SAME/RND"):
    M.MaskingConfig.from_mixture("eighty")


def test_whole_word_masking_keeps_words_whole():
  ids, mask, cont = _random_batch(seed=7, rows=1500, continuation_rate=0.5)
  out = _mask(ids, mask, cont, whole_word_mask=True)
  _check_invariants(ids, mask, out, 20)
  lengths = mask.sum(1)
  budget = np.minimum(20, np.maximum(1, np.round(lengths * 0.15)))
  counts = out[F.MASKED_LM_WEIGHTS].sum(1)
  assert np.all(counts <= budget)
  assert np.mean(counts) > 0.9 * np.mean(budget), "words that fit are still taken"
  for r in range(len(ids)):
    chosen = np.zeros(SEQ, bool)
    chosen[out[F.MASKED_LM_POSITIONS][r][out[F.MASKED_LM_WEIGHTS][r] > 0]] = True
    # A continuation piece is chosen exactly when the piece before it is.
    joins = cont[r].astype(bool)
    np.testing.assert_array_equal(chosen[1:][joins[1:]], chosen[:-1][joins[1:]])


def test_masking_is_a_pure_function_of_the_seed():
  ids, mask, cont = _random_batch(seed=8, rows=64)
  a, b = _mask(ids, mask, cont, seed=(1, 1)), _mask(ids, mask, cont, seed=(1, 1))
  c = _mask(ids, mask, cont, seed=(1, 2))
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(a[F.MASKED_LM_POSITIONS], c[F.MASKED_LM_POSITIONS])
  one = M.mask_example(ids[0], mask[0], cont[0], config=M.MaskingConfig(), special=SPECIAL,
                       seed=tf.constant([1, 1], tf.int64))
  assert one[F.MASKED_LM_POSITIONS].shape == (20,)


def test_tf_data_pipeline_masks_dynamically(tmp_path):
  """The training pipeline: same statistics, fresh masks per read, deterministic per seed."""
  vocab, train, _ = fx.make_data(str(tmp_path), train_count=256)
  special = M.SpecialTokens(cls_id=fx.VOCAB.index("[CLS]"), sep_id=fx.VOCAB.index("[SEP]"),
                            pad_id=0, mask_id=fx.VOCAB.index("[MASK]"), vocab_size=len(fx.VOCAB))

  def batches(seed):
    dataset = input_pipeline.create_pretraining_dataset(
        train, global_batch_size=32, max_seq_length=fx.SEQ, max_predictions_per_seq=5,
        masking=M.MaskingConfig(max_predictions_per_seq=5), special=special, seed=seed,
        process_index=0, process_count=1, shuffle_buffer_size=64)
    return [dict((k, v.numpy()) for k, v in b.items()) for b in dataset.take(24)]

  first, again, other = batches(0), batches(0), batches(1)
  for a, b in zip(first, again):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  assert any(not np.array_equal(a[F.INPUT_IDS], b[F.INPUT_IDS]) for a, b in zip(first, other))
  total = chosen_mask = 0
  for batch in first:
    assert batch[F.INPUT_IDS].shape == (32, fx.SEQ) and batch[F.INPUT_IDS].dtype == np.int32
    assert F.IS_WORD_CONTINUATION not in batch
    lengths = batch[F.INPUT_MASK].sum(1)
    expected = np.minimum(5, np.maximum(1, np.round(lengths * 0.15)))
    np.testing.assert_array_equal(batch[F.MASKED_LM_WEIGHTS].sum(1), expected)
    chosen = batch[F.MASKED_LM_WEIGHTS] > 0
    new = np.take_along_axis(batch[F.INPUT_IDS], batch[F.MASKED_LM_POSITIONS], 1)[chosen]
    chosen_mask += np.sum(new == special.mask_id)
    total += chosen.sum()
  assert abs(chosen_mask / total - 0.8) < 0.05
  # A record read again in a later epoch gets a different mask (dynamic masking).
  seen = {}
  for batch in first:
    for r in range(32):
      original = batch[F.INPUT_IDS][r].copy()
      real = batch[F.MASKED_LM_WEIGHTS][r] > 0
      original[batch[F.MASKED_LM_POSITIONS][r][real]] = batch[F.MASKED_LM_IDS][r][real]
      seen.setdefault(original.tobytes(), set()).add(batch[F.MASKED_LM_POSITIONS][r].tobytes())
  repeated = [masks for masks in seen.values() if len(masks) > 1]
  assert len(repeated) > 0.5 * len(seen), "re-read records are masked afresh"
