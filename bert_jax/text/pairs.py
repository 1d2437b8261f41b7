"""The one `[CLS] A [SEP] B [SEP]` encoder and pair truncation, for every input BERT reads.

Pre-training instances (`data_pipelines.create_pretraining_data`), fine-tuning features
(`encode_pairs`, by the GLUE and SWAG features) and feature extraction (`bert_jax.extract_features`) all build
their rows here, so the layout (segment 0 for `[CLS] A [SEP]`, segment 1 for `B [SEP]`) and the
original's truncation rules live in one place.

RoBERTa and XLM-R join a pair with two separators, `<s> A </s></s> B </s>`: `separators=2`, which
`encode_pairs` takes from the tokenizer's `pair_separators` (2 when its tokenizer.json's
post-processor says so). The segment ids stay 0 for `<s> A </s>` and 1 for `</s> B </s>`
(RoBERTa's own are all 0: the model family decides whether to use them).
"""
import random
from typing import Dict, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

T = TypeVar("T")   # a token: a WordPiece string or an id


def truncate_seq_pair(tokens_a: List[T], tokens_b: List[T], max_num_tokens: int,
                      rng: Optional[random.Random] = None) -> int:
  """Trims the longer list (B on a tie) in place until the pair fits; returns the tokens cut.

  Without `rng` from the end (the original's classifier and feature extraction); with `rng`
  from a random end each time (the original's pre-training data, to add noise).
  """
  removed = 0
  while len(tokens_a) + len(tokens_b) > max_num_tokens:
    longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    if rng is not None and rng.random() < 0.5:
      del longer[0]
    else:
      longer.pop()
    removed += 1
  return removed


def join_pair(tokens_a: Sequence[T], tokens_b: Optional[Sequence[T]], cls: T,
              sep: T, separators: int = 1) -> Tuple[List[T], List[int]]:
  """(`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, segment ids: 0 up to the first [SEP], then 1).

  `separators` copies of `sep` between A and B (2: RoBERTa's `<s> A </s></s> B </s>`)."""
  tokens = [cls] + list(tokens_a) + [sep]
  segments = [0] * len(tokens)
  if tokens_b is not None:
    tokens += [sep] * (separators - 1) + list(tokens_b) + [sep]
    segments += [1] * (separators - 1 + len(tokens_b) + 1)
  return tokens, segments


def fit_pair(tokens_a: List[T], tokens_b: Optional[List[T]], max_seq_length: int,
             separators: int = 1) -> Tuple[List[T], Optional[List[T]]]:
  """A and B truncated as the original classifier does: the pair to `max_seq_length - 3`
  (three special tokens; `max_seq_length - 2 - separators` in general), a single segment to
  `max_seq_length - 2`."""
  if tokens_b:
    truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 2 - separators)
    return tokens_a, tokens_b
  return tokens_a[:max_seq_length - 2], None


def encode_pairs(tokenizer, texts_a: Sequence[str], texts_b: Optional[Sequence[Optional[str]]],
                 max_seq_length: int) -> Dict[str, np.ndarray]:
  """Texts -> input_ids, input_mask, segment_ids [N, S] (int32), truncated by `fit_pair`; ids
  padded with the tokenizer's `pad_id` (what `transformers` pads with, and what RoBERTa's
  position ids are counted from), mask and segments with 0. A tokenizer with `pair_separators`
  > 1 (RoBERTa, XLM-R) joins pairs with that many separators."""
  separators = getattr(tokenizer, "pair_separators", 1)
  pad_id = tokenizer.pad_id
  n = len(texts_a)
  ids_a = tokenizer.encode_batch(list(texts_a))
  has_b = texts_b is not None and any(t is not None for t in texts_b)
  ids_b = tokenizer.encode_batch([t or "" for t in texts_b]) if has_b else [[]] * n
  arrays = {name: np.zeros((n, max_seq_length), np.int32)                     # [N, S]
            for name in ("input_ids", "input_mask", "segment_ids")}
  if pad_id:
    arrays["input_ids"][:] = pad_id
  for i in range(n):
    a, b = fit_pair(list(ids_a[i]), list(ids_b[i]), max_seq_length, separators)
    row, segments = join_pair(a, b, tokenizer.cls_id, tokenizer.sep_id, separators)
    arrays["input_ids"][i, :len(row)] = row
    arrays["segment_ids"][i, :len(row)] = segments
    arrays["input_mask"][i, :len(row)] = 1
  return arrays
