"""The pre-training input pipeline: tf.data on the host, never on the accelerators.

files -> this process's shard -> shuffle (files, then records) -> repeat -> batch -> parse ->
dynamic masking (or pass-through of statically masked records, the original tool's included)
-> prefetch. Batches carry the original feature names as int32 / float32 numpy arrays; the
per-process batch is global_batch_size / process_count.

Determinism: every shuffle is seeded and the masking seed of a batch is (seed, batch index), so
the same seed gives the same batches, and `PipelineIterator.save/restore` (tf.data iterator
checkpoints) resumes exactly where a run stopped. Evaluation makes one ordered pass and pads the
last partial batch, marking real rows with `example_weight` 1.0 and padding rows with 0.0.
"""
import os
from typing import Dict, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from data_pipelines import features as F
from data_pipelines import masking as M

try:  # TensorFlow must never take the accelerators from JAX.
  tf.config.set_visible_devices([], "GPU")
  tf.config.set_visible_devices([], "TPU")
except (RuntimeError, ValueError):  # already initialised, or no such device type
  pass

EXAMPLE_WEIGHT = "example_weight"


def expand_patterns(file_patterns: Union[str, Sequence[str]]) -> list:
  """Comma lists and globs -> sorted file list; a pattern matching nothing is an error."""
  if isinstance(file_patterns, str):
    file_patterns = [p for p in file_patterns.split(",") if p.strip()]
  files = []
  for pattern in file_patterns:
    matched = sorted(tf.io.gfile.glob(pattern.strip()))
    if not matched:
      raise FileNotFoundError(f"No input files match {pattern!r}")
    files.extend(matched)
  if not files:
    raise FileNotFoundError("No input files given")
  return files


def record_kind(path: str) -> str:
  """'static' (masked_lm_* present) or 'dynamic' (is_word_continuation present)."""
  for raw in tf.data.TFRecordDataset(path).take(1):
    example = tf.train.Example.FromString(raw.numpy())
    names = set(example.features.feature)
    if F.MASKED_LM_POSITIONS in names:
      return "static"
    if F.IS_WORD_CONTINUATION in names:
      return "dynamic"
    raise ValueError(f"{path}: records have neither {F.MASKED_LM_POSITIONS} (static masking) nor "
                     f"{F.IS_WORD_CONTINUATION} (dynamic masking); features: {sorted(names)}")
  raise ValueError(f"{path}: no records")


def _process_info(process_index, process_count):
  if process_index is None or process_count is None:
    import jax
    process_index, process_count = jax.process_index(), jax.process_count()
  return process_index, process_count


def create_pretraining_dataset(
    file_patterns: Union[str, Sequence[str]], *, global_batch_size: int, max_seq_length: int,
    max_predictions_per_seq: int, masking: Optional[M.MaskingConfig],
    special: Optional[M.SpecialTokens] = None, seed: int = 0, is_training: bool = True,
    process_index: Optional[int] = None, process_count: Optional[int] = None,
    shuffle_buffer_size: int = 10_000, num_parallel_calls=tf.data.AUTOTUNE) -> tf.data.Dataset:
  """Batches of pre-training features for this process (see the module docstring).

  masking: None passes records through: statically masked records as they are, dynamic records
    unmasked (what the left-to-right objective reads). A MaskingConfig masks dynamic records.
  """
  files = expand_patterns(file_patterns)
  kind = record_kind(files[0])
  if masking is not None and kind == "static":
    raise ValueError(f"{files[0]} holds statically masked records; read them with masking=None "
                     "(config.data.masking='static'), or write dynamic records")
  if masking is not None and special is None:
    raise ValueError("dynamic masking needs the special-token ids (special=SpecialTokens...)")
  process_index, process_count = _process_info(process_index, process_count)
  if global_batch_size % process_count:
    raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                     f"{process_count} processes")
  batch_size = global_batch_size // process_count
  spec = (F.static_feature_spec(max_seq_length, max_predictions_per_seq) if kind == "static"
          else F.dynamic_feature_spec(max_seq_length))

  if len(files) >= process_count:
    dataset = tf.data.Dataset.from_tensor_slices(files[process_index::process_count])
    record_shard = None
  else:  # fewer files than hosts: every host reads all files and keeps every n-th record
    dataset = tf.data.Dataset.from_tensor_slices(files)
    record_shard = (process_count, process_index)
  if is_training:
    dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.repeat()
    dataset = dataset.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                                 block_length=1, deterministic=True)
  else:
    dataset = dataset.flat_map(tf.data.TFRecordDataset)
  if record_shard:
    dataset = dataset.shard(*record_shard)
  if is_training:
    dataset = dataset.shuffle(shuffle_buffer_size, seed=seed + 1, reshuffle_each_iteration=True)
  dataset = dataset.batch(batch_size, drop_remainder=is_training)

  def parse(index, serialized):
    parsed = tf.io.parse_example(serialized, spec)
    batch = {k: tf.cast(v, tf.float32 if v.dtype == tf.float32 else tf.int32)
             for k, v in parsed.items()}
    if masking is not None:
      masked = M.mask_batch(batch[F.INPUT_IDS], batch[F.INPUT_MASK],
                            batch[F.IS_WORD_CONTINUATION], config=masking, special=special,
                            seed=tf.stack([tf.cast(seed, tf.int64), index]))
      batch.update(masked)
    batch.pop(F.IS_WORD_CONTINUATION, None)
    if not is_training:
      batch = _pad_batch(batch, batch_size)
    return batch

  dataset = dataset.enumerate().map(parse, num_parallel_calls=num_parallel_calls,
                                    deterministic=True)
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_optimization.map_parallelization = True
  dataset = dataset.with_options(options)
  return dataset.prefetch(tf.data.AUTOTUNE)


def _pad_batch(batch: Dict[str, tf.Tensor], batch_size: int) -> Dict[str, tf.Tensor]:
  """Pads a partial evaluation batch to `batch_size` rows; `example_weight` marks real rows."""
  rows = tf.shape(batch[F.INPUT_IDS])[0]
  padded = {}
  for name, value in batch.items():
    pad = [[0, batch_size - rows]] + [[0, 0]] * (len(value.shape) - 1)
    padded[name] = tf.ensure_shape(tf.pad(value, pad), [batch_size] + value.shape[1:])
  padded[EXAMPLE_WEIGHT] = tf.ensure_shape(
      tf.pad(tf.ones([rows], tf.float32), [[0, batch_size - rows]]), [batch_size])
  return padded


class PipelineIterator:
  """Iterator over numpy batches whose position can be saved and restored exactly."""

  def __init__(self, dataset: tf.data.Dataset):
    self._iterator = iter(dataset)
    self._checkpoint = tf.train.Checkpoint(iterator=self._iterator)

  def __iter__(self):
    return self

  def __next__(self) -> Dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in next(self._iterator).items()}

  def save(self, directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    self._checkpoint.write(os.path.join(directory, "iterator"))

  def restore(self, directory: str) -> None:
    prefix = os.path.join(directory, "iterator")
    if not tf.io.gfile.glob(prefix + "*"):
      raise FileNotFoundError(f"No input-pipeline state at {prefix}")
    self._checkpoint.read(prefix).assert_consumed()
