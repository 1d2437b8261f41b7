r"""Sentence embeddings of any model folder: what `bert_jax.embed`, `bert_jax.evaluate_retrieval`
and the sentence-transformers export start from.

`load(path)` reads an encoder, its tokenizer and its `EmbeddingSettings`
(`bert_jax/io/sentence_transformers.py`) from

* a fine-tuned embedding model: a folder with `embedding.json` beside its encoder (a
  `save_pretrained` or transformers folder), or a workdir whose `best/` is one (its files checked
  against `best.json`);
* a sentence-transformers folder (`modules.json`): its pooling, normalisation and max_seq_length;
* any other checkpoint `checkpoints.load_pretrained` reads: `sentence_transformers.DEFAULT`, mean
  pooling and not normalised, said on stderr.

Each setting may be overridden (`pooling`, `normalize`, `max_seq_length`); an unset length is the
model's longest input. `Embedder.encode(texts)` is the texts' vectors, [N, H] float32 in input
order: each text is `[CLS] text [SEP]` cut to max_seq_length (sentence-transformers' truncation),
run through `runtime.inference.BatchedInference` (fixed batches, length buckets, shortest first
and back in order, data-parallel over the devices when there are several) with the model's
pooling (`runtime.inference.encoder_embeddings`). Texts go in chunks of `CHUNK`, so host memory
stays bounded on a corpus of millions.

`embed_file` writes one vector per line of a text file to a `.npy` ([lines, H] float32, row i =
line i). An empty line is embedded as the empty text (`[CLS] [SEP]`), as
`SentenceTransformer.encode("")` does, so rows and lines stay aligned; their count is said.
"""
import dataclasses
import json
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import jax
import numpy as np

from bert_jax import families
from bert_jax.io import checkpoints, filesystem
from bert_jax.io import sentence_transformers as st_format
from bert_jax.io.sentence_transformers import EmbeddingSettings
from bert_jax.model.config import BertConfig
from bert_jax.parallel import sharding
from bert_jax.runtime import inference
from bert_jax.runtime.length_buckets import bucket_length, row_lengths
from bert_jax.tasks.framework import best_model
from bert_jax.text import pairs, tokenization

LENGTH_BUCKET = 32     # tokens: each batch runs at the multiple of 32 holding its longest text
CHUNK = 4096           # texts tokenized and run at a time
PROGRESS_EVERY = 100   # batches between two progress lines on stderr


def to_stderr(line: str) -> None:
  """What is said while a model embeds (where its settings come from, progress): on stderr,
  so that stdout keeps the command's result."""
  print(line, file=sys.stderr, flush=True)


@dataclasses.dataclass
class EmbeddingModel:
  """An encoder with its tokenizer and settings, as `load` found them."""
  source: str                  # the path given
  directory: str               # the folder the model was read from (a workdir's best/)
  bert_config: BertConfig
  params: Dict[str, Any]       # the encoder's parameters (host arrays, the config's layout)
  tokenizer: Any
  settings: EmbeddingSettings  # max_seq_length always set
  settings_source: str         # the file the settings came from, or what they default to
  vocab_files: Dict[str, Optional[str]] = dataclasses.field(default_factory=dict)
  do_lower_case: Optional[bool] = None   # the tokenizer's casing (a tokenizer.json: its own)


def model_folder(path: str) -> str:
  """Where the model of `path` is: `path` (a best/ caught between the renames of a save: the
  complete one beside it), or the best/ of a workdir whose best model embeds."""
  own = best_model.best_location(path) or path
  if filesystem.exists(filesystem.join(own, st_format.EMBEDDING_FILE)) or st_format.is_folder(own):
    return own
  best = best_model.best_location(filesystem.join(path, best_model.BEST_DIR))
  if best and filesystem.exists(filesystem.join(best, st_format.EMBEDDING_FILE)):
    return best
  return own


def _lower_case(directory: str, spm_model_file: Optional[str]) -> bool:
  """The casing of a WordPiece or SentencePiece vocabulary: what tokenizer_config.json records,
  else a best/'s task_config.json, else uncased WordPiece / cased SentencePiece."""
  recorded = checkpoints.recorded_lower_case(directory)
  if recorded is not None:
    return recorded
  task_config = filesystem.join(directory, best_model.TASK_CONFIG)
  if filesystem.exists(task_config):
    value = json.loads(filesystem.read_text(task_config)).get("tokenizer", {}).get(
        "do_lower_case")
    if isinstance(value, bool):
      return value
  return not spm_model_file


def load(path: str, *, pooling: Optional[str] = None, normalize: Optional[bool] = None,
         max_seq_length: Optional[int] = None, dtype: str = "float32",
         do_lower_case: Optional[bool] = None,
         say: Callable[[str], None] = to_stderr) -> EmbeddingModel:
  """The embedding model in `path` (see the module docstring), settings overridden where given;
  `do_lower_case`: a WordPiece or SentencePiece vocabulary's casing if not the recorded one (a
  tokenizer.json's is its own); `say` hears where the settings come from."""
  directory = model_folder(path)
  if filesystem.exists(filesystem.join(directory, best_model.BEST_INFO)):
    best_model.check_best(directory)
  found = st_format.read_settings(directory)
  if found is None:
    settings, origin = st_format.DEFAULT, (
        f"the default of a checkpoint without {st_format.EMBEDDING_FILE} or "
        f"{st_format.MODULES_FILE}")
  else:
    settings, origin = found
  bert_config, params = checkpoints.load_pretrained(directory)
  bert_config = bert_config.replace(dtype=dtype)
  family = families.of(bert_config)
  overrides = {k: v for k, v in (("pooling", pooling), ("normalize", normalize),
                                 ("max_seq_length", max_seq_length)) if v is not None}
  settings = dataclasses.replace(settings, **overrides)
  if settings.max_seq_length is None:
    settings = dataclasses.replace(settings, max_seq_length=int(
        family.max_positions(bert_config) or bert_config.max_position_embeddings))
  family.check_length(bert_config, settings.max_seq_length, directory)
  vocab_file, spm_model_file, tokenizer_file = checkpoints.find_vocab(directory)
  lower_case = None if tokenizer_file else (
      do_lower_case if do_lower_case is not None else _lower_case(directory, spm_model_file))
  tokenizer = tokenization.create_tokenizer(vocab_file, spm_model_file, bool(lower_case),
                                            tokenizer_file)
  family.check_tokenizer(bert_config, tokenizer, vocab_file or spm_model_file or tokenizer_file)
  said = settings.describe() + (f" ({', '.join(sorted(overrides))} as given)" if overrides else "")
  say(f"Embedding with {path}: {said}; settings from {origin}")
  params = checkpoints.to_model_layout({"bert": params["bert"]}, bert_config)["bert"]
  return EmbeddingModel(
      source=path, directory=directory, bert_config=bert_config, params=params,
      tokenizer=tokenizer, settings=settings, settings_source=origin,
      vocab_files={"vocab_file": vocab_file, "spm_model_file": spm_model_file,
                   "tokenizer_file": tokenizer_file},
      do_lower_case=tokenizer.do_lower_case if tokenizer_file else lower_case)


def default_mesh():
  """A 1-D data mesh over this process's devices when it has several, else None (one device)."""
  devices = jax.local_devices()
  return sharding.create_mesh(devices=devices) if len(devices) > 1 else None


class Embedder:
  """Texts -> vectors with one model (see the module docstring)."""

  def __init__(self, model: EmbeddingModel, batch_size: int = 32,
               length_bucket: int = LENGTH_BUCKET, mesh=None):
    if batch_size < 1:
      raise ValueError(f"batch_size={batch_size}: must be >= 1")
    self.model, self.settings = model, model.settings
    self.length_bucket = length_bucket
    apply = inference.encoder_embeddings(model.bert_config, self.settings.pooling,
                                         self.settings.normalize)
    self._run = inference.BatchedInference(apply, batch_size, length_bucket=length_bucket,
                                           mesh=mesh)
    self.batch_size = self._run.batch_size
    self._params = self._run.place(jax.device_put(model.params) if mesh is None
                                   else model.params)

  @property
  def dimension(self) -> int:
    return self.model.bert_config.hidden_size

  def arrays(self, texts: Sequence[str]) -> Dict[str, np.ndarray]:
    """input_ids, input_mask, segment_ids [N, S] of `texts`, S the bucket of the longest."""
    if self.settings.lower_case:
      texts = [text.lower() for text in texts]
    arrays = pairs.encode_pairs(self.model.tokenizer, texts, None, self.settings.max_seq_length)
    width = bucket_length(row_lengths(arrays["input_mask"]), self.length_bucket,
                          self.settings.max_seq_length)
    return {k: v[:, :width] for k, v in arrays.items()}

  def encode(self, texts: Sequence[str],
             on_batch: Optional[Callable[[], None]] = None) -> np.ndarray:
    """[len(texts), H] float32, row i the vector of texts[i]; `on_batch()` after each batch."""
    progress = (lambda done, total: on_batch()) if on_batch else None
    vectors = [np.zeros((0, self.dimension), np.float32)]
    for start in range(0, len(texts), CHUNK):
      arrays = self.arrays(list(texts[start:start + CHUNK]))
      vectors.append(self._run(self._params, arrays, progress)["embedding"])
    return np.concatenate(vectors).astype(np.float32)

  __call__ = encode   # an `encode_fn` for evaluation: list of texts -> [N, H] float32


# ----------------------------------------------------------------------------------- files


def read_lines(path: str) -> Iterator[str]:
  """The lines of a UTF-8 text file without their line ends (a text may be empty)."""
  with filesystem.open(path) as f:
    for line in f:
      yield line.rstrip("\n").rstrip("\r")


def _chunks(lines: Iterator[str], size: int) -> Iterator[List[str]]:
  chunk: List[str] = []
  for line in lines:
    chunk.append(line)
    if len(chunk) == size:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


class Progress:
  """A line on stderr every `every` batches: lines done of all, rate, time left."""

  def __init__(self, lines: int, batch_size: int, every: int = PROGRESS_EVERY,
               say: Callable[[str], None] = to_stderr):
    self.lines, self.batch_size, self.every, self.say = lines, batch_size, every, say
    self.batches, self.start = 0, time.monotonic()

  def __call__(self) -> None:
    self.batches += 1
    if self.batches % self.every:
      return
    done = min(self.batches * self.batch_size, self.lines)
    rate = done / max(time.monotonic() - self.start, 1e-9)
    self.say(f"embedded {done:,} of {self.lines:,} lines ({rate:,.0f} lines/s, "
             f"{(self.lines - done) / rate:,.0f} s left)")


def embed_file(embedder: Embedder, input_path: str, output_path: str,
               say: Callable[[str], None] = to_stderr,
               every: int = PROGRESS_EVERY) -> Dict[str, Any]:
  """One vector per line of `input_path` -> `output_path` (.npy, [lines, H] float32, in line
  order), streamed: written to `OUTPUT.partial` chunk by chunk, renamed when whole. Returns
  {"lines", "empty_lines", "dimension", "output"}."""
  if not filesystem.exists(input_path):
    raise FileNotFoundError(f"Input file not found: {input_path}")
  lines = empty = 0
  for line in read_lines(input_path):   # a first pass: the .npy header holds the row count
    lines += 1
    empty += not line.strip()
  if lines == 0:
    raise ValueError(f"{input_path} has no lines to embed")
  if empty:
    say(f"{input_path}: {empty} empty line(s), embedded as the empty text ([CLS] [SEP]), as "
        "sentence-transformers does (first: line "
        f"{next(i for i, l in enumerate(read_lines(input_path), 1) if not l.strip())})")
  progress = Progress(lines, embedder.batch_size, every, say)
  partial = output_path + ".partial"
  filesystem.makedirs(filesystem.dirname(filesystem.absolute(output_path)))
  with filesystem.open(partial, "wb") as f:
    np.lib.format.write_array_header_1_0(
        f, {"descr": np.dtype(np.float32).str, "fortran_order": False,
            "shape": (lines, embedder.dimension)})
    for chunk in _chunks(read_lines(input_path), CHUNK):
      f.write(np.ascontiguousarray(embedder.encode(chunk, progress), np.float32).tobytes())
  filesystem.rename(partial, output_path)
  return {"lines": lines, "empty_lines": empty, "dimension": embedder.dimension,
          "output": output_path}
