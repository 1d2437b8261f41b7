"""Raw documents -> what a pre-training run reads, built once into WORKDIR/data.

Used by the demo (Python's documentation) and by continued pre-training on a user's text files
(`config.data.text_files`). Every `holdout_every`-th document goes to the held-out split; the
vocabulary is the run's (`config.tokenizer.vocab_file` / `spm_model_file` / `tokenizer_file`, e.g.
a checkpoint's) or, if none is given, a WordPiece vocabulary of `config.model.vocab_size` learned
on the training documents. Records use dynamic masking and hold sentence pairs with NSP labels,
or, with `config.data.instances="contiguous"`, contiguous full-length instances without them. A
later run (a resume) finds WORKDIR/data/DONE and reuses the files, so the data never changes under
a running experiment (asking for the other kind of instances then is an error).
"""
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


def prepare(config, workdir: str, documents: Callable[[], Iterable[List[str]]],
            description: str) -> Dict[str, Any]:
  """Builds WORKDIR/data once; returns the config changes that point a run at it
  ({"data.input_files": ..., "tokenizer.vocab_file": ..., "model.vocab_size": ...}: apply them
  with `config.update_from_flattened_dict` or `config_names.replaced`). `config` is not changed.

  documents: called only when the data is built (a resume never reads the corpus again).
  Of several processes of one run, process 0 builds and the others wait for its DONE marker
  (they share the workdir: two builders would write into each other's half-written files).
  """
  from data_pipelines import create_pretraining_data
  data_dir = filesystem.join(workdir, "data")
  paths = {name: filesystem.join(data_dir, name)
           for name in ("train.txt", "eval.txt", "vocab.txt", "train.tfrecord", "eval.tfrecord")}
  given_vocab = (config.tokenizer.vocab_file or config.tokenizer.spm_model_file
                 or config.tokenizer.tokenizer_file)
  # The vocabulary the records' ids index, kept in WORKDIR/data (a given one copied there, so
  # that fine-tuning from this workdir finds it).
  vocab_name = ("vocab.txt" if not given_vocab or config.tokenizer.vocab_file else
                "spm.model" if config.tokenizer.spm_model_file else "tokenizer.json")
  instances = config.data.instances
  if instances not in create_pretraining_data.INSTANCES:
    raise ValueError(f"config.data.instances={instances!r}: expected one of "
                     f"{create_pretraining_data.INSTANCES}")
  if instances == "contiguous" and config.objective == "mlm_nsp":
    raise ValueError("config.data.instances='contiguous' writes records without NSP labels, but "
                     "config.objective='mlm_nsp' trains NSP: use --config.objective=mlm (or ltr), "
                     "or config.data.instances='pairs'")
  done = filesystem.join(data_dir, DONE)
  if not outputs.is_writer():
    _wait_for(done)
  elif not filesystem.exists(done):
    _build(config, paths, data_dir, documents, description, given_vocab, vocab_name)
  _check_instances(paths["train.tfrecord"], instances)
  _check_vocabulary(done, data_dir, vocab_name, given_vocab)
  changes: Dict[str, Any] = {
      "data.input_files": paths["train.tfrecord"],
      # Evaluation on other held-out records (e.g. another corpus's) when the config names them.
      "data.eval_input_files": config.data.eval_input_files or paths["eval.tfrecord"],
      "data.masking": "dynamic"}
  if not given_vocab:
    changes.update({"tokenizer.vocab_file": paths["vocab.txt"], "tokenizer.do_lower_case": True,
                    "model.vocab_size": _tokenizer(config, paths["vocab.txt"]).vocab_size})
  return changes


def _build(config, paths, data_dir: str, documents, description: str, given_vocab: str,
           vocab_name: str) -> None:
  """The corpus, vocabulary and records written into `data_dir`, then DONE: the number of
  documents and the digest of the vocabulary the records were made with."""
  from data_pipelines import build_vocab, create_pretraining_data
  filesystem.makedirs(data_dir)
  print(f"Building pre-training records from {description} in {data_dir} ...", flush=True)
  train_docs, eval_docs = write_corpus(documents(), paths["train.txt"], paths["eval.txt"],
                                       config.data.holdout_every)
  if not given_vocab:
    build_vocab.train_wordpiece([paths["train.txt"]], paths["vocab.txt"],
                                vocab_size=config.model.vocab_size, do_lower_case=True)
  elif filesystem.absolute(given_vocab) != filesystem.absolute(
      filesystem.join(data_dir, vocab_name)):   # not the copy itself
    filesystem.copy(given_vocab, filesystem.join(data_dir, vocab_name))
  tokenizer = _tokenizer(config, paths["vocab.txt"])
  for split in ("train", "eval"):
    create_pretraining_data.create_pretraining_data(
        [paths[f"{split}.txt"]], [paths[f"{split}.tfrecord"]], tokenizer,
        max_seq_length=config.max_seq_length,
        max_predictions_per_seq=config.max_predictions_per_seq, random_seed=config.seed,
        dupe_factor=config.data.dupe_factor if split == "train" else 1,
        masking="dynamic", instances=config.data.instances, progress=False)
  _write_done(filesystem.join(data_dir, DONE),
              {"train_documents": train_docs, "eval_documents": eval_docs,
               "vocabulary": file_digests.digests(data_dir, [vocab_name])})


def _write_done(path: str, record: Dict[str, Any]) -> None:
  filesystem.write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")


def _read_done(path: str) -> Dict[str, Any]:
  """DONE's record; {} for the one line of text that earlier versions wrote."""
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


def _check_vocabulary(done: str, data_dir: str, vocab_name: str, given_vocab: str) -> None:
  """The vocabulary in WORKDIR/data (and a given one) is the one the records were built with:
  the records hold its ids, so another file (edited, cut short, replaced) would train on other
  tokens without a sign. DONE of an earlier version records no digest: recorded now."""
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
  """Reused records must be the kind of instances the run asks for (NSP labels or none)."""
  from data_pipelines import input_pipeline
  built = "pairs" if input_pipeline.has_nsp_labels(records) else "contiguous"
  if built != instances:
    raise ValueError(f"{records} holds {built} instances (built by an earlier run in this "
                     f"workdir), but config.data.instances={instances!r}: use a new workdir, or "
                     f"config.data.instances={built!r}")


def _tokenizer(config, learned_vocab: str):
  if (config.tokenizer.vocab_file or config.tokenizer.spm_model_file
      or config.tokenizer.tokenizer_file):
    return tokenization.create_tokenizer(vocab_file=config.tokenizer.vocab_file or None,
                                         spm_model_file=config.tokenizer.spm_model_file or None,
                                         tokenizer_file=config.tokenizer.tokenizer_file or None,
                                         do_lower_case=config.tokenizer.do_lower_case)
  return tokenization.FullTokenizer(learned_vocab, do_lower_case=True)
