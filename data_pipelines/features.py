"""Names, dtypes and padding of pre-training records: the one contract between writer and reader.

Statically masked records use exactly the original BERT release's feature names, so records made
by the original `create_pretraining_data.py` are read here and ours are read by the original code:

  input_ids, input_mask, segment_ids            int64 [max_seq_length], zero-padded
  masked_lm_positions, masked_lm_ids            int64 [max_predictions_per_seq], zero-padded
  masked_lm_weights                             float [max_predictions_per_seq], 1.0 real / 0.0 pad
  next_sentence_labels                          int64 [1], 0 = B is the real next, 1 = B is random

Records written with `--masking=dynamic` hold unmasked instances (the tf.data pipeline masks them
at training time) and carry what whole-word masking needs instead of the masked_lm_* features:

  is_word_continuation                          int64 [max_seq_length], 1 where a piece continues
                                                the previous piece's word (WordPiece `##x`, or a
                                                SentencePiece piece without the word-start mark)

Contiguous instances (`--instances=contiguous`, for objectives without NSP) are either kind of
record without next_sentence_labels: `[CLS]` + max_seq_length - 2 tokens of the documents' token
stream (each document followed by `[SEP]`) + `[SEP]`, segment_ids all 0. The readers tell them
apart by that absence (`next_sentence_labels=False` below).

Documents as sequences (`--instances=documents`) are contiguous-like records (no
next_sentence_labels) whose rows pack several `[CLS] document [SEP]` sequences, with two more
features (`packed=True` below):

  sequence_ids                                  int64 [max_seq_length], k for the tokens of the
                                                row's k-th sequence (1, 2, ...), 0 for padding
  position_ids                                  int64 [max_seq_length], restarting at 0 at each
                                                sequence
"""
from typing import Dict

INPUT_IDS = "input_ids"
INPUT_MASK = "input_mask"
SEGMENT_IDS = "segment_ids"
MASKED_LM_POSITIONS = "masked_lm_positions"
MASKED_LM_IDS = "masked_lm_ids"
MASKED_LM_WEIGHTS = "masked_lm_weights"
NEXT_SENTENCE_LABELS = "next_sentence_labels"
IS_WORD_CONTINUATION = "is_word_continuation"
SEQUENCE_IDS = "sequence_ids"
POSITION_IDS = "position_ids"

# NSP label values of the original records.
IS_NEXT = 0
NOT_NEXT = 1


def static_feature_spec(max_seq_length: int, max_predictions_per_seq: int,
                        next_sentence_labels: bool = True,
                        packed: bool = False) -> Dict[str, "tf.io.FixedLenFeature"]:
  """Parsing spec of the original release's statically masked records (next_sentence_labels
  False: contiguous instances; packed: documents as sequences)."""
  import tensorflow as tf  # here, not at import: the model side (packing) runs without TF
  spec = {
      INPUT_IDS: tf.io.FixedLenFeature([max_seq_length], tf.int64),
      INPUT_MASK: tf.io.FixedLenFeature([max_seq_length], tf.int64),
      SEGMENT_IDS: tf.io.FixedLenFeature([max_seq_length], tf.int64),
      MASKED_LM_POSITIONS: tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
      MASKED_LM_IDS: tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
      MASKED_LM_WEIGHTS: tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
      NEXT_SENTENCE_LABELS: tf.io.FixedLenFeature([1], tf.int64),
  }
  return _without_nsp_or_packed(spec, max_seq_length, next_sentence_labels, packed)


def dynamic_feature_spec(max_seq_length: int, next_sentence_labels: bool = True,
                         packed: bool = False) -> Dict[str, "tf.io.FixedLenFeature"]:
  """Parsing spec of unmasked records written for dynamic (training-time) masking
  (next_sentence_labels False: contiguous instances; packed: documents as sequences)."""
  import tensorflow as tf
  spec = {
      INPUT_IDS: tf.io.FixedLenFeature([max_seq_length], tf.int64),
      INPUT_MASK: tf.io.FixedLenFeature([max_seq_length], tf.int64),
      SEGMENT_IDS: tf.io.FixedLenFeature([max_seq_length], tf.int64),
      NEXT_SENTENCE_LABELS: tf.io.FixedLenFeature([1], tf.int64),
      IS_WORD_CONTINUATION: tf.io.FixedLenFeature([max_seq_length], tf.int64),
  }
  return _without_nsp_or_packed(spec, max_seq_length, next_sentence_labels, packed)


def _without_nsp_or_packed(spec, max_seq_length: int, next_sentence_labels: bool, packed: bool):
  import tensorflow as tf
  if not next_sentence_labels or packed:
    del spec[NEXT_SENTENCE_LABELS]
  if packed:
    for name in (SEQUENCE_IDS, POSITION_IDS):
      spec[name] = tf.io.FixedLenFeature([max_seq_length], tf.int64)
  return spec
