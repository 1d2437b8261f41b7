"""A pre-training corpus that is on every machine: the documentation inside Python itself.

Documents are the language reference topics (`pydoc_data.topics`, pure prose) and the docstrings of
the standard library's modules, classes and functions, with doctest lines removed. About 2,000
documents and 1.5 MB of English: enough for a small BERT to learn real masked-LM accuracy on a CPU
in minutes, with no download. `prepare()` turns it into what a pre-training run needs (a WordPiece
vocabulary and dynamic-masking TFRecords) inside the workdir, once; later runs reuse the files.
"""
import ast
import os
import re
import sysconfig
from typing import Iterator, List

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")
_SKIP_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "turtledemo"}
_MIN_CHARS = 200


def _sentences(text: str) -> List[str]:
  """Paragraph text -> sentences (one per line in the output), doctest and code lines dropped."""
  sentences = []
  for paragraph in re.split(r"\n\s*\n", text):
    lines = [l.strip() for l in paragraph.splitlines()]
    if any(l.startswith((">>>", "...", "$ ")) for l in lines):
      continue  # an example session, not prose
    joined = " ".join(l for l in lines if l)
    sentences.extend(s.strip() for s in _SENTENCE_END.split(joined) if len(s.strip()) > 1)
  return sentences


def _docstrings() -> Iterator[str]:
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
    sentences = _sentences(text)
    if len(sentences) < 2:
      continue
    yield sentences
    count += 1
    if max_documents and count >= max_documents:
      return


def write_corpus(path: str, max_documents: int = 0, skip_documents: int = 0,
                 every: int = 1, offset: int = 0) -> int:
  """Writes the corpus in BERT's input format (sentence per line, blank line between docs).

  `every`/`offset` select every n-th document (used to hold out an evaluation split).
  Returns the number of documents written.
  """
  written = 0
  with open(path, "w", encoding="utf-8") as f:
    for i, sentences in enumerate(documents(max_documents)):
      if i < skip_documents or (i % every) != offset:
        continue
      f.write("\n".join(sentences) + "\n\n")
      written += 1
  return written
