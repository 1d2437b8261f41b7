"""The pre-training input pipeline: tf.data on the host, never on the accelerators.

files -> this process's shard -> shuffle (files, then records) -> repeat -> batch -> parse ->
dynamic masking (or pass-through of statically masked records, the original tool's included)
-> prefetch. Batches carry the original feature names as int32 / float32 numpy arrays; the
per-process batch is global_batch_size / process_count.

Contiguous instances (`create_pretraining_data --instances=contiguous`: no next_sentence_labels)
are read the same way, told apart by that absence; their batches have no next_sentence_labels.
Documents as sequences (`--instances=documents`) are told apart by their `sequence_ids`; their
batches carry `sequence_ids` and `position_ids` (the model keeps the sequences apart).
An objective that needs them (`require_nsp_labels`) fails naming the files, and packing them is
rejected (their rows are full already).

Determinism: every shuffle is seeded and the masking seed of a batch is (seed, batch index), so
the same seed gives the same batches, and `PipelineIterator.save/restore` (tf.data iterator
checkpoints) resumes exactly where a run stopped. The saved position names the files by their
path below the inputs' common folder (`relative_inputs`), never absolutely: a copied workdir
resumes on its own files, exactly, whether its source is still there, changed or gone. Beside it,
`position.json` records each input file's name, size and first bytes' digest (a position saved
over other files is not applied to these: `InputMovedError`, the caller replays to the step)
and the digests of the position's own files (damaged: `CheckpointDamagedError`).

Evaluation makes one ordered pass and pads the last partial batch, marking real rows with
`example_weight` 1.0 and padding rows with 0.0.

Packing (training only, `packing=PackingConfig(...)`, config.data.packing): records are batched
into windows of `packing.window` instances instead, parsed and masked per window (seed: window
index), each window is packed into rows (data_pipelines/packing.py: several NSP pairs per row,
block-diagonal attention), the rows are shuffled within their window (stateless), unbatched and
batched again: a batch then holds global_batch_size / process_count *rows*. Every stage is a
stateless function of its input or a tf.data op with checkpointable state, so the same seed gives
the same rows and iterator checkpoints still resume exactly. Evaluation is never packed, so eval
metrics are those of the unpacked data and comparable across runs with and without packing.
"""
import atexit
import concurrent.futures
import hashlib
import json
import re
import time
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf
from google.protobuf import message as protobuf_message
# The one-file reader inside tf.data.TFRecordDataset, which wraps it in a FlatMap over the file
# names: that FlatMap's saved state holds the name it read, absolute, and a restore reopens that
# path (a copied workdir read its source's files). This reader's state is an offset alone.
from tensorflow.python.data.ops.readers import _TFRecordDataset as _OneFileRecords

from bert_jax.io import file_digests, filesystem, training_checkpoints
from data_pipelines import features as F
from data_pipelines import masking as M
from data_pipelines import packing as P

try:  # TensorFlow must never take the accelerators from JAX.
  tf.config.set_visible_devices([], "GPU")
  tf.config.set_visible_devices([], "TPU")
except (RuntimeError, ValueError):  # already initialised, or no such device type
  pass

EXAMPLE_WEIGHT = "example_weight"
# Beside a saved position: its files' digests and the input files it was saved over.
POSITION_FILE = "position.json"


def expand_patterns(file_patterns: Union[str, Sequence[str]]) -> list:
  """Comma lists and globs -> sorted file list; a pattern matching nothing is an error."""
  if isinstance(file_patterns, str):
    file_patterns = [p for p in file_patterns.split(",") if p.strip()]
  files = []
  for pattern in file_patterns:
    matched = sorted(tf.io.gfile.glob(pattern.strip()))  # local paths and gs:// URLs
    if not matched:
      raise FileNotFoundError(f"No input files match {pattern!r}")
    files.extend(matched)
  if not files:
    raise FileNotFoundError("No input files given")
  return files


def relative_inputs(files: Sequence[str]) -> Tuple[str, List[str]]:
  """(prefix, names), each file being prefix + name: the prefix is the files' deepest common
  folder (with its trailing "/"), the only part of a path that differs between a workdir and a
  copy of it. The pipeline's saved state holds the names; the prefix is the running config's."""
  paths = [f if filesystem.is_url(f) else filesystem.absolute(f) for f in files]
  folders = [path[:path.rfind("/") + 1] for path in paths]
  common = folders[0]
  for folder in folders[1:]:
    while not folder.startswith(common):
      common = common[:common.rstrip("/").rfind("/") + 1]
  return common, [path[len(common):] for path in paths]


def _records_below(prefix: str) -> Callable[[tf.Tensor], tf.data.Dataset]:
  """name -> the records of the file prefix + name (the prefix is in the function, not in the
  name that tf.data saves with a position)."""
  return lambda name: _OneFileRecords(tf.strings.join([prefix, name]))


def _content_key(path: str) -> Tuple[int, str]:
  """(size, SHA-256 of the first 64 KiB) of a file: what tells its content from another's
  without reading it whole (records files are gigabytes)."""
  with filesystem.open(path, "rb") as f:
    head = f.read(1 << 16)
  return filesystem.getsize(path), hashlib.sha256(head).hexdigest()


def input_manifest(files: Sequence[str]) -> List[list]:
  """[[name below the common folder, size, digest of the first 64 KiB], ...] of `files`, in
  order: the input a saved position belongs to, wherever the files are."""
  _, names = relative_inputs(files)
  with concurrent.futures.ThreadPoolExecutor(min(16, len(files))) as pool:
    keys = list(pool.map(_content_key, files))
  return [[name, size, digest] for name, (size, digest) in zip(names, keys)]


def _first_features(path: str):
  """The feature map of the first record of `path`; a clear error naming the file when it has no
  record or is not a TFRecord file (cut, overwritten, another kind of file)."""
  try:
    for raw in tf.data.TFRecordDataset(path).take(1):
      return tf.train.Example.FromString(raw.numpy()).features.feature
  except (tf.errors.OpError, protobuf_message.DecodeError) as error:
    detail = getattr(error, "message", str(error)).split("[Op:")[0].strip()
    raise ValueError(f"{path}: not a readable TFRecord file of tf.train.Examples ({detail})"
                     ) from None
  raise ValueError(f"{path}: no records")


def record_kind(path: str) -> str:
  """'static' (masked_lm_* present) or 'dynamic' (is_word_continuation present)."""
  names = set(_first_features(path))
  if F.MASKED_LM_POSITIONS in names:
    return "static"
  if F.IS_WORD_CONTINUATION in names:
    return "dynamic"
  raise ValueError(f"{path}: records have neither {F.MASKED_LM_POSITIONS} (static masking) nor "
                   f"{F.IS_WORD_CONTINUATION} (dynamic masking); features: {sorted(names)}")


def has_nsp_labels(path: str) -> bool:
  """Whether the first record of `path` has next_sentence_labels: False for contiguous instances
  (`create_pretraining_data --instances=contiguous`)."""
  return F.NEXT_SENTENCE_LABELS in _first_features(path)


def has_sequence_ids(path: str) -> bool:
  """Whether the first record of `path` packs documents as sequences (`sequence_ids`;
  `create_pretraining_data --instances=documents`)."""
  return F.SEQUENCE_IDS in _first_features(path)


def instance_form(path: str) -> str:
  """The instances `path` holds, by its first record: `create_pretraining_data.INSTANCES`'
  pairs (NSP labels), documents (sequence ids) or contiguous (neither)."""
  if has_nsp_labels(path):
    return "pairs"
  return "documents" if has_sequence_ids(path) else "contiguous"


def _spec(kind: str, form: str, max_seq_length: int,
          max_predictions_per_seq: int) -> Dict[str, tf.io.FixedLenFeature]:
  nsp, packed = form == "pairs", form == "documents"
  if kind == "static":
    return F.static_feature_spec(max_seq_length, max_predictions_per_seq, nsp, packed)
  return F.dynamic_feature_spec(max_seq_length, nsp, packed)


def feature_spec(file_patterns: Union[str, Sequence[str]], max_seq_length: int,
                 max_predictions_per_seq: int) -> Dict[str, tf.io.FixedLenFeature]:
  """The parsing spec of the records in `file_patterns` (static or dynamic; pairs, contiguous
  instances or documents as sequences: the first file's)."""
  files = expand_patterns(file_patterns)
  return _spec(record_kind(files[0]), instance_form(files[0]), max_seq_length,
               max_predictions_per_seq)


class MissingNspLabelsError(ValueError):
  """An NSP objective asked of records without next_sentence_labels (contiguous instances)."""


class RecordFormatError(ValueError):
  """A record that does not hold the features the run reads (names the file and record)."""


def record_problem(serialized: bytes, spec: Dict[str, tf.io.FixedLenFeature]) -> Optional[str]:
  """Why one serialized record does not parse with `spec` (None if it does), in words."""
  try:
    example = tf.train.Example.FromString(serialized)
  except Exception:  # noqa: BLE001 (protobuf's DecodeError has no stable import path)
    return "not a tf.train.Example"
  present = example.features.feature
  for name, feature in spec.items():
    if name not in present:
      return f"feature {name!r} is missing (the record has {sorted(present)})"
    kind = "float_list" if feature.dtype == tf.float32 else "int64_list"
    if present[name].WhichOneof("kind") != kind:
      return f"feature {name!r} holds {present[name].WhichOneof('kind')}, expected {kind}"
    values = len(getattr(present[name], kind).value)
    if values != feature.shape[0]:
      return f"feature {name!r} has {values} values, expected {feature.shape[0]}"
  return None


def first_bad_record(files: Sequence[str], spec: Optional[Dict[str, tf.io.FixedLenFeature]],
                     seconds: float = 120.0, records: Optional[int] = None) -> Optional[str]:
  """'PATH: record I: why' of the first unreadable record (truncated, corrupted) or, with `spec`,
  the first that does not parse with it; None if there is none (or none within `seconds`, or
  within the first `records` of each file). What names the file after tf.data's error, which
  says neither the file nor the record."""
  deadline = time.time() + seconds
  for path in files:
    index = 0
    try:
      for serialized in tf.data.TFRecordDataset(path).take(-1 if records is None else records):
        problem = spec and record_problem(serialized.numpy(), spec)
        if problem:
          return f"{path}: record {index}: {problem}"
        index += 1
        if time.time() > deadline:
          return None
    except tf.errors.DataLossError as e:
      return f"{path}: record {index}: unreadable ({tf_error_reason(e)})"
  return None


def check_first_records(files: Sequence[str], spec: Dict[str, tf.io.FixedLenFeature]) -> None:
  """Reads and parses the first record of every file before training starts, so a garbage file
  or one with other features fails now, naming it, not hours later when tf.data reaches it."""
  with concurrent.futures.ThreadPoolExecutor(min(16, len(files))) as pool:
    problems = pool.map(lambda path: first_bad_record([path], spec, records=1), files)
    for problem in problems:
      if problem:
        raise RecordFormatError(f"Bad input record: {problem}")


def process_files(files: Sequence[str], process_index: int, process_count: int):
  """(the files this process reads, None) or, with fewer files than processes, (all files,
  (process_count, process_index)): every process reads them all and keeps every n-th record."""
  if len(files) >= process_count:
    return files[process_index::process_count], None
  return files, (process_count, process_index)


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
    shuffle_buffer_size: int = 10_000, num_parallel_calls=tf.data.AUTOTUNE,
    packing: Optional[P.PackingConfig] = None,
    require_nsp_labels: bool = False) -> tf.data.Dataset:
  """Batches of pre-training features for this process (see the module docstring).

  masking: None passes records through: statically masked records as they are, dynamic records
    unmasked (what the left-to-right objective reads). A MaskingConfig masks dynamic records.
  packing: None for one instance per row; a PackingConfig packs training rows (ignored when
    is_training is False: evaluation stays unpacked).
  require_nsp_labels: the objective trains NSP; records without next_sentence_labels
    (contiguous instances) are then an error naming them. Otherwise such records are read as
    they are and their batches have no next_sentence_labels.
  """
  files = expand_patterns(file_patterns)
  kind = record_kind(files[0])
  form = instance_form(files[0])
  nsp = form == "pairs"
  if require_nsp_labels and not nsp:
    without = _files_without_nsp_labels(files)
    shown = ", ".join(without[:3]) + (f" and {len(without) - 3} more" if len(without) > 3 else "")
    raise MissingNspLabelsError(
        f"The objective needs next_sentence_labels (NSP), but {shown} hold(s) contiguous "
        "instances without them (create_pretraining_data --instances=contiguous): train them "
        "with an objective without NSP (config.objective='mlm' or 'ltr'), or write sentence-"
        "pair records (--instances=pairs)")
  if masking is not None and kind == "static":
    raise ValueError(f"{files[0]} holds statically masked records; read them with masking=None "
                     "(config.data.masking='static'), or write dynamic records")
  if masking is not None and special is None:
    raise ValueError("dynamic masking needs the special-token ids (special=SpecialTokens...)")
  packing = packing if is_training else None
  if packing is not None and kind == "dynamic" and masking is None:
    raise ValueError("packing needs masked_lm_* features (an MLM objective): it does not apply "
                     "to unmasked records (the left-to-right objective)")
  if packing is not None and not nsp:
    # Packing puts several short NSP pairs in one row. Contiguous instances fill their rows
    # (only the last row of each block's stream is shorter), and documents as sequences were
    # packed when they were written: there is nothing to pack.
    raise ValueError(f"packing (config.data.packing) applies to sentence-pair records: {files[0]} "
                     f"holds {form} instances (no next_sentence_labels) that already fill "
                     "their rows; set config.data.packing=False")
  process_index, process_count = _process_info(process_index, process_count)
  if global_batch_size % process_count:
    raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                     f"{process_count} processes")
  batch_size = global_batch_size // process_count
  spec = _spec(kind, form, max_seq_length, max_predictions_per_seq)

  my_files, record_shard = process_files(files, process_index, process_count)
  check_first_records(my_files, spec)
  # Names below the files' folder flow through the pipeline (and into its saved state).
  prefix, names = relative_inputs(my_files)
  dataset = tf.data.Dataset.from_tensor_slices(names)
  if is_training:
    dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.repeat()
    dataset = dataset.interleave(_records_below(prefix), cycle_length=min(len(files), 8),
                                 block_length=1)
  else:
    dataset = dataset.flat_map(_records_below(prefix))
  if record_shard:
    dataset = dataset.shard(*record_shard)
  if is_training:
    dataset = dataset.shuffle(shuffle_buffer_size, seed=seed + 1, reshuffle_each_iteration=True)
  # Packing parses, masks and packs whole windows; rows are batched afterwards.
  dataset = dataset.batch(packing.window if packing else batch_size, drop_remainder=is_training)

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
  if packing:
    dataset = _pack_rows(dataset, packing, max_predictions_per_seq, seed, batch_size,
                         num_parallel_calls)
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_optimization.map_parallelization = True
  dataset = dataset.with_options(options)
  return dataset.prefetch(tf.data.AUTOTUNE)


def _files_without_nsp_labels(files: Sequence[str]) -> list:
  """The files whose first record has no next_sentence_labels, in order."""
  with concurrent.futures.ThreadPoolExecutor(min(16, len(files))) as pool:
    return [path for path, nsp in zip(files, pool.map(has_nsp_labels, files)) if not nsp]


def _pack_rows(windows: tf.data.Dataset, packing: P.PackingConfig, max_predictions: int,
               seed: int, batch_size: int, num_parallel_calls) -> tf.data.Dataset:
  """Windows of masked instances -> batches of `batch_size` packed rows (module docstring)."""
  def pack(index, window):
    rows = _pack_window(window, packing.max_pairs_per_row, max_predictions)
    # Rows come out longest-pairs first; a stateless shuffle mixes them within the window so a
    # batch does not hold only full-length or only many-pair rows.
    order = tf.argsort(tf.random.stateless_uniform(
        tf.shape(rows[F.INPUT_IDS])[:1], seed=tf.stack([tf.cast(seed, tf.int64) + 2, index])))
    return {name: tf.gather(value, order) for name, value in rows.items()}

  dataset = windows.enumerate().map(pack, num_parallel_calls=num_parallel_calls,
                                    deterministic=True)
  return dataset.unbatch().batch(batch_size, drop_remainder=True)


def _pack_window(window: Dict[str, tf.Tensor], max_pairs: int,
                 max_predictions: int) -> Dict[str, tf.Tensor]:
  """`packing.pack_batch` as a tf.data op: [N, ...] instances -> [R, ...] rows, R <= N.

  tf.numpy_function reuses the one packing implementation (first-fit decreasing, a sequential
  loop that TF ops would express only awkwardly). `stateful=False` is the truth (the result is a
  function of the window only) and is what lets tf.data checkpoint iterators through it.
  """
  names = sorted(window)
  seq_len = window[F.INPUT_IDS].shape[1]

  def pack(*arrays):
    rows = P.pack_batch(dict(zip(names, arrays)), max_pairs, max_predictions)
    return [rows[name] for name in P.ROW_FEATURES]

  widths = {P.CLS_POSITIONS: max_pairs, F.NEXT_SENTENCE_LABELS: max_pairs,
            P.NSP_WEIGHTS: max_pairs, F.MASKED_LM_POSITIONS: max_predictions,
            F.MASKED_LM_IDS: max_predictions, F.MASKED_LM_WEIGHTS: max_predictions}
  dtypes = [tf.float32 if name in (F.MASKED_LM_WEIGHTS, P.NSP_WEIGHTS) else tf.int32
            for name in P.ROW_FEATURES]
  values = tf.numpy_function(pack, [window[name] for name in names], dtypes, stateful=False)
  return {name: tf.ensure_shape(value, [None, widths.get(name, seq_len)])   # [R, width]
          for name, value in zip(P.ROW_FEATURES, values)}


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


def tf_error_reason(error: tf.errors.OpError) -> str:
  """A tf.data error's message without TensorFlow's op and function decorations."""
  return re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:.*$", "", error.message.strip(), flags=re.S)


class DataLossError(ValueError):
  """A training or evaluation input file could not be read (truncated or corrupted)."""


class PipelineIterator:
  """Iterator over numpy batches whose position can be saved and restored exactly.

  `dataset`: the pipeline, or a function that builds it. Give the function where the position
  must survive a failed restore: a second iteration of one dataset object reshuffles
  differently (`reshuffle_each_iteration`), while a rebuilt pipeline starts exactly as the first.
  `source` (the files, e.g. `config.data.input_files`) names the input in errors: tf.data's
  "corrupted record at 4032" or "Key: input_ids, Index: 7" says neither which file nor which
  record, so after such an error the files are read again (`first_bad_record`, with `spec` the
  features the pipeline parses) to name them.
  """

  def __init__(self, dataset: Union[tf.data.Dataset, Callable[[], tf.data.Dataset]],
               source: str = "", spec: Optional[Dict[str, tf.io.FixedLenFeature]] = None):
    self._dataset = dataset
    self._source = source
    self._spec = spec
    self._manifest: Optional[List[list]] = None   # input_manifest of this process's files
    self._start()
    _LIVE_ITERATORS.add(self)

  def _start(self) -> None:
    """A fresh iterator at the first batch (also after a failed restore, which leaves tf.data's
    iterator at its end: every next() would raise StopIteration)."""
    dataset = self._dataset() if callable(self._dataset) else self._dataset
    self._iterator = iter(dataset)
    self._checkpoint = tf.train.Checkpoint(iterator=self._iterator)

  def close(self) -> None:
    """Stops the background threads (the iterator is unusable afterwards)."""
    self._iterator = self._checkpoint = None

  def __iter__(self):
    return self

  def __next__(self) -> Dict[str, np.ndarray]:
    try:
      return {k: v.numpy() for k, v in next(self._iterator).items()}
    except tf.errors.DataLossError as e:  # a truncated or corrupted TFRecord file
      files = self._source or "the input files"
      found = self._find_bad_record()
      where = (f"{found}. The file is" if found else
               f"`python -m data_pipelines.check_records --input_files='{files}'` names the "
               "file. A file there is")
      raise DataLossError(
          f"Unreadable record in {files} ({tf_error_reason(e)}): {where} truncated or "
          "corrupted, or was rewritten while this run read it.") from None
    except tf.errors.InvalidArgumentError:  # a record without the features parsed
      found = self._find_bad_record()
      if not found:
        raise
      raise RecordFormatError(f"Bad input record in {self._source}: {found}") from None

  def _files(self) -> List[str]:
    """The files this process reads (as `create_pretraining_dataset` shards them)."""
    files, _ = process_files(expand_patterns(self._source), *_process_info(None, None))
    return files

  def _find_bad_record(self) -> Optional[str]:
    if not self._source:
      return None
    return first_bad_record(self._files(), self._spec)

  def _input_manifest(self) -> Optional[List[list]]:
    """What this iterator reads (None without `source`), computed once: the files do not change
    under a run."""
    if self._source and self._manifest is None:
      self._manifest = input_manifest(self._files())
    return self._manifest

  def skip(self, batches: int) -> None:
    """Moves `batches` batches ahead from the current position (a replay: every batch is read
    and discarded, so the position is exact, as the pipeline is deterministic)."""
    for _ in range(batches):
      next(self._iterator)

  def save(self, directory: str) -> None:
    """The position into `directory`: tf.data's `iterator.*` files, and `position.json` with
    their sizes and SHA-256 (a file damaged later is named, not read as another position) and
    the input files the position belongs to (`input_manifest`). To a URL through a local
    folder, uploaded with every file checked: TensorFlow's checkpoint writer checks nothing it
    writes there."""
    manifest = self._input_manifest()
    with filesystem.local_directory_target(directory) as local:
      self._checkpoint.write(filesystem.join(local, "iterator"))
      state = [name for name in filesystem.listdir(local) if name.startswith("iterator.")]
      record = {"state": file_digests.digests(local, state)}
      if manifest is not None:
        record["files"] = manifest
      filesystem.write_text(filesystem.join(local, POSITION_FILE),
                            json.dumps(record, indent=1) + "\n")

  def restore(self, directory: str) -> None:
    """The position saved in `directory`, over the files this iterator reads now.

    The saved names are relative, so a copied workdir's position applies to the copy's files.
    Where it cannot apply, `InputMovedError` says why and this iterator is left at its first
    batch, for the caller to replay to the position: the files differ from those the position
    was saved over (`position.json`), or a pipeline built without `source` names files that are
    gone. State files that differ from their digests raise `CheckpointDamagedError`."""
    prefix = filesystem.join(directory, "iterator")
    if not tf.io.gfile.glob(prefix + "*"):
      raise FileNotFoundError(f"No input-pipeline state at {prefix}")
    record = _checked_record(directory)
    try:
      self._check_same_input(directory, record)
      self._checkpoint.read(prefix).assert_consumed()
    except tf.errors.NotFoundError as e:
      self._start()
      raise training_checkpoints.InputMovedError(
          f"The input position saved in {prefix} reads files that are no longer there "
          f"({tf_error_reason(e)})") from None
    except Exception:
      self._start()
      raise

  def _check_same_input(self, directory: str, record: Optional[dict]) -> None:
    """Raises InputMovedError unless the position in `directory` was saved over files with the
    names, sizes and first bytes of this iterator's."""
    current = self._input_manifest()
    if current is None:
      return
    if record is None or "files" not in record:
      raise training_checkpoints.InputMovedError(
          f"The input position in {directory} has no record of its input files "
          f"({POSITION_FILE})")
    if record["files"] != current:
      raise training_checkpoints.InputMovedError(
          f"The input position saved in {directory} is of other input files than "
          f"{self._source} holds now: {_difference(record['files'], current)}")


def _checked_record(directory: str) -> Optional[dict]:
  """`position.json` of a saved position (None if it has none), its state files checked
  against the digests it records."""
  # position.json, and every state file the reader may open, a regular file of the position's
  # folder (`filesystem.confined`): not a link out of it, a FIFO or a device.
  path = filesystem.confined(directory, POSITION_FILE, held_by=directory)
  for name in filesystem.listdir(directory):
    if name.startswith("iterator"):
      filesystem.confined(directory, name, held_by=directory)
  if not filesystem.exists(path):
    return None
  record = json.loads(filesystem.read_text(path))
  try:
    file_digests.check(directory, record["state"], POSITION_FILE)
  except file_digests.DamagedFileError as e:
    raise training_checkpoints.CheckpointDamagedError(f"Damaged input position: {e}") from None
  return record


def _difference(then: List[list], now: List[list]) -> str:
  """In words, the first way the files `now` differ from those `then` (`input_manifest`s)."""
  before, after = {n: (s, d) for n, s, d in then}, {n: (s, d) for n, s, d in now}
  for name, (size, digest) in before.items():
    if name not in after:
      return f"{name} is no longer among them"
    if after[name][0] != size:
      return f"{name} held {size} bytes then, {after[name][0]} now"
    if after[name][1] != digest:
      return f"{name} begins with other bytes than it did"
  added = [name for name in after if name not in before]
  return f"{added[0]} is new among them" if added else "they come in another order"


# Packing runs Python (tf.numpy_function) on tf.data's threads. An iterator still alive when the
# interpreter finalises deadlocks there: its threads wait for the GIL, the main thread for them.
# Closing live iterators at exit, while Python still runs, avoids that.
_LIVE_ITERATORS = weakref.WeakSet()
atexit.register(lambda: [iterator.close() for iterator in list(_LIVE_ITERATORS)])
