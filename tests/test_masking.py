"""Statistics and invariants of THE masking implementation (data_pipelines/masking.py), directly
and through the tf.data training pipeline that uses it for dynamic masking."""
import hashlib

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


# ------------------------------------------------------------------- the options and their defaults

# The defaults' output before the options existed (data_pipelines/masking.py at f7b3f4f): 4 rows
# of 24, 30% at most 5 predictions, seed (7, 9), 80/10/10 (so random ids appear: 414, 244, 409).
GOLDEN_IDS = {
    False: [[2, 279, 342, 4, 593, 860, 802, 4, 4, 698, 775, 426, 4, 246, 647, 910, 556, 150, 4, 3,
             47, 511, 241, 3],
            [2, 931, 895, 100, 3, 414, 283, 3] + [0] * 16,
            [2, 4, 234, 94, 3, 4, 453, 503, 850, 48, 4, 4, 244, 896, 809, 766, 640, 878, 3, 0,
             0, 0, 0, 0],
            [2, 955, 218, 895, 225, 4, 4, 4, 516, 896, 4, 142, 3, 428, 166, 353, 4, 251, 991, 182,
             235, 957, 3, 0]],
    True: [[2, 4, 342, 4, 593, 860, 802, 631, 614, 698, 775, 426, 823, 246, 4, 409, 556, 150, 907,
            3, 47, 511, 4, 3],
           [2, 931, 895, 100, 3, 414, 283, 3] + [0] * 16,
           [2, 4, 4, 4, 3, 348, 453, 503, 850, 48, 945, 556, 129, 896, 809, 766, 640, 4, 3, 0, 0,
            0, 0, 0],
           [2, 955, 218, 895, 225, 565, 150, 4, 4, 4, 4, 142, 3, 428, 166, 353, 539, 251, 991, 182,
            235, 957, 3, 0]],
}
GOLDEN_POSITIONS = {
    False: [[3, 7, 8, 12, 18], [2, 5, 0, 0, 0], [1, 5, 10, 11, 12], [5, 6, 7, 10, 16]],
    True: [[1, 3, 14, 15, 22], [2, 5, 0, 0, 0], [1, 2, 3, 17, 0], [7, 8, 9, 10, 11]],
}
# sha256 of every output (sorted by name) on 200 rows of 128, seed (3, 4), 15%, 20 predictions.
GOLDEN_SHA256 = {
    False: "933e6d9219d5ad78b4fe864aea318de2383efe66ab34443674af092d4fa14ec4",
    True: "4cae349cf41dcccc98e423cd5d0ce7980463fca4d1382b8afdebb9054a0b5c0e",
}


@pytest.mark.parametrize("whole_word_mask", [False, True])
@pytest.mark.parametrize("explicit", [False, True])
def test_the_defaults_mask_bit_for_bit_as_before(whole_word_mask, explicit):
  """count / vocabulary (BERT's) are the defaults, and they give what the masking gave before
  the options existed."""
  options = dict(selection="count", random_tokens="vocabulary") if explicit else {}
  ids, mask, cont = _random_batch(seed=11, rows=4, seq=24, continuation_rate=0.5)
  out = _mask(ids, mask, cont, seed=(7, 9), max_predictions_per_seq=5, masked_lm_prob=0.3,
              whole_word_mask=whole_word_mask, **options)
  np.testing.assert_array_equal(out[F.INPUT_IDS], GOLDEN_IDS[whole_word_mask])
  np.testing.assert_array_equal(out[F.MASKED_LM_POSITIONS], GOLDEN_POSITIONS[whole_word_mask])

  ids, mask, cont = _random_batch(seed=12, rows=200, continuation_rate=0.3)
  out = _mask(ids, mask, cont, seed=(3, 4), whole_word_mask=whole_word_mask, **options)
  digest = hashlib.sha256()
  for name in sorted(out):
    digest.update(np.ascontiguousarray(out[name]).tobytes())
  assert digest.hexdigest() == GOLDEN_SHA256[whole_word_mask]


def _full_rows(rows, seed=0):
  """Rows of SEQ real tokens (ids >= 10), [CLS] first and [SEP] last: every row has the same
  SEQ - 2 candidates."""
  ids, mask, cont = _random_batch(seed=seed, rows=rows)
  ids[:, :], mask[:, :] = np.random.RandomState(seed).randint(10, SPECIAL.vocab_size,
                                                              size=ids.shape), 1
  ids[:, 0], ids[:, -1] = SPECIAL.cls_id, SPECIAL.sep_id
  return ids, mask, cont


def test_bernoulli_chooses_each_candidate_with_the_probability():
  ids, mask, cont = _random_batch(seed=9)
  # Slots for every position: nothing is dropped, so the rate is masked_lm_prob exactly.
  out = _mask(ids, mask, cont, selection="bernoulli", max_predictions_per_seq=SEQ)
  _check_invariants(ids, mask, out, SEQ)   # never [CLS], [SEP] or padding
  counts = out[F.MASKED_LM_WEIGHTS].sum(1)
  candidates = (mask.sum(1) - 3).sum()     # [CLS] A [SEP] B [SEP]
  n = candidates
  assert abs(counts.sum() / candidates - 0.15) < 4 * np.sqrt(0.15 * 0.85 / n), counts.sum() / n

  # Rows of one length get different counts (binomial), unlike "count"'s one budget per length.
  ids, mask, cont = _full_rows(rows=400, seed=10)
  counts = _mask(ids, mask, cont, selection="bernoulli", max_predictions_per_seq=SEQ,
                 masked_lm_prob=0.1)[F.MASKED_LM_WEIGHTS].sum(1)
  assert counts.std() > 0.8 * np.sqrt((SEQ - 2) * 0.1 * 0.9), counts.std()
  assert len(np.unique(counts)) > 8
  same = _mask(ids, mask, cont, masked_lm_prob=0.1, max_predictions_per_seq=SEQ)
  assert len(np.unique(same[F.MASKED_LM_WEIGHTS].sum(1))) == 1


def test_bernoulli_keeps_at_most_the_slots_dropping_at_random():
  ids, mask, cont = _full_rows(rows=1000, seed=13)
  # 30% of 126 candidates is 38 on average: most rows choose more than the 20 slots.
  out = _mask(ids, mask, cont, selection="bernoulli", masked_lm_prob=0.3)
  _check_invariants(ids, mask, out, 20)
  counts = out[F.MASKED_LM_WEIGHTS].sum(1)
  assert counts.max() == 20 and np.mean(counts == 20) > 0.99
  # The positions kept are a random subset of those chosen, not the first ones in the row.
  kept = out[F.MASKED_LM_POSITIONS][out[F.MASKED_LM_WEIGHTS] > 0]
  assert abs(kept.mean() - (SEQ - 1) / 2) < 1.0, kept.mean()
  assert np.bincount(kept, minlength=SEQ)[1:-1].min() > 0


def test_bernoulli_with_whole_words_chooses_words():
  ids, mask, cont = _random_batch(seed=14, rows=1500, continuation_rate=0.5)
  out = _mask(ids, mask, cont, selection="bernoulli", whole_word_mask=True,
              max_predictions_per_seq=SEQ)
  _check_invariants(ids, mask, out, SEQ)
  chosen_pieces = 0
  for r in range(len(ids)):
    chosen = np.zeros(SEQ, bool)
    chosen[out[F.MASKED_LM_POSITIONS][r][out[F.MASKED_LM_WEIGHTS][r] > 0]] = True
    joins = cont[r].astype(bool)
    np.testing.assert_array_equal(chosen[1:][joins[1:]], chosen[:-1][joins[1:]])
    chosen_pieces += chosen.sum()
  # Each word with probability 0.15, so each piece too (words of ~2 pieces: a wider tolerance).
  assert abs(chosen_pieces / (mask.sum(1) - 3).sum() - 0.15) < 0.01
  # A word that no longer fits the slots is dropped whole.
  out = _mask(ids, mask, cont, selection="bernoulli", whole_word_mask=True, masked_lm_prob=0.5,
              max_predictions_per_seq=5)
  _check_invariants(ids, mask, out, 5)


def test_in_use_random_ids_are_never_special_or_reserved():
  reserved = (1, 5, 6, 7, 8, 9) + tuple(range(990, 1000))  # [UNK], [unusedN], ... say
  special = M.SpecialTokens(cls_id=2, sep_id=3, pad_id=0, mask_id=4, vocab_size=1000,
                            special_ids=reserved)
  left_out = set(reserved) | {0, 2, 3, 4}
  assert set(special.in_use_ids()) == set(range(1000)) - left_out
  ids, mask, cont = _random_batch(seed=15)

  def replacements(random_tokens):
    config = M.MaskingConfig.from_mixture("0/0/100", random_tokens=random_tokens)
    out = {k: v.numpy() for k, v in M.mask_batch(ids, mask, cont, config=config, special=special,
                                                  seed=tf.constant([5, 6], tf.int64)).items()}
    _check_invariants(ids, mask, out, 20)
    chosen = out[F.MASKED_LM_WEIGHTS] > 0
    return np.take_along_axis(out[F.INPUT_IDS], out[F.MASKED_LM_POSITIONS], 1)[chosen]

  new = replacements("in_use")
  assert len(new) > 20_000 and not set(new) & left_out
  assert len(np.unique(new)) == 1000 - len(left_out), "every id in use is drawn"
  # The whole vocabulary (the default) does draw them.
  assert set(replacements("vocabulary")) & left_out


def test_special_ids_of_each_tokenizer(tmp_path):
  """What each tokenizer reports as special (left out of in-use random ids): its special tokens
  and reserved [unusedN] entries, never an ordinary piece."""
  from bert_jax.text import tokenization
  from data_pipelines import build_vocab
  words = ["hello", "world", "##s", "un", "##used"]
  vocab = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
  (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
  wordpiece = tokenization.FullTokenizer(str(tmp_path / "vocab.txt"))
  assert wordpiece.special_ids == list(range(7))
  special = M.SpecialTokens.from_tokenizer(wordpiece)
  assert list(special.in_use_ids()) == list(range(7, len(vocab)))

  corpus = tmp_path / "corpus.txt"
  rng = np.random.RandomState(0)
  corpus.write_text("\n".join(" ".join("".join(rng.choice(list("abcdefgh"), rng.randint(2, 6)))
                                       for _ in range(8)) for _ in range(300)) + "\n")
  bpe = tokenization.HuggingFaceTokenizer(build_vocab.train_bpe(
      [str(corpus)], str(tmp_path / "tokenizer.json"), vocab_size=300, min_frequency=1,
      num_unused=2))
  spm = tokenization.SentencePieceTokenizer(build_vocab.train_sentencepiece(
      [str(corpus)], str(tmp_path / "spm"), vocab_size=40, num_unused=2))
  for tok in (bpe, spm):
    names = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]"]
    assert tok.special_ids == sorted(tok.vocab[n] for n in names), tok.convert_ids_to_tokens(
        tok.special_ids)
    in_use = M.SpecialTokens.from_tokenizer(tok).in_use_ids()
    assert len(in_use) == tok.vocab_size - len(names)
    text_ids = {i for ids in tok.encode_batch(corpus.read_text().splitlines()) for i in ids}
    assert text_ids <= set(in_use)


def test_bad_options_are_refused_naming_the_field():
  with pytest.raises(ValueError, match=r"config\.data\.mask_selection.*'count', 'bernoulli'"):
    M.MaskingConfig(selection="random")
  with pytest.raises(ValueError, match=r"config\.data\.random_token_ids.*'vocabulary', 'in_use'"):
    M.MaskingConfig.from_mixture("80/10/10", random_tokens="all")
  from data_pipelines import create_pretraining_data as cpd
  with pytest.raises(ValueError, match="mask_selection='poisson'"):
    cpd.Options(mask_selection="poisson").validate()
  with pytest.raises(ValueError, match="random_token_ids='used'"):
    cpd.Options(random_token_ids="used").validate()


def test_the_config_fields_reach_the_masking(monkeypatch):
  """config.data.mask_selection / random_token_ids: BERT's by default, passed to the training
  masking (the held-out masking always counts), a bad value refused naming the field."""
  from bert_jax.tasks.jobs import pretraining
  from experiments import pretraining_defaults
  config = pretraining_defaults.get_config("tiny")
  assert (config.data.mask_selection, config.data.random_token_ids) == ("count", "vocabulary")
  config.data.mask_selection, config.data.random_token_ids = "bernoulli", "in_use"
  made = []

  class Stop(Exception):
    pass

  def create_tokenizer(**kwargs):   # the masking config is built before the tokenizer is read
    raise Stop

  from_mixture = M.MaskingConfig.from_mixture
  monkeypatch.setattr(M.MaskingConfig, "from_mixture", classmethod(
      lambda cls, *args, **kwargs: made.append(from_mixture(*args, **kwargs)) or made[-1]))
  from bert_jax.text import tokenization
  monkeypatch.setattr(tokenization, "create_tokenizer", create_tokenizer)
  for training in (True, False):
    with pytest.raises(Stop):
      pretraining.input_pipeline_for(config, training=training)
  assert [(m.selection, m.random_tokens) for m in made] == [("bernoulli", "in_use"),
                                                             ("count", "in_use")]
  monkeypatch.undo()
  config.data.mask_selection = "bernouli"
  with pytest.raises(ValueError, match=r"'bernouli' \(config\.data\.mask_selection"):
    pretraining.input_pipeline_for(config, training=True)


def test_the_record_writer_takes_the_options(tmp_path):
  from bert_jax.text import tokenization
  from data_pipelines import create_pretraining_data as cpd
  tokenizer = tokenization.FullTokenizer(fx.write_vocab(str(tmp_path)), do_lower_case=False)
  builder = cpd.BlockBuilder(tokenizer, cpd.Options(), num_buckets=1)
  assert (builder.masking_config.selection, builder.masking_config.random_tokens) == (
      "count", "vocabulary")
  builder = cpd.BlockBuilder(tokenizer, cpd.Options(mask_selection="bernoulli",
                                                    random_token_ids="in_use"), num_buckets=1)
  assert (builder.masking_config.selection, builder.masking_config.random_tokens) == (
      "bernoulli", "in_use")
  assert builder.special.special_ids == (0, 1, 2, 3, 4)   # the fixture's [PAD] .. [MASK]
