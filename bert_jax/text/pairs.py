"""The one `[CLS] A [SEP] B [SEP]` encoder and pair truncation, for every input BERT reads.

Pre-training instances (`data_pipelines.create_pretraining_data`), fine-tuning features
(`encode_pairs`, by the GLUE and SWAG features) and feature extraction (`bert_jax.extract_features`) all build
their rows here, so the layout (segment 0 for `[CLS] A [SEP]`, segment 1 for `B [SEP]`) and the
original's truncation rules live in one place.
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
              sep: T) -> Tuple[List[T], List[int]]:
  """(`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, segment ids: 0 up to the first [SEP], then 1)."""
  tokens = [cls] + list(tokens_a) + [sep]
  segments = [0] * len(tokens)
  if tokens_b is not None:
    tokens += list(tokens_b) + [sep]
    segments += [1] * (len(tokens_b) + 1)
  return tokens, segments


def fit_pair(tokens_a: List[T], tokens_b: Optional[List[T]],
             max_seq_length: int) -> Tuple[List[T], Optional[List[T]]]:
  """A and B truncated as the original classifier does: the pair to `max_seq_length - 3`
  (three special tokens), a single segment to `max_seq_length - 2`."""
  if tokens_b:
    truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
    return tokens_a, tokens_b
  return tokens_a[:max_seq_length - 2], None


def encode_pairs(tokenizer, texts_a: Sequence[str], texts_b: Optional[Sequence[Optional[str]]],
                 max_seq_length: int) -> Dict[str, np.ndarray]:
  """Texts -> input_ids, input_mask, segment_ids [N, S] (int32, zero-padded), truncated by
  `fit_pair`."""
  n = len(texts_a)
  ids_a = tokenizer.encode_batch(list(texts_a))
  has_b = texts_b is not None and any(t is not None for t in texts_b)
  ids_b = tokenizer.encode_batch([t or "" for t in texts_b]) if has_b else [[]] * n
  arrays = {name: np.zeros((n, max_seq_length), np.int32)                     # [N, S]
            for name in ("input_ids", "input_mask", "segment_ids")}
  for i in range(n):
    a, b = fit_pair(list(ids_a[i]), list(ids_b[i]), max_seq_length)
    row, segments = join_pair(a, b, tokenizer.cls_id, tokenizer.sep_id)
    arrays["input_ids"][i, :len(row)] = row
    arrays["segment_ids"][i, :len(row)] = segments
    arrays["input_mask"][i, :len(row)] = 1
  return arrays
