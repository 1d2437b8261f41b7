"""Length buckets: cutting a batch's token axis to its longest row instead of max_seq_length.

Padding positions change no real token's output (attention gives them zero weight), so a batch
can run at the smallest multiple of `bucket` holding its longest row: at most
max_seq_length / bucket shapes are ever compiled. Used by the fine-tuning loop
(`config.length_bucket`) and `bert_jax.extract_features --length_bucket`.
"""
import numpy as np


def row_lengths(input_mask: np.ndarray) -> np.ndarray:
  """Real tokens of each row [rows] of `input_mask` [rows, (C,) S] (for multiple choice, the
  longest choice)."""
  return input_mask.reshape(input_mask.shape[0], -1, input_mask.shape[-1]).sum(-1).max(-1)


def bucket_length(lengths: np.ndarray, bucket: int, max_length: int) -> int:
  """The token-axis length a batch of rows with these `lengths` is cut to: the smallest
  multiple of `bucket` holding the longest, at most `max_length`; `bucket` 0: `max_length`."""
  if not bucket:
    return max_length
  longest = max(int(np.max(lengths, initial=1)), 1)
  return min(max_length, -(-longest // bucket) * bucket)
