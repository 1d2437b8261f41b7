"""The pre-training corpus: books and Python's documentation cut into documents."""
import os
import random
import re
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple


# A heading line ("Chapter 1", "CHAPTER XII.", "BOOK 3", "ACT II", "Scene 4") ends a document.
_HEADING = re.compile(r"^(chapter|book|act|scene|canto|volume|part|section)\b[\w .:-]{0,30}$",
                      re.IGNORECASE)
_BRACKETED = re.compile(r"^\[.*\]$")                     # "[ Persuasion by Jane Austen 1818 ]"
_SPEAKER = re.compile(r"^[A-Z][A-Za-z' ]{0,40}:$")       # "First Citizen:" (a play's speaker)


def _clean(sentence: str) -> str:
  """Tokenized-text quotes (`` and '') as plain quotes, whitespace normalised."""
  return " ".join(sentence.replace("``", '"').replace("''", '"').split())


def _chunks(sentences: Iterable[Optional[str]], size: int) -> Iterator[List[str]]:
  """Runs of at most `size` sentences; None (a heading) ends the current run."""
  run: List[str] = []
  for sentence in sentences:
    if sentence is None or len(run) >= size:
      if len(run) >= 2:
        yield run
      run = []
    if sentence:
      run.append(sentence)
  if len(run) >= 2:
    yield run


def _line_sentences(text: str) -> Iterator[Optional[str]]:
  """One sentence per line (the Gutenberg files); headings become None, bracketed notes go."""
  for line in text.splitlines():
    line = line.strip()
    if not line or _BRACKETED.match(line):
      continue
    yield None if len(line) <= 40 and _HEADING.match(line) else _clean(line)


def _raw_sentences(text: str) -> Iterator[str]:
  """Raw text with blank lines between paragraphs (tinyshakespeare): speaker lines dropped."""
  from data_pipelines.sentences import split_sentences
  kept = "\n".join(line for line in text.splitlines() if not _SPEAKER.match(line.strip()))
  for sentence in split_sentences(kept):
    yield _clean(sentence)


def text_documents(text_dir: str, sentences_per_document: int) -> Iterator[List[str]]:
  """Documents (lists of sentences) of every *.txt under `text_dir`, in sorted path order.

  A file without blank lines is one sentence per line; one with blank lines is raw text.
  """
  paths = sorted(os.path.join(root, name) for root, _, names in os.walk(text_dir)
                 for name in names if name.endswith(".txt"))
  if not paths:
    raise FileNotFoundError(f"no *.txt under {text_dir}")
  for path in paths:
    with open(path, encoding="utf-8", errors="replace") as f:
      text = f.read()
    raw = re.search(r"\n\s*\n", text) is not None
    sentences = _raw_sentences(text) if raw else _line_sentences(text)
    yield from _chunks(sentences, sentences_per_document)


def corpus_documents(text_dir: str, demo_documents: int,
                     sentences_per_document: int) -> List[Tuple[str, List[str]]]:
  """(source, sentences) of the text files, then of the demo corpus (-1: none, 0: all)."""
  docs = [("text", d) for d in text_documents(text_dir, sentences_per_document)]
  if demo_documents >= 0:
    from data_pipelines import demo_corpus
    docs += [("python_docs", d) for d in demo_corpus.documents(demo_documents)]
  return docs


def write_corpus(docs: Sequence[Tuple[str, List[str]]], train_path: str, eval_path: str,
                 holdout_every: int, seed: int) -> Dict[str, Dict[str, int]]:
  """Shuffled documents in BERT's input format; every `holdout_every`-th to `eval_path`."""
  order = list(range(len(docs)))
  random.Random(seed).shuffle(order)
  counts: Dict[str, Dict[str, int]] = {}
  with open(train_path, "w", encoding="utf-8") as train, \
       open(eval_path, "w", encoding="utf-8") as held_out:
    for position, index in enumerate(order):
      source, sentences = docs[index]
      split = "eval" if position % holdout_every == 0 else "train"
      (held_out if split == "eval" else train).write("\n".join(sentences) + "\n\n")
      entry = counts.setdefault(split, {})
      entry[source] = entry.get(source, 0) + 1
      entry["words"] = entry.get("words", 0) + sum(len(s.split()) for s in sentences)
  return counts
