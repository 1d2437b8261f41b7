"""Raw documents -> what a pre-training run reads, built once into WORKDIR/data.

Used by the demo (Python's documentation, `demo_corpus.corpus`) and by continued pre-training on a
user's text files (`text_files`). Every `holdout_every`-th document goes to the held-out split;
the vocabulary is the run's (`Vocabulary`: a WordPiece vocab.txt, a SentencePiece model or a
tokenizer.json, e.g. a checkpoint's) or, if none is given, a WordPiece vocabulary of
`Settings.learned_vocab_size` learned on the training documents. Records use dynamic masking and
hold sentence pairs with NSP labels, or, with `Settings.instances="contiguous"`, contiguous
full-length instances without them, or with `"documents"` documents as sequences packed into rows
(create_pretraining_data's instance forms). A later run (a resume) finds WORKDIR/data/DONE and reuses the
files, so the data never changes under a running experiment (asking for the other kind of
instances then is an error: `InstancesMismatch`).

Every argument is explicit; the pre-training job translates its config into them
(bert_jax/tasks/jobs/pretraining_data.py).
"""
import dataclasses
import json
import time
from typing import Any, Callable, Dict, Iterable, List, Tuple

from bert_jax.io import file_digests, filesystem, remote_storage
from bert_jax.runtime import outputs
from bert_jax.text import tokenization

DONE = "DONE"
# How long a process other than 0 waits for process 0 to build WORKDIR/data.
WAIT_ENV = "BERT_JAX_DATA_WAIT_SECS"
DEFAULT_WAIT_SECS = 7200.0
_POLL_SECS = 2.0


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Raw documents (lists of sentences) and what to call them in the build's message."""
  documents: Callable[[], Iterable[List[str]]]   # called only when the data is built
  description: str


@dataclasses.dataclass(frozen=True)
class Vocabulary:
  """The run's vocabulary (one file or none; none: a WordPiece vocabulary is learned)."""
  vocab_file: str = ""
  spm_model_file: str = ""
  tokenizer_file: str = ""
  do_lower_case: bool = True

  @property
  def path(self) -> str:
    return self.vocab_file or self.spm_model_file or self.tokenizer_file

  @property
  def name(self) -> str:
    """Its file name in WORKDIR/data (where a given one is copied, so that fine-tuning from the
    workdir finds it; a learned one is written there as vocab.txt)."""
    return ("vocab.txt" if not self.path or self.vocab_file else
            "spm.model" if self.spm_model_file else "tokenizer.json")

  def tokenizer(self):
    return tokenization.create_tokenizer(vocab_file=self.vocab_file or None,
                                         spm_model_file=self.spm_model_file or None,
                                         tokenizer_file=self.tokenizer_file or None,
                                         do_lower_case=self.do_lower_case)


@dataclasses.dataclass(frozen=True)
class Settings:
  """How the records are made (the fields of `create_pretraining_data.create_pretraining_data`
  a run decides, and the split)."""
  max_seq_length: int
  max_predictions_per_seq: int
  seed: int
  dupe_factor: int = 1                # passes over the training documents (held-out: one)
  holdout_every: int = 20
  instances: str = "pairs"            # pairs (NSP labels) | contiguous | documents (none)
  learned_vocab_size: int = 0         # the WordPiece vocabulary learned when none is given


@dataclasses.dataclass(frozen=True)
class Prepared:
  """What WORKDIR/data holds for a run: the records, and the vocabulary learned there (empty
  when the run gave one: the records index that)."""
  train_records: str
  eval_records: str
  learned_vocab_file: str = ""        # WORKDIR/data/vocab.txt, lower-cased WordPiece
  learned_vocab_size: int = 0


class InstancesMismatch(ValueError):
  """Reused records are the other kind of instances than the run asks for."""

  def __init__(self, records: str, built: str, asked: str):
    super().__init__(f"{records} holds {built} instances (built by an earlier run in this "
                     f"workdir), but the run asks for {asked!r} instances: use a new workdir, or "
                     f"instances={built!r}")
    self.records, self.built, self.asked = records, built, asked


def write_corpus(documents: Iterable[List[str]], train_path: str, eval_path: str,
                 holdout_every: int = 20) -> Tuple[int, int]:
  """Documents in BERT's input format (a sentence per line, a blank line between documents);
  every `holdout_every`-th to `eval_path`. Returns (train documents, eval documents)."""
  counts = [0, 0]
  with filesystem.open(train_path, "w") as train, filesystem.open(eval_path, "w") as held_out:
    for i, sentences in enumerate(documents):
      is_eval = i % holdout_every == 0
      (held_out if is_eval else train).write("\n".join(sentences) + "\n\n")
      counts[is_eval] += 1
  if not counts[0] or not counts[1]:
    raise ValueError(f"{counts[0]} training and {counts[1]} held-out documents: need at least "
                     f"one of each (every {holdout_every}th document is held out)")
  return counts[0], counts[1]


def text_files(spec: str) -> Corpus:
  """Raw text in BERT's input format (a comma list and/or globs, expanded now: a missing file is
  an error before anything else), read with the data builder's reader; its statistics printed
  once read."""
  from data_pipelines import build_vocab, create_pretraining_data
  files = build_vocab.expand_input_files(spec)

  def documents():
    stats = create_pretraining_data.Stats()
    yield from create_pretraining_data.documents_from_files(
        files, create_pretraining_data.Options(), stats)
    print(stats.summary(), flush=True)
  return Corpus(documents, f"{len(files)} text file(s)")


def prepare(workdir: str, corpus: Corpus, settings: Settings,
            vocabulary: Vocabulary = Vocabulary()) -> Prepared:
  """Builds WORKDIR/data once from `corpus`; returns where the records (and a learned
  vocabulary) are.

  `corpus.documents` is called only when the data is built (a resume never reads the corpus
  again). Of several processes of one run, process 0 builds and the others wait for its DONE
  marker (they share the workdir: two builders would write into each other's half-written
  files). Reused records of the other kind of instances: `InstancesMismatch`.
  """
  data_dir = filesystem.join(workdir, "data")
  paths = {name: filesystem.join(data_dir, name)
           for name in ("train.txt", "eval.txt", "vocab.txt", "train.tfrecord", "eval.tfrecord")}
  done = filesystem.join(data_dir, DONE)
  if not outputs.is_writer():
    _wait_for(done)
  elif not filesystem.exists(done):
    _build(paths, data_dir, corpus, settings, vocabulary)
  # Every file the run reads from here a regular file of the folder (no link out, no FIFO).
  filesystem.check_tree(data_dir, held_by=data_dir)
  _check_instances(paths["train.tfrecord"], settings.instances)
  _check_vocabulary(done, data_dir, vocabulary)
  if vocabulary.path:
    return Prepared(paths["train.tfrecord"], paths["eval.tfrecord"])
  return Prepared(paths["train.tfrecord"], paths["eval.tfrecord"],
                  learned_vocab_file=paths["vocab.txt"],
                  learned_vocab_size=_learned(paths["vocab.txt"]).vocab_size)


def _build(paths, data_dir: str, corpus: Corpus, settings: Settings,
           vocabulary: Vocabulary) -> None:
  """The corpus, vocabulary and records written into `data_dir`, then DONE: the number of
  documents and the digest of the vocabulary the records were made with."""
  from data_pipelines import build_vocab, create_pretraining_data
  filesystem.makedirs(data_dir)
  print(f"Building pre-training records from {corpus.description} in {data_dir} ...",
        flush=True)
  train_docs, eval_docs = write_corpus(corpus.documents(), paths["train.txt"], paths["eval.txt"],
                                       settings.holdout_every)
  if not vocabulary.path:
    build_vocab.train_wordpiece([paths["train.txt"]], paths["vocab.txt"],
                                vocab_size=settings.learned_vocab_size, do_lower_case=True)
    tokenizer = _learned(paths["vocab.txt"])
  else:
    tokenizer = vocabulary.tokenizer()
    copy = filesystem.join(data_dir, vocabulary.name)
    if filesystem.absolute(vocabulary.path) != filesystem.absolute(copy):   # not the copy itself
      if vocabulary.tokenizer_file:   # one tokenizer.json, whatever it was read from
        filesystem.write_text(copy, tokenizer.tokenizer_json())
      else:
        filesystem.copy(vocabulary.path, copy)
  for split in ("train", "eval"):
    create_pretraining_data.create_pretraining_data(
        [paths[f"{split}.txt"]], [paths[f"{split}.tfrecord"]], tokenizer,
        max_seq_length=settings.max_seq_length,
        max_predictions_per_seq=settings.max_predictions_per_seq, random_seed=settings.seed,
        dupe_factor=settings.dupe_factor if split == "train" else 1,
        masking="dynamic", instances=settings.instances, progress=False)
  _write_done(filesystem.join(data_dir, DONE),
              {"train_documents": train_docs, "eval_documents": eval_docs,
               "vocabulary": file_digests.digests(data_dir, [vocabulary.name])})


def _write_done(path: str, record: Dict[str, Any]) -> None:
  filesystem.write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")


def _read_done(path: str) -> Dict[str, Any]:
  """DONE's record; {} for the one line of text that earlier versions wrote. DONE itself must be
  a regular file of its folder (`filesystem.confined`), not a link out of it or a FIFO."""
  filesystem.confined(filesystem.dirname(path), filesystem.basename(path), held_by=path)
  try:
    record = json.loads(filesystem.read_text(path))
  except ValueError:
    return {}
  return record if isinstance(record, dict) else {}


def wait_secs() -> float:
  return remote_storage.number_from_env(WAIT_ENV, DEFAULT_WAIT_SECS)


def _wait_for(done: str) -> None:
  """Waits (a process other than 0) until process 0 has written `done`."""
  import jax
  if filesystem.exists(done):
    return
  index = jax.process_index()
  limit = wait_secs()
  print(f"Process {index}: waiting for process 0 to build {filesystem.dirname(done)} "
        f"(its {DONE} marker) ...", flush=True)
  deadline = time.monotonic() + limit
  while not filesystem.exists(done):
    if time.monotonic() > deadline:
      raise TimeoutError(
          f"Process {index} waited {limit:.0f} s for {done}, which process 0 writes once it has "
          f"built the run's data, and it did not appear. Every process of a run must see the "
          f"same workdir (gs:// or a shared filesystem; a local path on each host is not "
          f"shared). For data that takes longer to build, raise {WAIT_ENV} or build it "
          f"beforehand (one process, the same command).")
    time.sleep(_POLL_SECS)


def _check_vocabulary(done: str, data_dir: str, vocabulary: Vocabulary) -> None:
  """The vocabulary in WORKDIR/data (and a given one) is the one the records were built with:
  the records hold its ids, so another file (edited, cut short, replaced) would train on other
  tokens without a sign. DONE of an earlier version records no digest: recorded now."""
  vocab_name, given_vocab = vocabulary.name, vocabulary.path
  record = _read_done(done)
  recorded = record.get("vocabulary")
  if not recorded:
    if outputs.is_writer():
      copy = filesystem.join(data_dir, vocab_name)
      if given_vocab and not filesystem.exists(copy):   # a run stopped before copying it
        filesystem.copy(given_vocab, copy)
      record = dict(record, vocabulary=file_digests.digests(data_dir, [vocab_name]))
      _write_done(done, record)
    return
  advice = ("The records in this folder hold the ids of the vocabulary they were built with: "
            "put that file back, or start again in a new workdir.")
  try:
    file_digests.check(data_dir, recorded, done)
  except file_digests.DamagedFileError as error:
    raise file_digests.DamagedFileError(f"{error}. {advice}") from None
  if given_vocab and vocab_name in recorded:
    found = file_digests.digest(given_vocab)
    if found != recorded[vocab_name]:
      raise ValueError(
          f"The run's vocabulary {given_vocab} ({found['bytes']} bytes, SHA-256 "
          f"{found['sha256'][:16]}...) is not the one {data_dir} was built with ("
          f"{filesystem.join(data_dir, vocab_name)}, {recorded[vocab_name]['bytes']} bytes, "
          f"SHA-256 {recorded[vocab_name]['sha256'][:16]}..., recorded in {done}). {advice}")


def _check_instances(records: str, instances: str) -> None:
  """Reused records must be the kind of instances the run asks for (pairs, contiguous or
  documents)."""
  from data_pipelines import input_pipeline
  built = input_pipeline.instance_form(records)
  if built != instances:
    raise InstancesMismatch(records, built, instances)


def _learned(vocab_file: str):
  return tokenization.FullTokenizer(vocab_file, do_lower_case=True)
