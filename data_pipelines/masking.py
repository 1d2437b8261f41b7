"""Masked-LM masking (spec section 2): THE one implementation, shared by the static record writer
(`create_pretraining_data --masking=static`) and the tf.data reader (dynamic masking).

Candidates are the real positions except [CLS] and [SEP] (padding, [CLS] and [SEP] are never
chosen). Candidate *words* (a piece plus its continuation pieces with whole-word masking,
otherwise every piece alone) are chosen in one of two ways (`MaskingConfig.selection`):
  * "count" (BERT's, the default): per sequence, num_to_predict = min(max_predictions_per_seq,
    max(1, round(len * masked_lm_prob))) with len the number of real tokens ([CLS]/[SEP]
    counted). Words are visited in random order and taken whole while they fit the budget; a word
    that would overflow is skipped and later, smaller words may still fit, as in the original.
  * "bernoulli" (ModernBERT's training): every candidate word is chosen on its own with
    probability masked_lm_prob (with whole-word masking a word's pieces are chosen or left
    together, so a piece's rate is still masked_lm_prob), so the count varies from row to row
    and can be 0. The max_predictions_per_seq slots still bound it: the chosen words are visited
    in a random order and kept while they fit, as "count" does with its budget; the rest are
    dropped (left unmasked). Size the slots well above len * masked_lm_prob and few are dropped.
Each chosen piece is replaced by [MASK] (mask_token_prob), a random id (random_token_prob) or
kept. The random id is uniform over (`MaskingConfig.random_tokens`):
  * "vocabulary" (BERT's, the default): every id of the tokenizer, [0, vocab_size);
  * "in_use": the ids of ordinary text pieces, `SpecialTokens.in_use_ids()`: the tokenizer's ids
    without its special tokens ([PAD] [UNK] [CLS] [SEP] [MASK], any other it marks special) and
    reserved entries (WordPiece's `[unusedN]`). Ids past the tokenizer's vocabulary (a model's
    vocab_size padded to a multiple of 64) are drawn by neither.
Positions come out sorted, zero-padded with weight 0.

Where ModernBERT differs: its own training code (`SequencePacker.mlm_masking`, a numpy port of
transformers' `DataCollatorForLanguageModeling`) chooses every non-padding position with
probability masked_lm_prob, [CLS] and [SEP] included (its training passes no special tokens to
leave out; AnswerDotAI/ModernBERT issue #212), predicts every chosen position (no slot bound), and
draws its random ids uniformly from [0, the largest id in the batch]. Here [CLS], [SEP] and
padding are never chosen in either mode, the slots bound the predictions, and "in_use" draws
only ordinary text pieces, from the whole tokenizer.

Everything is vectorised over the batch with TensorFlow's *stateless* random ops, so the result is
a pure function of (inputs, seed): identical eagerly and inside `tf.data`, and resumable.
Shapes: B batch, S sequence, W words (<= S), P max_predictions_per_seq, V in-use ids.
"""
import dataclasses
from typing import Dict, Tuple

import numpy as np
import tensorflow as tf

from data_pipelines import features as F

_MIXTURES = {  # appendix C.2: MASK / SAME / RND
    "80/10/10": (0.8, 0.1), "100/0/0": (1.0, 0.0), "80/0/20": (0.8, 0.2),
    "80/20/0": (0.8, 0.0), "0/20/80": (0.0, 0.8), "0/0/100": (0.0, 1.0),
}
# The options and the config field and flag each is set by (named when a value is refused).
SELECTIONS = ("count", "bernoulli")
RANDOM_TOKENS = ("vocabulary", "in_use")
_OPTION_SOURCES = {"selection": "config.data.mask_selection, --mask_selection",
                   "random_tokens": "config.data.random_token_ids, --random_token_ids"}


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  masked_lm_prob: float = 0.15
  max_predictions_per_seq: int = 20
  mask_token_prob: float = 0.8      # share of chosen pieces replaced by [MASK]
  random_token_prob: float = 0.1    # share replaced by a random id; the rest stay unchanged
  whole_word_mask: bool = False
  selection: str = "count"          # count (BERT's) | bernoulli (ModernBERT's): module docstring
  random_tokens: str = "vocabulary"  # vocabulary (BERT's) | in_use: what a random id is drawn from

  def __post_init__(self):
    for name, choices in (("selection", SELECTIONS), ("random_tokens", RANDOM_TOKENS)):
      value = getattr(self, name)
      if value not in choices:
        raise ValueError(f"MaskingConfig.{name}={value!r} ({_OPTION_SOURCES[name]}): expected "
                         f"one of {', '.join(map(repr, choices))}")
    for name in ("masked_lm_prob", "mask_token_prob", "random_token_prob"):
      value = getattr(self, name)
      if not 0.0 <= value <= 1.0:
        raise ValueError(f"MaskingConfig.{name}={value}: must be in [0, 1]")
    if self.mask_token_prob + self.random_token_prob > 1.0 + 1e-9:
      raise ValueError(f"MaskingConfig: mask_token_prob + random_token_prob = "
                       f"{self.mask_token_prob + self.random_token_prob} > 1")
    if self.max_predictions_per_seq < 1:
      raise ValueError("MaskingConfig.max_predictions_per_seq must be >= 1")

  @classmethod
  def from_mixture(cls, name: str, **kwargs) -> "MaskingConfig":
    """An appendix C.2 mixture 'MASK/SAME/RND' (e.g. '80/10/10', '100/0/0')."""
    if name in _MIXTURES:
      mask, rnd = _MIXTURES[name]
    else:
      try:
        mask_pct, same_pct, rnd_pct = (float(x) for x in name.split("/"))
      except ValueError:
        raise ValueError(f"mask mixture {name!r}: expected 'MASK/SAME/RND' percentages such as "
                         "'80/10/10'") from None
      if abs(mask_pct + same_pct + rnd_pct - 100) > 1e-6:
        raise ValueError(f"mask mixture {name!r}: percentages must add up to 100")
      mask, rnd = mask_pct / 100, rnd_pct / 100
    return cls(mask_token_prob=mask, random_token_prob=rnd, **kwargs)


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
  """The tokenizer's ids the masking needs. vocab_size is the tokenizer's (random ids are drawn
  below it), not the model's, which may be padded past it."""
  cls_id: int
  sep_id: int
  pad_id: int
  mask_id: int
  vocab_size: int
  # Ids that are not ordinary text pieces (the tokenizer's `special_ids`: its special tokens and
  # reserved entries), left out of "in_use" random ids; [CLS], [SEP], [PAD] and [MASK] always are.
  special_ids: Tuple[int, ...] = ()

  @classmethod
  def from_tokenizer(cls, tokenizer) -> "SpecialTokens":
    return cls(cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id,
               mask_id=tokenizer.mask_id, vocab_size=tokenizer.vocab_size,
               special_ids=tuple(tokenizer.special_ids))

  def in_use_ids(self) -> np.ndarray:
    """What `random_tokens="in_use"` draws from: [0, vocab_size) without `special_ids`, [CLS],
    [SEP], [PAD] and [MASK]; sorted int32 [V]."""
    left_out = list(self.special_ids) + [self.cls_id, self.sep_id, self.pad_id, self.mask_id]
    ids = np.setdiff1d(np.arange(self.vocab_size, dtype=np.int32), np.array(left_out, np.int32))
    if not len(ids):
      raise ValueError(f"random_tokens='in_use': the vocabulary of {self.vocab_size} ids has "
                       "nothing but special tokens")
    return ids


def _choose_words(word_keys, word_sizes, budget):
  """Greedy over words in key order: take a word if it fits what is left of the budget.

  word_keys, word_sizes: [B, W]; budget: [B]. Returns take: [B, W] bool.
  """
  order = tf.argsort(word_keys, axis=1)                                  # [B, W]
  sizes_in_order = tf.gather(word_sizes, order, batch_dims=1)            # [B, W]

  def visit(used, size):                                                 # used, size: [B]
    fits = used + size <= budget
    return tf.where(fits, used + size, used)

  used_after = tf.scan(visit, tf.transpose(sizes_in_order),
                       initializer=tf.zeros_like(budget))                # [W, B]
  used_before = tf.concat([tf.zeros_like(used_after[:1]), used_after[:-1]], axis=0)
  taken_in_order = tf.transpose((used_after > used_before))              # [B, W]
  inverse = tf.argsort(order, axis=1)
  return tf.gather(taken_in_order, inverse, batch_dims=1)                # [B, W]


def _word_sizes(word_id, num_words):
  """Pieces per word: word_id [B, S] (num_words = not in a word) -> [B, num_words].

  A per-row histogram (bincount over row-offset ids), instead of summing a [B, S, W] one-hot.
  """
  batch = tf.shape(word_id)[0]
  offsets = tf.range(batch)[:, None] * (num_words + 1)                   # [B, 1]
  counts = tf.math.bincount(tf.reshape(word_id + offsets, [-1]),
                            minlength=batch * (num_words + 1),
                            maxlength=batch * (num_words + 1), dtype=tf.int32)
  return tf.reshape(counts, [batch, num_words + 1])[:, :num_words]


def mask_batch(input_ids, input_mask, is_word_continuation, *, config: MaskingConfig,
               special: SpecialTokens, seed) -> Dict[str, tf.Tensor]:
  """Masks a batch. input_ids, input_mask, is_word_continuation: int [B, S]; seed: int [2].

  Returns the original feature names: input_ids (masked) [B, S], masked_lm_positions [B, P],
  masked_lm_ids [B, P] (the original ids), masked_lm_weights float32 [B, P].
  """
  ids = tf.convert_to_tensor(input_ids)
  out_dtype = ids.dtype
  ids = tf.cast(ids, tf.int32)                                           # [B, S]
  real = tf.cast(input_mask, tf.bool)                                    # [B, S]
  continuation = tf.cast(is_word_continuation, tf.bool)
  seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)
  batch, seq_len = tf.shape(ids)[0], tf.shape(ids)[1]

  candidate = real & tf.not_equal(ids, special.cls_id) & tf.not_equal(ids, special.sep_id)
  previous_candidate = tf.pad(candidate[:, :-1], [[0, 0], [1, 0]])
  joins_previous = continuation & previous_candidate if config.whole_word_mask else tf.zeros_like(
      candidate)
  word_start = candidate & ~joins_previous                               # [B, S]
  word_id = tf.cumsum(tf.cast(word_start, tf.int32), axis=1) - 1         # [B, S]
  word_id = tf.where(candidate, word_id, seq_len)  # non-candidates: an out-of-range word
  word_sizes = _word_sizes(word_id, seq_len)                             # [B, W]
  word_keys = tf.random.stateless_uniform([batch, seq_len], seeds[0])  # [B, W]
  eligible = word_sizes > 0                                              # [B, W]
  if config.selection == "bernoulli":
    # A word is chosen when its key is below masked_lm_prob. The chosen words' keys are then
    # uniform below it, so key order visits them in a random order: the greedy passes below keep
    # the first that fit the P slots and drop the rest.
    eligible &= word_keys < config.masked_lm_prob
    budget = tf.fill([batch], config.max_predictions_per_seq)            # [B]
  else:
    length = tf.reduce_sum(tf.cast(real, tf.int32), axis=1)              # [B]
    # Python's round() (half to even) like the original; tf.round rounds half to even too.
    budget = tf.cast(tf.round(tf.cast(length, tf.float64) * config.masked_lm_prob), tf.int32)
    budget = tf.minimum(config.max_predictions_per_seq, tf.maximum(1, budget))  # [B]
  word_keys = tf.where(eligible, word_keys, 2.0)  # missing (or not chosen) words last
  if config.whole_word_mask:
    # A word left out has size 0 here, which the greedy pass never takes ("count": only the
    # missing words, whose size is 0 anyway).
    take = _choose_words(word_keys, tf.where(eligible, word_sizes, 0), budget)  # [B, W]
  else:
    # Every word is one piece, so the greedy pass takes exactly the first `budget` words in key
    # order: the same choice as `_choose_words` without its sequential scan over W. top_k of the
    # negated keys lists words in tf.argsort's order (equal keys: lower index first).
    k = tf.minimum(config.max_predictions_per_seq, seq_len)
    first = tf.math.top_k(-word_keys, k=k).indices                       # [B, k]
    within = tf.cast(tf.range(k)[None, :] < budget[:, None], tf.int32)   # [B, k]
    # Scattered (top_k's indices are distinct within a row), not reduced from a [B, k, W]
    # one-hot: that is 40 MB per row at S=8192 with P=1229, terabytes for a builder chunk.
    rows = tf.broadcast_to(tf.range(batch)[:, None], tf.shape(first))    # [B, k]
    take = tf.scatter_nd(tf.stack([rows, first], axis=-1), within,
                         tf.stack([batch, seq_len])) > 0                 # [B, W]
    take &= eligible
  chosen = candidate & tf.gather(tf.pad(take, [[0, 0], [0, 1]]), word_id, batch_dims=1)

  # 80/10/10 (configurable) per chosen piece.
  decide = tf.random.stateless_uniform([batch, seq_len], seeds[1])
  if config.random_tokens == "in_use":
    in_use = tf.constant(special.in_use_ids())                           # [V]
    random_ids = tf.gather(in_use, tf.random.stateless_uniform(
        [batch, seq_len], seeds[2], minval=0, maxval=len(in_use), dtype=tf.int32))  # [B, S]
  else:
    random_ids = tf.random.stateless_uniform([batch, seq_len], seeds[2], minval=0,
                                             maxval=special.vocab_size, dtype=tf.int32)
  replaced = tf.where(decide < config.mask_token_prob, special.mask_id,
                      tf.where(decide < config.mask_token_prob + config.random_token_prob,
                               random_ids, ids))
  masked_ids = tf.where(chosen, replaced, ids)

  # Sorted positions, padded: chosen positions first (ascending), then the rest. The P smallest
  # keys come from top_k of the negated keys, cheaper than a full sort of the row.
  positions_all = tf.range(seq_len)[None, :] + tf.zeros_like(ids)
  sort_key = tf.where(chosen, positions_all, positions_all + seq_len)
  order = -tf.math.top_k(-sort_key, k=tf.minimum(config.max_predictions_per_seq,
                                                 seq_len)).values        # [B, <=P]
  valid = order < seq_len
  positions = tf.where(valid, order, 0)
  pad = config.max_predictions_per_seq - tf.shape(positions)[1]  # when S < P
  positions = tf.pad(positions, [[0, 0], [0, pad]])
  valid = tf.pad(valid, [[0, 0], [0, pad]])
  original = tf.where(valid, tf.gather(ids, positions, batch_dims=1), 0)
  return {
      F.INPUT_IDS: tf.cast(masked_ids, out_dtype),
      F.MASKED_LM_POSITIONS: tf.cast(positions, out_dtype),
      F.MASKED_LM_IDS: tf.cast(original, out_dtype),
      F.MASKED_LM_WEIGHTS: tf.cast(valid, tf.float32),
  }


def mask_example(input_ids, input_mask, is_word_continuation, *, config, special, seed):
  """One [S] example: a thin wrapper over `mask_batch` (there is no second implementation)."""
  out = mask_batch(tf.expand_dims(input_ids, 0), tf.expand_dims(input_mask, 0),
                   tf.expand_dims(is_word_continuation, 0), config=config, special=special,
                   seed=seed)
  return {k: v[0] for k, v in out.items()}
