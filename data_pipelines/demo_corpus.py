"""A pre-training corpus that is on every machine: the documentation inside Python itself.

Documents are the language reference topics (`pydoc_data.topics`, pure prose) and the docstrings of
the standard library's modules, classes and functions, with doctest lines removed. About 2,000
documents and 1.5 MB of English: enough for a small BERT to learn real masked-LM accuracy on a CPU
in minutes, with no download. `prepare()` turns it into what a pre-training run needs (a WordPiece
vocabulary and dynamic-masking TFRecords) inside the workdir, once; later runs reuse the files.
"""
import ast
import os
import sysconfig
from typing import Iterator, List

from bert_jax.io import filesystem
from data_pipelines.sentences import split_sentences

_SKIP_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "turtledemo"}
_MIN_CHARS = 200


def _docstrings() -> Iterator[str]:
  # The local Python installation's own files: plain os/open calls.
  root = sysconfig.get_paths()["stdlib"]
  for dirpath, dirnames, files in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    for name in sorted(files):
      if not name.endswith(".py"):
        continue
      try:
        with open(os.path.join(dirpath, name), encoding="utf-8") as f:
          tree = ast.parse(f.read())
      except (SyntaxError, UnicodeDecodeError, ValueError):
        continue
      for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
          doc = ast.get_docstring(node)
          if doc and len(doc) >= _MIN_CHARS:
            yield doc


def _reference_topics() -> Iterator[str]:
  try:
    from pydoc_data import topics
  except ImportError:  # some distributions strip it
    return
  for key in sorted(topics.topics):
    yield topics.topics[key]


def documents(max_documents: int = 0) -> Iterator[List[str]]:
  """Documents as lists of sentences, in a fixed order (deterministic across runs)."""
  count = 0
  for text in list(_reference_topics()) + list(_docstrings()):
    sentences = split_sentences(text)
    if len(sentences) < 2:
      continue
    yield sentences
    count += 1
    if max_documents and count >= max_documents:
      return


def write_corpus(train_path: str, eval_path: str, max_documents: int = 0,
                 holdout_every: int = 20) -> tuple:
  """Writes the corpus in BERT's input format (sentence per line, blank line between documents).

  Every `holdout_every`-th document goes to `eval_path`. Returns (train docs, eval docs).
  """
  counts = [0, 0]
  with filesystem.open(train_path, "w") as train, filesystem.open(eval_path, "w") as held_out:
    for i, sentences in enumerate(documents(max_documents)):
      is_eval = i % holdout_every == 0
      (held_out if is_eval else train).write("\n".join(sentences) + "\n\n")
      counts[is_eval] += 1
  return counts[0], counts[1]


def prepare(config, workdir: str) -> None:
  """Builds the demo's vocabulary and dynamic-masking records in WORKDIR/data (once).

  Fills in `config.data.input_files`, `eval_input_files`, `vocab_file` and sets
  `config.model.vocab_size` to the learned vocabulary's size. A later run (e.g. a resume) finds
  the files and reuses them, so the data never changes under a running experiment.
  """
  from bert_jax.text import tokenization
  from data_pipelines import build_vocab, create_pretraining_data
  data_dir = filesystem.join(workdir, "data")
  done = filesystem.join(data_dir, "DONE")
  paths = {name: filesystem.join(data_dir, name)
           for name in ("train.txt", "eval.txt", "vocab.txt", "train.tfrecord", "eval.tfrecord")}
  if not filesystem.exists(done):
    filesystem.makedirs(data_dir)
    print(f"Building the demo corpus from Python's documentation in {data_dir} ...", flush=True)
    train_docs, eval_docs = write_corpus(paths["train.txt"], paths["eval.txt"],
                                         config.data.get("demo_max_documents", 0))
    build_vocab.train_wordpiece([paths["train.txt"]], paths["vocab.txt"],
                                vocab_size=config.model.vocab_size, do_lower_case=True)
    tokenizer = tokenization.FullTokenizer(paths["vocab.txt"], do_lower_case=True)
    for split in ("train", "eval"):
      create_pretraining_data.create_pretraining_data(
          [paths[f"{split}.txt"]], [paths[f"{split}.tfrecord"]], tokenizer,
          max_seq_length=config.max_seq_length,
          max_predictions_per_seq=config.max_predictions_per_seq, random_seed=config.seed,
          dupe_factor=config.data.get("dupe_factor", 5) if split == "train" else 1,
          masking="dynamic", progress=False)
    filesystem.write_text(done, f"{train_docs} train documents, {eval_docs} eval documents\n")
  with filesystem.open(paths["vocab.txt"]) as f:
    config.model.vocab_size = sum(1 for _ in f)
  config.data.input_files = paths["train.tfrecord"]
  config.data.eval_input_files = paths["eval.tfrecord"]
  config.data.vocab_file = paths["vocab.txt"]
  config.data.do_lower_case = True
  config.data.masking = "dynamic"
