"""Plain text -> sentences, for corpora that are not already one sentence per line.

BERT's input format is one sentence per line with a blank line between documents. Raw documents
(a tensorflow-datasets Wikipedia article, a docstring) are split here: paragraphs at blank lines,
lines of an interactive session (`>>>`, `...`, `$ `) dropped as code, then sentences at `.`, `!`
or `?` followed by whitespace and an upper-case letter, a digit or an opening quote/bracket. The
rule is deliberately simple and language-agnostic enough for Wikipedia-style prose; text in a
language without such punctuation stays one "sentence" per paragraph, which the pre-training
data algorithm handles (a long sentence is truncated like any other).
"""
import re
from typing import List

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\"'\u201c])")
_CODE_PREFIXES = (">>>", "...", "$ ")


def split_sentences(text: str) -> List[str]:
  """Sentences of `text` in order, whitespace-normalised, code-session paragraphs dropped."""
  sentences = []
  for paragraph in re.split(r"\n\s*\n", text):
    lines = [line.strip() for line in paragraph.splitlines()]
    if any(line.startswith(_CODE_PREFIXES) for line in lines):
      continue  # an example session, not prose
    joined = " ".join(line for line in lines if line)
    sentences.extend(s.strip() for s in _SENTENCE_END.split(joined) if len(s.strip()) > 1)
  return sentences
