r"""Pre-training records by the original BERT algorithm (spec section 3), streaming and parallel.

  python -m data_pipelines.create_pretraining_data \
    --input_file='corpus/*.txt' --output_file='records/train.tfrecord@8' \
    --vocab_file=vocab.txt --do_lower_case --max_seq_length=128 --max_predictions_per_seq=20 \
    --dupe_factor=10 --num_workers=8

Input: one sentence per line, a blank line between documents (the original format), as a comma
list and/or globs; or a tensorflow-datasets text dataset (`--tfds_name=wikipedia/20230601.en`, one
document per example, split into sentences). Output: TFRecords with the original feature names
(`data_pipelines/features.py`), a comma list or `PATH@N` for N shards `PATH-0000i-of-0000N`.
`--masking=static` (the original) stores the masks; `--masking=dynamic` stores unmasked instances
plus `is_word_continuation`, and the training pipeline masks them afresh on every read.

The algorithm is the original's, instance for instance: per document a target length
(`short_seq_prob`), sentences gathered into chunks, A = the first randint(1, n-1) sentences, B the
rest or (single-sentence chunk, or probability 1/2) a span from another document with the chunk's
unused sentences put back, and truncation of the longer side from a random end. Masking is the one
implementation in `data_pipelines/masking.py`, shared with the training-time reader.

`--instances=contiguous` writes instances without NSP instead (RoBERTa's FULL-SENTENCES,
ModernBERT-class encoders; any --max_seq_length, 8,192 included): per block and pass, the
documents in a fresh random order, each one's tokens followed by [SEP], make one token stream, cut
into `[CLS]` + max_seq_length - 2 tokens + `[SEP]` (`contiguous_arrays`); the last row of the
stream is zero-padded. Records: input_ids, input_mask, segment_ids (all 0), plus the masked_lm_*
features (static) or is_word_continuation (dynamic); no next_sentence_labels.

`--instances=documents` keeps documents apart instead (ModernBERT's packing): each document,
cut into pieces of at most max_seq_length - 2 tokens, is a `[CLS] piece [SEP]` sequence of its
own; per block and pass the sequences are packed into rows first-fit in decreasing length
(`documents_arrays`), and the records add `sequence_ids` (which sequence of the row a token
belongs to) and `position_ids` (restarting at each sequence): attention and rotary positions stay
inside the document.

Scale (what the original could not do: it held the whole corpus and every instance in memory):
  1. The input is streamed in blocks of `--documents_per_block` documents. Each block is an
     independent unit of the original algorithm (its documents shuffled, random-next B drawn from
     the same block, `dupe_factor` passes), run by one of `--num_workers` processes, with a random
     generator seeded by (seed, block index). Every instance goes to one of K temporary buckets,
     drawn at random.
  2. Each bucket (about `--shuffle_bucket_mb` of records) is shuffled in memory and written
     round-robin to the output files.
So memory is bounded by one block per worker plus one bucket, whatever the corpus size, and the
output depends only on the inputs, the flags and the seed: not on the number of workers.

On a cluster, `--runner=DataflowRunner` (or FlinkRunner, SparkRunner, DirectRunner) runs the same
two phases as an Apache Beam pipeline (`data_pipelines/beam_pipeline.py`, `pip install
'bert_jax[beam]'`) and writes the same files; the flags not defined here are Beam's pipeline
options (`--project`, `--region`, `--temp_location`, `--direct_num_workers`, ...).
"""
import collections
import contextlib
import dataclasses
import glob
import math
import multiprocessing
import os
import random
import re
import shutil
import sys
import tempfile
import time
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from bert_jax.io import filesystem
from bert_jax.text.pairs import join_pair, truncate_seq_pair  # noqa: F401 (public here too)
from data_pipelines import features as F

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is first imported

Document = List[List[int]]  # sentences of token ids

_MAX_REPORTED_BAD_LINES = 10
# What an instance is: a sentence pair with its NSP label (the original); a cut of the documents'
# contiguous token stream (no NSP; RoBERTa's FULL-SENTENCES: attention crosses documents); or
# documents as sequences of their own packed into rows (no NSP; ModernBERT's packing: attention
# and positions stay inside each document).
INSTANCES = ("pairs", "contiguous", "documents")
# Instance forms without NSP labels.
WITHOUT_NSP = ("contiguous", "documents")


@dataclasses.dataclass(frozen=True)
class Options:
  """The data-creation settings (the original tool's flags and defaults, plus scale knobs)."""
  max_seq_length: int = 128
  max_predictions_per_seq: int = 20
  random_seed: int = 12345
  dupe_factor: int = 10
  masked_lm_prob: float = 0.15
  short_seq_prob: float = 0.1
  masking: str = "static"             # static (the original) | dynamic (mask while training)
  instances: str = "pairs"            # pairs (the original, NSP) | contiguous | documents
  mask_mixture: str = "80/10/10"      # MASK/SAME/RND, appendix C.2
  do_whole_word_mask: bool = False
  mask_selection: str = "count"       # count (the original) | bernoulli: data_pipelines/masking.py
  random_token_ids: str = "vocabulary"  # vocabulary (the original) | in_use
  documents_per_block: int = 2000     # unit of work and of random-next sampling
  shuffle_bucket_mb: int = 256        # records shuffled together in memory
  max_line_bytes: int = 1_000_000     # a longer line is cut here (counted), never read whole

  def validate(self) -> None:
    if self.instances not in INSTANCES:
      raise ValueError(f"instances={self.instances!r}: expected one of {INSTANCES}")
    if self.instances in WITHOUT_NSP and self.max_seq_length < 3:
      raise ValueError(f"max_seq_length={self.max_seq_length}: needs room for [CLS] text [SEP] "
                       "(at least 3)")
    if self.instances == "pairs" and self.max_seq_length < 5:
      raise ValueError(f"max_seq_length={self.max_seq_length}: needs room for [CLS] A [SEP] B "
                       "[SEP] (at least 5)")
    if self.masking not in ("static", "dynamic"):
      raise ValueError(f"masking={self.masking!r}: expected 'static' or 'dynamic'")
    for name, choices in (("mask_selection", ("count", "bernoulli")),
                          ("random_token_ids", ("vocabulary", "in_use"))):
      if getattr(self, name) not in choices:
        raise ValueError(f"{name}={getattr(self, name)!r}: expected one of {choices}")
    for name in ("dupe_factor", "documents_per_block", "max_predictions_per_seq",
                 "shuffle_bucket_mb", "max_line_bytes"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
    for name in ("masked_lm_prob", "short_seq_prob"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"{name}={getattr(self, name)}: must be in [0, 1]")


# ------------------------------------------------------------------------------ the algorithm


@dataclasses.dataclass
class Instance:
  tokens_a: List[int]
  tokens_b: List[int]
  is_random_next: bool
  truncated_tokens: int


def instances_from_document(all_documents: Sequence[Document], document_index: int,
                            max_seq_length: int, short_seq_prob: float,
                            rng: random.Random) -> List[Instance]:
  """Sentence-pair instances of one document: the original `create_instances_from_document`."""
  document = all_documents[document_index]
  max_num_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP]
  # Mostly full-length sequences; sometimes shorter ones, so that fine-tuning's short inputs are
  # not out of distribution (the original's comment). Drawn once per document, as there.
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)

  instances = []
  current_chunk: List[List[int]] = []
  current_length = 0
  i = 0
  while i < len(document):
    segment = document[i]
    current_chunk.append(segment)
    current_length += len(segment)
    if i == len(document) - 1 or current_length >= target_seq_length:
      if current_chunk:
        a_end = rng.randint(1, len(current_chunk) - 1) if len(current_chunk) >= 2 else 1
        tokens_a = [t for sentence in current_chunk[:a_end] for t in sentence]
        tokens_b: List[int] = []
        if len(current_chunk) == 1 or rng.random() < 0.5:
          is_random_next = True
          target_b_length = target_seq_length - len(tokens_a)
          # Up to 10 tries for another document (a one-document corpus keeps its own).
          for _ in range(10):
            random_document_index = rng.randint(0, len(all_documents) - 1)
            if random_document_index != document_index:
              break
          random_document = all_documents[random_document_index]
          random_start = rng.randint(0, len(random_document) - 1)
          for j in range(random_start, len(random_document)):
            tokens_b.extend(random_document[j])
            if len(tokens_b) >= target_b_length:
              break
          # The chunk's sentences after A were not used: put them back for the next chunk.
          i -= len(current_chunk) - a_end
        else:
          is_random_next = False
          tokens_b = [t for sentence in current_chunk[a_end:] for t in sentence]
        removed = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
        instances.append(Instance(tokens_a, tokens_b, is_random_next, removed))
      current_chunk = []
      current_length = 0
    i += 1
  return instances


# ------------------------------------------------------------------------------ features


def instance_arrays(instances: Sequence[Instance], max_seq_length: int, cls_id: int,
                    sep_id: int) -> Dict[str, np.ndarray]:
  """[CLS] A [SEP] B [SEP], zero-padded: int64 arrays [N, S] (next_sentence_labels [N, 1])."""
  n = len(instances)
  ids = np.zeros((n, max_seq_length), np.int64)
  mask = np.zeros((n, max_seq_length), np.int64)
  segments = np.zeros((n, max_seq_length), np.int64)
  labels = np.zeros((n, 1), np.int64)
  for row, inst in enumerate(instances):
    tokens, segment_ids = join_pair(inst.tokens_a, inst.tokens_b, cls_id, sep_id)
    ids[row, :len(tokens)] = tokens
    mask[row, :len(tokens)] = 1
    segments[row, :len(tokens)] = segment_ids
    labels[row, 0] = F.NOT_NEXT if inst.is_random_next else F.IS_NEXT
  return {F.INPUT_IDS: ids, F.INPUT_MASK: mask, F.SEGMENT_IDS: segments,
          F.NEXT_SENTENCE_LABELS: labels}


def contiguous_arrays(documents: Sequence[Document], max_seq_length: int, cls_id: int,
                      sep_id: int) -> Dict[str, np.ndarray]:
  """Contiguous instances of `documents`, in the order given: int64 arrays [N, S], no NSP.

  The stream is every document's tokens (its sentences joined) followed by one [SEP], document
  after document. It is cut from its start into pieces of S - 2 tokens, and instance k is
  `[CLS] piece_k [SEP]`: every row is full (S real tokens) except the last, whose shorter piece
  is zero-padded (input_mask 0 there). A last piece holding nothing but the final document's
  [SEP] is dropped. segment_ids are all 0 (one segment). Documents run on across rows and meet
  inside a row, where the [SEP] between them is the only boundary (attention crosses it).
  """
  width = max_seq_length - 2
  stream = np.fromiter((t for document in documents
                        for t in [t for sentence in document for t in sentence] + [sep_id]),
                       np.int64)
  if width > 1 and len(stream) % width == 1:
    stream = stream[:-1]               # the last piece would be the final [SEP] alone
  rows = -(-len(stream) // width)
  body = np.zeros(rows * width, np.int64)
  body[:len(stream)] = stream
  lengths = np.full(rows, width, np.int64)                                # tokens per piece
  if rows:
    lengths[-1] = len(stream) - (rows - 1) * width
  ids = np.zeros((rows, max_seq_length), np.int64)
  ids[:, 0] = cls_id
  ids[:, 1:width + 1] = body.reshape(rows, width)
  ids[np.arange(rows), lengths + 1] = sep_id
  mask = (np.arange(max_seq_length)[None, :] < (lengths + 2)[:, None]).astype(np.int64)
  return {F.INPUT_IDS: ids, F.INPUT_MASK: mask,
          F.SEGMENT_IDS: np.zeros((rows, max_seq_length), np.int64)}


def document_pieces(documents: Sequence[Document], max_seq_length: int) -> List[np.ndarray]:
  """Each document's tokens (its sentences joined), cut from its start into pieces of at most
  max_seq_length - 2 tokens: the sequences `documents_arrays` packs, in document order."""
  width = max_seq_length - 2
  pieces = []
  for document in documents:
    tokens = np.fromiter((t for sentence in document for t in sentence), np.int64)
    pieces.extend(tokens[start:start + width] for start in range(0, len(tokens), width))
  return pieces


def documents_arrays(documents: Sequence[Document], max_seq_length: int, cls_id: int,
                     sep_id: int) -> Dict[str, np.ndarray]:
  """Documents as sequences of their own, packed into rows: int64 arrays [N, S], no NSP.

  Every piece of `document_pieces` (a document, or a row-length part of a longer one) becomes
  `[CLS] piece [SEP]`, and the sequences fill rows first-fit in decreasing length (ties in
  document order; deterministic), as ModernBERT's sequence packer fills its rows. Beside
  input_ids, input_mask and segment_ids (all 0):

    sequence_ids  [S]  k = 1, 2, ... for the tokens of the row's k-th sequence, 0 for padding:
                       attention stays inside a sequence (data_pipelines/packing.py)
    position_ids  [S]  0, 1, ... restarting at each sequence's [CLS]
  """
  pieces = document_pieces(documents, max_seq_length)
  lengths = [len(piece) + 2 for piece in pieces]
  order = sorted(range(len(pieces)), key=lambda i: (-lengths[i], i))
  rows: List[List[int]] = []
  free: List[int] = []
  for index in order:
    for row, room in enumerate(free):
      if lengths[index] <= room:
        rows[row].append(index)
        free[row] -= lengths[index]
        break
    else:
      rows.append([index])
      free.append(max_seq_length - lengths[index])
  names = (F.INPUT_IDS, F.INPUT_MASK, F.SEGMENT_IDS, F.SEQUENCE_IDS, F.POSITION_IDS)
  arrays = {name: np.zeros((len(rows), max_seq_length), np.int64) for name in names}
  for row, members in enumerate(rows):
    offset = 0
    for k, index in enumerate(sorted(members)):
      n = lengths[index]
      span = slice(offset, offset + n)
      arrays[F.INPUT_IDS][row, span] = np.concatenate([[cls_id], pieces[index], [sep_id]])
      arrays[F.INPUT_MASK][row, span] = 1
      arrays[F.SEQUENCE_IDS][row, span] = k + 1
      arrays[F.POSITION_IDS][row, span] = np.arange(n)
      offset += n
  return arrays


def _int64_feature(values):
  import tensorflow as tf
  return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def _float_feature(values):
  import tensorflow as tf
  return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def serialize(arrays: Dict[str, np.ndarray]) -> List[bytes]:
  """Rows of feature arrays -> serialized tf.train.Example protos (original names and dtypes)."""
  import tensorflow as tf
  names = list(arrays)
  rows = []
  for i in range(len(arrays[F.INPUT_IDS])):
    feature = {}
    for name in names:
      row = arrays[name][i].tolist()
      feature[name] = (_float_feature(row) if arrays[name].dtype.kind == "f"
                       else _int64_feature(row))
    # deterministic=True sorts the feature map: otherwise the byte order of the map depends on
    # a per-process hash seed, and outputs would differ between runs and worker counts.
    rows.append(tf.train.Example(features=tf.train.Features(feature=feature))
                .SerializeToString(deterministic=True))
  return rows


# ------------------------------------------------------------------------------ one block


@dataclasses.dataclass
class Stats:
  """What a run did; summed over blocks and printed at the end."""
  input_lines: int = 0
  documents: int = 0
  empty_documents: int = 0
  sentences: int = 0
  instances: int = 0
  sequences: int = 0                  # documents as sequences: the sequences in the rows
  tokens: int = 0
  is_next: int = 0
  not_next: int = 0
  masked_tokens: int = 0
  truncated_instances: int = 0
  truncated_tokens: int = 0
  bad_utf8_lines: int = 0
  overlong_lines: int = 0
  bad_line_locations: List[str] = dataclasses.field(default_factory=list)

  def add(self, other: "Stats") -> None:
    for field in dataclasses.fields(self):
      if field.name == "bad_line_locations":
        room = _MAX_REPORTED_BAD_LINES - len(self.bad_line_locations)
        self.bad_line_locations.extend(other.bad_line_locations[:max(room, 0)])
      else:
        setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

  def summary(self) -> str:
    pairs = max(self.is_next + self.not_next, 1)
    lines = [
        f"documents            {self.documents:,} (empty documents dropped: "
        f"{self.empty_documents:,})",
        f"sentences            {self.sentences:,} of {self.input_lines:,} input lines",
        f"instances            {self.instances:,}",
        f"tokens               {self.tokens:,} "
        f"({self.tokens / max(self.instances, 1):.1f} per instance)",
        (f"NSP balance          IsNext {self.is_next:,} ({100 * self.is_next / pairs:.1f}%), "
         f"NotNext {self.not_next:,} ({100 * self.not_next / pairs:.1f}%)"
         if self.is_next + self.not_next or not self.instances else
         "NSP                  none (contiguous instances)" if not self.sequences else
         f"NSP                  none; {self.sequences:,} document sequences packed "
         f"({self.sequences / max(self.instances, 1):.1f} per row)"),
        f"masked tokens        {self.masked_tokens:,}" + (
            f" ({100 * self.masked_tokens / max(self.tokens, 1):.1f}% of tokens)"
            if self.masked_tokens else " (dynamic masking: masked at training time)"),
        f"truncated instances  {self.truncated_instances:,} "
        f"({self.truncated_tokens:,} tokens cut)",
        f"bad lines            {self.bad_utf8_lines:,} invalid UTF-8 (decoded with U+FFFD), "
        f"{self.overlong_lines:,} over the line limit (cut)",
    ]
    lines += [f"  {where}" for where in self.bad_line_locations]
    return "\n".join(lines)


class BlockBuilder:
  """A block of raw documents -> its instances as (bucket, serialized tf.train.Example): the one
  implementation of the algorithm per block, run by both builders (worker processes here, Beam
  workers in `data_pipelines/beam_pipeline.py`)."""

  def __init__(self, tokenizer, options: Options, num_buckets: int):
    from data_pipelines import masking
    self.tokenizer = tokenizer
    self.options = options
    self.num_buckets = num_buckets
    self.special = masking.SpecialTokens.from_tokenizer(tokenizer)
    self.masking_config = masking.MaskingConfig.from_mixture(
        options.mask_mixture, masked_lm_prob=options.masked_lm_prob,
        max_predictions_per_seq=options.max_predictions_per_seq,
        whole_word_mask=options.do_whole_word_mask, selection=options.mask_selection,
        random_tokens=options.random_token_ids)
    tokens = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
    # is_word_continuation depends on the token only: a lookup table over the vocabulary.
    self.continuation = np.array([tokenizer.is_word_continuation(t) for t in tokens], np.int64)

  def tokenize(self, documents: Sequence[List[str]], stats: Stats) -> List[Document]:
    lines = [line for doc in documents for line in doc]
    ids = self.tokenizer.encode_batch(lines)
    out, k = [], 0
    for doc in documents:
      sentences = [s for s in ids[k:k + len(doc)] if s]
      k += len(doc)
      if sentences:
        out.append(sentences)
        stats.sentences += len(sentences)
      else:  # every line tokenized to nothing (e.g. only control characters)
        stats.empty_documents += 1
    stats.documents += len(out)
    return out

  def records(self, block_index: int, documents: Sequence[List[str]],
              stats: Stats) -> Iterator[Tuple[int, bytes]]:
    """(bucket, record) for every instance of the block, in the order they are made.

    One random generator, seeded by (seed, block index), draws everything: the document order,
    the instances, the masks and the bucket of each record. So a block's records depend on its
    documents alone, wherever and by whichever builder it runs. Consume the generator whole and
    in order (it shares that generator between passes).
    """
    opts = self.options
    rng = random.Random(f"{opts.random_seed}/{block_index}")
    docs = self.tokenize(documents, stats)
    if not docs:
      return
    rng.shuffle(docs)
    for dupe in range(opts.dupe_factor):
      if opts.instances in WITHOUT_NSP:
        if dupe:  # a fresh document order: other cut points, other rows, on every pass
          rng.shuffle(docs)
        instances = None
        rows = contiguous_arrays if opts.instances == "contiguous" else documents_arrays
        arrays = rows(docs, opts.max_seq_length, self.special.cls_id, self.special.sep_id)
        order = list(range(len(arrays[F.INPUT_IDS])))
        rng.shuffle(order)
        arrays = {name: value[order] for name, value in arrays.items()}
      else:
        instances = []
        for document_index in range(len(docs)):
          instances.extend(instances_from_document(docs, document_index, opts.max_seq_length,
                                                   opts.short_seq_prob, rng))
        rng.shuffle(instances)
        arrays = instance_arrays(instances, opts.max_seq_length, self.special.cls_id,
                                 self.special.sep_id)
      arrays = self._mask(arrays, rng)
      self._count(instances, arrays, stats)
      for record in serialize(arrays):
        yield rng.randrange(self.num_buckets), record

  def _mask(self, arrays: Dict[str, np.ndarray], rng: random.Random) -> Dict[str, np.ndarray]:
    continuation = self.continuation[arrays[F.INPUT_IDS]] * arrays[F.INPUT_MASK]
    if self.options.masking == "dynamic":
      return dict(arrays, **{F.IS_WORD_CONTINUATION: continuation})
    import tensorflow as tf
    from data_pipelines import masking
    out = {name: [] for name in (F.INPUT_IDS, F.MASKED_LM_POSITIONS, F.MASKED_LM_IDS,
                                 F.MASKED_LM_WEIGHTS)}
    chunk = 1024
    for start in range(0, len(arrays[F.INPUT_IDS]), chunk):
      part = slice(start, start + chunk)
      seed = tf.constant([self.options.random_seed, rng.getrandbits(31)], tf.int64)
      masked = masking.mask_batch(arrays[F.INPUT_IDS][part], arrays[F.INPUT_MASK][part],
                                  continuation[part], config=self.masking_config,
                                  special=self.special, seed=seed)
      for name in out:
        out[name].append(masked[name].numpy())
    merged = {name: np.concatenate(parts) if parts else np.zeros(
        (0, arrays[F.INPUT_IDS].shape[1] if name == F.INPUT_IDS
         else self.options.max_predictions_per_seq),
        np.float32 if name == F.MASKED_LM_WEIGHTS else np.int64)
              for name, parts in out.items()}
    merged[F.MASKED_LM_WEIGHTS] = merged[F.MASKED_LM_WEIGHTS].astype(np.float32)
    # Key order = the original writer's feature order (contiguous instances: no NSP labels).
    masked_arrays = {F.INPUT_IDS: merged[F.INPUT_IDS], F.INPUT_MASK: arrays[F.INPUT_MASK],
                     F.SEGMENT_IDS: arrays[F.SEGMENT_IDS],
                     F.MASKED_LM_POSITIONS: merged[F.MASKED_LM_POSITIONS],
                     F.MASKED_LM_IDS: merged[F.MASKED_LM_IDS],
                     F.MASKED_LM_WEIGHTS: merged[F.MASKED_LM_WEIGHTS]}
    for name in (F.NEXT_SENTENCE_LABELS, F.SEQUENCE_IDS, F.POSITION_IDS):
      if name in arrays:
        masked_arrays[name] = arrays[name]
    return masked_arrays

  @staticmethod
  def _count(instances: Optional[Sequence[Instance]], arrays, stats: Stats) -> None:
    """Counts a pass's records; `instances` None for rows without NSP (no truncation)."""
    stats.instances += len(arrays[F.INPUT_IDS])
    if F.SEQUENCE_IDS in arrays:
      stats.sequences += int(arrays[F.SEQUENCE_IDS].max(axis=1, initial=0).sum())
    stats.tokens += int(arrays[F.INPUT_MASK].sum())
    if instances is not None:
      not_next = sum(inst.is_random_next for inst in instances)
      stats.not_next += not_next
      stats.is_next += len(instances) - not_next
      stats.truncated_instances += sum(inst.truncated_tokens > 0 for inst in instances)
      stats.truncated_tokens += sum(inst.truncated_tokens for inst in instances)
    if F.MASKED_LM_WEIGHTS in arrays:
      stats.masked_tokens += int(arrays[F.MASKED_LM_WEIGHTS].sum())


class _BucketFileWriter:
  """Phase 1 of the single-machine builder: a block's records appended to local bucket files."""

  def __init__(self, builder: BlockBuilder, bucket_dir: str):
    self.builder = builder
    self.bucket_dir = bucket_dir

  def __call__(self, block_index: int, documents: Sequence[List[str]]) -> Stats:
    import tensorflow as tf
    stats = Stats()
    writers = {}
    try:
      for bucket, record in self.builder.records(block_index, documents, stats):
        if bucket not in writers:
          writers[bucket] = tf.io.TFRecordWriter(bucket_path(self.bucket_dir, bucket,
                                                             block_index))
        writers[bucket].write(record)
    finally:
      for writer in writers.values():
        writer.close()
    return stats


def bucket_path(bucket_dir: str, bucket: int, block_index: int) -> str:
  # Bucket files live in a local temporary directory (see create_pretraining_data). Sorted by
  # name, a bucket's files come in block order; the Beam builder sorts by (block, position).
  return os.path.join(bucket_dir, f"bucket-{bucket:05d}-block-{block_index:08d}.tfrecord")


def shuffle_bucket(records: List[bytes], seed: int, bucket: int) -> None:
  """Shuffles one bucket's records (given in block order, each block's in the order made) in
  place: phase 2 of both builders."""
  random.Random(f"{seed}/bucket/{bucket}").shuffle(records)


# ------------------------------------------------------------------------------ reading


def _read_line(f, limit: int) -> Tuple[Optional[bytes], bool]:
  """The next line of a binary file, cut at `limit` bytes (the rest skipped unread into memory).

  Returns (line or None at the end, whether it was cut).
  """
  line = f.readline(limit)
  if not line:
    return None, False
  if len(line) < limit or line.endswith(b"\n"):
    return line, False
  while True:  # skip the rest of an absurdly long line in bounded pieces
    rest = f.readline(limit)
    if not rest or rest.endswith(b"\n"):
      return line, True


def documents_from_files(files: Sequence[str], options: Options,
                         stats: Stats) -> Iterator[List[str]]:
  """Documents (lists of non-blank lines) from files in the original format, streamed.

  Blank lines end documents, and so does the end of each file. Undecodable bytes become U+FFFD
  and each such line is counted with its file and line number.
  """
  for path in files:
    document: List[str] = []
    with filesystem.open(path, "rb") as f:
      line_number = 0
      while True:
        raw, cut = _read_line(f, options.max_line_bytes)
        if raw is None:
          break
        line_number += 1
        stats.input_lines += 1
        try:
          line = raw.decode("utf-8")
        except UnicodeDecodeError:
          line = raw.decode("utf-8", errors="replace")
          stats.bad_utf8_lines += 1
          _note_bad_line(stats, f"{path}:{line_number}: invalid UTF-8")
        if cut:
          stats.overlong_lines += 1
          _note_bad_line(stats, f"{path}:{line_number}: line longer than "
                         f"{options.max_line_bytes} bytes, cut")
        line = line.strip()
        if line:
          document.append(line)
        elif document:
          yield document
          document = []
        else:
          stats.empty_documents += 1 if line_number > 1 else 0
    if document:
      yield document


def _note_bad_line(stats: Stats, where: str) -> None:
  if len(stats.bad_line_locations) < _MAX_REPORTED_BAD_LINES:
    stats.bad_line_locations.append(where)


def documents_from_tfds(name: str, split: str, text_field: str, data_dir: Optional[str],
                        stats: Stats) -> Iterator[List[str]]:
  """One document per example of a tensorflow-datasets text dataset, split into sentences."""
  import tensorflow_datasets as tfds
  from data_pipelines.sentences import split_sentences
  dataset = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
  if text_field not in dataset.element_spec:
    raise ValueError(f"tfds {name}: no field {text_field!r}; fields: "
                     f"{sorted(dataset.element_spec)} (set --tfds_text_field)")
  for example in tfds.as_numpy(dataset):
    text = example[text_field]
    text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)
    stats.input_lines += 1
    sentences = split_sentences(text)
    if sentences:
      yield sentences
    else:
      stats.empty_documents += 1


def _blocks(documents: Iterable[List[str]], size: int) -> Iterator[Tuple[int, List[List[str]]]]:
  block: List[List[str]] = []
  index = 0
  for document in documents:
    block.append(document)
    if len(block) == size:
      yield index, block
      index, block = index + 1, []
  if block:
    yield index, block


# ------------------------------------------------------------------------------ outputs


def expand_output_files(spec: str) -> List[str]:
  """'a.tfrecord,b.tfrecord' or 'PATH@N' (-> PATH-00000-of-0000N ...)."""
  match = re.fullmatch(r"(.+)@(\d+)", spec.strip())
  if match:
    path, count = match.group(1), int(match.group(2))
    if count < 1:
      raise ValueError(f"--output_file={spec!r}: the shard count must be >= 1")
    return [f"{path}-{i:05d}-of-{count:05d}" for i in range(count)]
  files = [p.strip() for p in spec.split(",") if p.strip()]
  if not files:
    raise ValueError("No output file given (--output_file)")
  return files


def _check_writable(paths: Sequence[str]) -> None:
  """Creates the output directories and fails, naming the path, before any work is done.

  A new output is created to see that it can be, and removed again: an empty file left there by a
  run that then stopped would pass for a finished output with no records."""
  import tensorflow as tf
  for path in paths:
    try:
      directory = filesystem.dirname(path)
      if directory:
        filesystem.makedirs(directory)
      if filesystem.isdir(path):
        raise IsADirectoryError(f"{path} is a directory")
      if not filesystem.exists(path):
        with filesystem.open(path, "wb"):
          pass
        filesystem.remove(path)
    except (OSError, tf.errors.OpError) as e:
      raise PermissionError(f"Cannot write the output file {path}: {e}") from None


def partial_directory(output_files: Sequence[str]) -> str:
  """`.NAME.partial/` beside the first output (NAME: its base name): where a run writes until
  every output is complete. The same for every run of the same command, so a run killed half-way
  leaves its partial files there, never at the outputs' names, and the next run starts afresh."""
  first = filesystem.absolute(output_files[0])
  return filesystem.join(filesystem.dirname(first), f".{filesystem.basename(first)}.partial")


class OutputWriteError(OSError):
  """The outputs could not be written because the disk is full: none is at its final name, and
  the same command, run again once there is space, writes them all afresh."""


@contextlib.contextmanager
def full_disk_named(output_files: Sequence[str], work_dir: str) -> Iterator[None]:
  """A full disk while the outputs are written (by either builder) as one error naming the
  outputs and what to do; a storage layer's own error names a temporary file, or none."""
  try:
    yield
  except Exception as error:  # pylint: disable=broad-except  (TensorFlow's, Beam's wrappers)
    if not filesystem.no_space(error):
      raise
    shown = ", ".join(output_files[:2]) + (f" and {len(output_files) - 2} more"
                                           if len(output_files) > 2 else "")
    cause = str(error).strip().splitlines()[-1][:300] if str(error).strip() else ""
    raise OutputWriteError(
        f"Could not write {shown}: the disk is full ({cause}). No output was written at its "
        f"name (the unfinished files in {work_dir} are removed); free space and run the same "
        "command again.") from error


def check_instances(stats: "Stats", inputs: Sequence[str], written: int) -> None:
  """No record from the whole input is an error naming it (an empty or blank file, a wrong
  glob), not a run that ends well with empty outputs."""
  if not written:
    raise ValueError(f"No instances from {', '.join(inputs) or 'the input'}: "
                     f"{stats.input_lines} line(s), {stats.documents} document(s) with text "
                     f"(an empty input?)")


def _num_buckets(input_bytes: Optional[int], options: Options) -> int:
  """Enough buckets that one holds ~shuffle_bucket_mb of records.

  A serialized record takes roughly 3x the bytes of the text it came from (int64 varints of four
  id features), once per dupe pass.
  """
  if input_bytes is None:  # unknown size (tensorflow-datasets): plenty of buckets
    return 64
  estimate = 3 * input_bytes * options.dupe_factor
  return int(min(4096, max(1, math.ceil(estimate / (options.shuffle_bucket_mb << 20)))))


def _write_shuffled_buckets(bucket_dir: str, num_buckets: int, output_files: Sequence[str],
                            seed: int, progress: bool) -> int:
  """Each bucket: read, shuffle in memory, write round-robin over the outputs. Returns records."""
  import tensorflow as tf
  writers = [filesystem.RecordWriter(path) for path in output_files]
  written = 0
  try:
    for bucket in _progress(range(num_buckets), progress, "shuffle + write", "bucket"):
      paths = sorted(glob.glob(os.path.join(bucket_dir, f"bucket-{bucket:05d}-block-*.tfrecord")))
      if not paths:
        continue
      records = list(tf.data.TFRecordDataset(paths).as_numpy_iterator())
      shuffle_bucket(records, seed, bucket)
      # Round-robin over the outputs across buckets: record k of the run goes to output
      # k % len(outputs) (the Beam builder computes k from the sizes of the buckets before).
      for record in records:
        writers[written % len(writers)].write(record)
        written += 1
      for path in paths:
        os.remove(path)
  finally:
    for writer in writers:
      writer.close()
  return written


def _progress(iterable, enabled: bool, description: str, unit: str, total=None):
  if not enabled:
    return iterable
  from tqdm import tqdm
  return tqdm(iterable, desc=description, unit=unit, total=total, file=sys.stderr,
              dynamic_ncols=True)


# ------------------------------------------------------------------------------ the driver


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """What a run reads and writes, checked before any work starts (both builders use it)."""
  options: Options
  input_files: List[str]     # empty when reading tensorflow-datasets
  output_files: List[str]
  num_buckets: int


def plan_run(input_files: Sequence[str], output_files: Sequence[str], tokenizer,
             tfds_name: str = "", **options) -> RunPlan:
  """Validates the options, expands the inputs, checks the special tokens, creates the (empty)
  outputs and sizes the shuffle buckets. Fails naming the option, file or token at fault."""
  opts = Options(**options)
  opts.validate()
  if not tfds_name:
    from data_pipelines.build_vocab import expand_input_files
    input_files = expand_input_files(",".join(input_files))
  else:
    input_files = []
  if not output_files:
    raise ValueError("No output file given")
  from data_pipelines import masking
  masking.SpecialTokens.from_tokenizer(tokenizer)  # fails now, naming a missing special token
  _check_writable(output_files)
  input_bytes = None if tfds_name else sum(filesystem.getsize(p) for p in input_files)
  return RunPlan(opts, list(input_files), list(output_files), _num_buckets(input_bytes, opts))


def tokenizer_kwargs(tokenizer) -> dict:
  """What a worker process needs to rebuild the same tokenizer (`worker_block_builder`)."""
  if getattr(tokenizer, "spm_model_file", None):
    return dict(spm_model_file=filesystem.absolute(tokenizer.spm_model_file),
                do_lower_case=tokenizer.do_lower_case)
  if getattr(tokenizer, "tokenizer_file", None):
    return dict(tokenizer_file=filesystem.absolute(tokenizer.tokenizer_file))
  return dict(vocab_file=filesystem.absolute(tokenizer.vocab_file),
              do_lower_case=tokenizer.do_lower_case)


def worker_block_builder(tokenizer_kwargs: dict, options: Options,
                         num_buckets: int) -> BlockBuilder:
  """A `BlockBuilder` in a fresh worker process (a pool process here, a Beam worker there)."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ["CUDA_VISIBLE_DEVICES"] = ""  # TensorFlow must not take an accelerator
  from bert_jax.text import tokenization
  tokenizer = tokenization.create_tokenizer(**tokenizer_kwargs)
  return BlockBuilder(tokenizer, options, num_buckets)


_WORKER: Optional[_BucketFileWriter] = None


def _init_worker(tokenizer_kwargs, options, bucket_dir, num_buckets):
  global _WORKER
  _WORKER = _BucketFileWriter(worker_block_builder(tokenizer_kwargs, options, num_buckets),
                              bucket_dir)


def _run_block(args) -> Stats:
  return _WORKER(*args)


def _run_blocks(blocks: Iterable, worker_args: tuple, tokenizer, num_workers: int,
                stats: Stats) -> None:
  """Phase 1 over all blocks, in this process or in `num_workers` processes.

  At most two blocks per worker are in flight, so the reader never runs ahead of the workers
  (Pool.imap would read the whole corpus into its task queue).
  """
  options, bucket_dir, num_buckets = worker_args
  if num_workers <= 1:
    worker = _BucketFileWriter(BlockBuilder(tokenizer, options, num_buckets), bucket_dir)
    for block_index, documents in blocks:
      stats.add(worker(block_index, documents))
    return
  context = multiprocessing.get_context("spawn")  # TensorFlow is not fork-safe
  with context.Pool(num_workers, initializer=_init_worker,
                    initargs=(tokenizer_kwargs(tokenizer),) + worker_args) as pool:
    pending = collections.deque()
    for args in blocks:
      pending.append(pool.apply_async(_run_block, (args,)))
      while len(pending) >= 2 * num_workers:
        stats.add(pending.popleft().get())
    while pending:
      stats.add(pending.popleft().get())


def finish(stats: Stats, written: int, num_outputs: int, seconds: float, progress: bool) -> None:
  """The end of a run, for both builders: the record count checked, bad lines named on stderr,
  the statistics printed."""
  if written != stats.instances:
    raise RuntimeError(f"Wrote {written} records but created {stats.instances} instances")
  if stats.bad_utf8_lines or stats.overlong_lines:
    print(f"WARNING: {stats.bad_utf8_lines} line(s) with invalid UTF-8 and "
          f"{stats.overlong_lines} over-long line(s); first ones:\n  " +
          "\n  ".join(stats.bad_line_locations), file=sys.stderr)
  if progress:
    print(f"Wrote {written:,} instances to {num_outputs} file(s) in {seconds:.1f} s\n"
          f"{stats.summary()}", flush=True)


def create_pretraining_data(input_files: Sequence[str], output_files: Sequence[str], tokenizer,
                            *, num_workers: int = 1, progress: bool = True,
                            tfds_name: str = "", tfds_split: str = "train",
                            tfds_text_field: str = "text", tfds_data_dir: Optional[str] = None,
                            **options) -> Stats:
  """Writes pre-training records for `input_files` (or a TFDS dataset) to `output_files`.

  `options` are the fields of `Options` (max_seq_length, dupe_factor, masking, ...).
  Returns the run's statistics (also printed when `progress`).
  """
  plan = plan_run(input_files, output_files, tokenizer, tfds_name, **options)
  opts, output_files = plan.options, plan.output_files
  stats = Stats()
  started = time.time()
  work_dir = partial_directory(output_files)
  if filesystem.exists(work_dir):   # left by a run that was killed
    filesystem.rmtree(work_dir)
  filesystem.makedirs(work_dir)
  partial_outputs = [filesystem.join(work_dir, f"output-{i:05d}.tfrecord")
                     for i in range(len(output_files))]
  # Temporary bucket files: always local (in the work directory, else in the system's temp dir).
  bucket_dir = tempfile.mkdtemp(prefix="buckets_",
                                dir=None if filesystem.is_url(work_dir) else work_dir)
  with full_disk_named(output_files, work_dir):
    try:
      if tfds_name:
        documents = documents_from_tfds(tfds_name, tfds_split, tfds_text_field, tfds_data_dir,
                                        stats)
      else:
        documents = documents_from_files(plan.input_files, opts, stats)
      blocks = _progress(_blocks(documents, opts.documents_per_block), progress,
                         "instances", "block")
      _run_blocks(blocks, (opts, bucket_dir, plan.num_buckets), tokenizer, num_workers, stats)
      written = _write_shuffled_buckets(bucket_dir, plan.num_buckets, partial_outputs,
                                        opts.random_seed, progress)
      check_instances(stats, plan.input_files or [tfds_name], written)
      for partial, output in zip(partial_outputs, output_files):   # each output appears whole
        filesystem.rename(partial, output)
    finally:
      shutil.rmtree(bucket_dir, ignore_errors=True)
      if filesystem.exists(work_dir):
        filesystem.rmtree(work_dir)
  finish(stats, written, len(output_files), time.time() - started, progress)
  return stats
