"""Sequence packing for pre-training that keeps NSP: several short pairs share one row.

Short pairs (10% of instances are short by design, spec section 3) waste most of a padded row.
Packing puts several `[CLS] A [SEP] B [SEP]` pairs into one row of `max_seq_length`, with

  sequence_ids    [S]  1..K for the tokens of pair k, 0 for padding -> block-diagonal attention
  position_ids    [S]  restart at 0 for every pair (each pair sees the positions it would alone)
  segment_ids     [S]  0/1 within each pair, as unpacked
  cls_positions   [K]  where each pair's [CLS] is: NSP is classified per pair from there
  next_sentence_labels, nsp_weights [K]  one label per pair, weight 0 for empty pair slots
  masked_lm_*     [P]  the pairs' predictions, positions shifted to the row

so every pair's hidden states, MLM and NSP losses equal those of the unpacked pair.

The training pipeline (data_pipelines/input_pipeline.py, `config.data.packing`) packs each window
of `PackingConfig.window` instances with `pack_batch`; this module stays free of TensorFlow.
"""
import dataclasses
from typing import Dict, List, Sequence

import jax.numpy as jnp
import numpy as np

from data_pipelines import features as F

# The names records of documents as sequences carry too (create_pretraining_data
# --instances=documents): a row of packed pairs and a row of packed documents are read alike.
SEQUENCE_IDS = F.SEQUENCE_IDS
POSITION_IDS = F.POSITION_IDS
CLS_POSITIONS = "cls_positions"
NSP_WEIGHTS = "nsp_weights"
# The features of a packed row, in the order the tf.data wrapper returns them.
ROW_FEATURES = (F.INPUT_IDS, F.INPUT_MASK, F.SEGMENT_IDS, POSITION_IDS, SEQUENCE_IDS,
                F.MASKED_LM_POSITIONS, F.MASKED_LM_IDS, F.MASKED_LM_WEIGHTS, CLS_POSITIONS,
                F.NEXT_SENTENCE_LABELS, NSP_WEIGHTS)


@dataclasses.dataclass(frozen=True)
class PackingConfig:
  """How the training pipeline packs (config.data.packing_window / max_pairs_per_row).

  A row has as many prediction slots as an unpacked sequence (max_predictions_per_seq, passed
  separately): each pair keeps the masks it would have unpacked and joins a row only while the
  row's slots hold all of them, so no prediction is ever dropped.
  """
  window: int = 256              # instances packed together (first-fit decreasing per window)
  max_pairs_per_row: int = 4     # K: NSP slots per row

  def __post_init__(self):
    if self.window < 1 or self.max_pairs_per_row < 1:
      raise ValueError(f"PackingConfig: window={self.window} and max_pairs_per_row="
                       f"{self.max_pairs_per_row} must be >= 1")


def attention_mask(batch) -> jnp.ndarray:
  """Block-diagonal [B, S, S] mask: a token attends to the tokens of its own sequence (a packed
  pair, or a document) only."""
  sequence = batch[SEQUENCE_IDS]                                              # [B, S]
  same = sequence[:, :, None] == sequence[:, None, :]                         # [B, S, S]
  return same & (sequence[:, None, :] > 0)


def _length(example) -> int:
  return int(np.sum(example[F.INPUT_MASK]))


def pack_examples(examples: Sequence[Dict[str, np.ndarray]], max_seq_length: int,
                  max_pairs_per_row: int, max_predictions_per_row: int
                  ) -> List[Dict[str, np.ndarray]]:
  """Packs (masked) instances into rows, first-fit in decreasing length order (deterministic).

  Each example has the original padded features (input_ids, input_mask, segment_ids,
  masked_lm_positions/ids/weights, next_sentence_labels). A row takes a pair only while its
  tokens, pair count and prediction count fit.
  """
  order = sorted(range(len(examples)), key=lambda i: (-_length(examples[i]), i))
  rows: List[List[int]] = []
  used_tokens: List[int] = []
  used_predictions: List[int] = []
  for index in order:
    length = _length(examples[index])
    predictions = int(np.sum(examples[index][F.MASKED_LM_WEIGHTS] > 0))
    for row, members in enumerate(rows):
      if (used_tokens[row] + length <= max_seq_length and len(members) < max_pairs_per_row
          and used_predictions[row] + predictions <= max_predictions_per_row):
        members.append(index)
        used_tokens[row] += length
        used_predictions[row] += predictions
        break
    else:
      rows.append([index])
      used_tokens.append(length)
      used_predictions.append(predictions)
  return [_build_row([examples[i] for i in sorted(members)], max_seq_length, max_pairs_per_row,
                     max_predictions_per_row) for members in rows]


def _build_row(pairs, max_seq_length, max_pairs, max_predictions) -> Dict[str, np.ndarray]:
  row = {name: np.zeros(max_seq_length, np.int32)
         for name in (F.INPUT_IDS, F.INPUT_MASK, F.SEGMENT_IDS, POSITION_IDS, SEQUENCE_IDS)}
  row.update({F.MASKED_LM_POSITIONS: np.zeros(max_predictions, np.int32),
              F.MASKED_LM_IDS: np.zeros(max_predictions, np.int32),
              F.MASKED_LM_WEIGHTS: np.zeros(max_predictions, np.float32),
              CLS_POSITIONS: np.zeros(max_pairs, np.int32),
              F.NEXT_SENTENCE_LABELS: np.zeros(max_pairs, np.int32),
              NSP_WEIGHTS: np.zeros(max_pairs, np.float32)})
  offset, predicted = 0, 0
  for k, pair in enumerate(pairs):
    n = _length(pair)
    span = slice(offset, offset + n)
    row[F.INPUT_IDS][span] = pair[F.INPUT_IDS][:n]
    row[F.INPUT_MASK][span] = 1
    row[F.SEGMENT_IDS][span] = pair[F.SEGMENT_IDS][:n]
    row[POSITION_IDS][span] = np.arange(n)
    row[SEQUENCE_IDS][span] = k + 1
    real = np.asarray(pair[F.MASKED_LM_WEIGHTS]) > 0
    count = int(real.sum())
    row[F.MASKED_LM_POSITIONS][predicted:predicted + count] = (
        np.asarray(pair[F.MASKED_LM_POSITIONS])[real] + offset)
    row[F.MASKED_LM_IDS][predicted:predicted + count] = np.asarray(pair[F.MASKED_LM_IDS])[real]
    row[F.MASKED_LM_WEIGHTS][predicted:predicted + count] = 1.0
    row[CLS_POSITIONS][k] = offset
    row[F.NEXT_SENTENCE_LABELS][k] = int(np.asarray(pair[F.NEXT_SENTENCE_LABELS]).reshape(-1)[0])
    row[NSP_WEIGHTS][k] = 1.0
    offset += n
    predicted += count
  return row


def pack_batch(batch: Dict[str, np.ndarray], max_pairs_per_row: int,
               max_predictions_per_row: int) -> Dict[str, np.ndarray]:
  """A batch of N instances ([N, ...] arrays) -> its packed rows ([R, ...] arrays, R <= N).

  Pure and deterministic (a function of `batch` only), which is what lets tf.data call it and
  still checkpoint its iterators.
  """
  count, max_seq_length = np.shape(batch[F.INPUT_IDS])
  examples = [{name: value[i] for name, value in batch.items()} for i in range(count)]
  return stack(pack_examples(examples, max_seq_length, max_pairs_per_row,
                             max_predictions_per_row))


def stack(rows: Sequence[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
  """Rows of equal keys (`pack_examples`' packed rows, or instances) -> one batch of [R, ...]
  arrays, a feature per key."""
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}
