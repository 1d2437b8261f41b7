"""A pre-training corpus that is on every machine: the documentation inside Python itself.

Documents are the language reference topics (`pydoc_data.topics`, pure prose) and the docstrings of
the standard library's modules, classes and functions, with doctest lines removed. About 2,000
documents and 1.5 MB of English: enough for a small BERT to learn real masked-LM accuracy on a CPU
in minutes, with no download. `corpus()` hands it to `workdir_data.prepare`, which turns it into
what a pre-training run needs (a WordPiece vocabulary and dynamic-masking TFRecords) inside the
workdir, once; later runs reuse the files.
"""
import ast
import os
import sysconfig
from typing import Iterator, List

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


def corpus(max_documents: int = 0):
  """The demo corpus for `workdir_data.prepare` (its vocabulary and dynamic-masking records built
  into WORKDIR/data once; a given vocabulary instead: continued pre-training of a released
  checkpoint on this corpus)."""
  from data_pipelines import workdir_data
  return workdir_data.Corpus(lambda: documents(max_documents),
                             "the demo corpus (Python's documentation)")
