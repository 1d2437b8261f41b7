"""Named-entity recognition: CoNLL-2003 / WNUT-17 readers, first-piece features, entity F1.

Spec section 5: every word's label sits on its first WordPiece; the other pieces (and [CLS],
[SEP], padding, context tokens) carry `heads.IGNORE_LABEL` and count neither in the loss nor in
the metric. Optional document context (the paper used maximal document context): the row is
filled with the neighbouring sentences of the same document, only the target sentence scored.

Files: the CoNLL-2003 column format (`word POS chunk NER`, space separated, `-DOCSTART-` lines
start a document, a blank line ends a sentence; IOB1 in the original release, IOB2 in later
copies) and WNUT-17 (`word<TAB>label`). The label is the last column; every line of a file must
have the same number of columns (a wrong one is an error naming the file and line).

Tags are trained in IOB2 (an IOB1 file is converted: I-X that starts an entity becomes B-X, which
keeps every entity). Entity-level precision / recall / F1 follow conlleval's chunk rules, which
seqeval's default mode reproduces: entities are found by `output_kinds.get_entities` (which
also gives predict's entities) and scored here (no runtime dependency; the tests check equality
with seqeval on generated sequences) so that IOB1 and IOB2 gold files score the same.

Shape letters: N rows, S max_seq_length, K labels.
"""
import collections
import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from bert_jax.io import filesystem
from bert_jax.tasks.framework import finetuning, output_kinds
from bert_jax.tasks.framework.output_kinds import get_entities
from bert_jax.tasks.framework.task import BadInput, Task, text_field
from bert_jax.model import heads
from bert_jax.model.heads import IGNORE_LABEL

DOCSTART = "-DOCSTART-"
ENTITY_TYPES = {
    "conll2003": ("PER", "ORG", "LOC", "MISC"),
    "wnut17": ("corporation", "creative-work", "group", "location", "person", "product"),
}
# Default file names inside config.data.data_dir for each dataset and layout.
FILES = {
    ("conll2003", "iob1"): {"train": "eng.train", "dev": "eng.testa", "test": "eng.testb"},
    ("conll2003", "iob2"): {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"},
    ("wnut17", "iob2"): {"train": "wnut17train.conll", "dev": "emerging.dev.conll",
                         "test": "emerging.test.annotated"},
}


def label_list(dataset: str) -> List[str]:
  """O, then B-/I- of every entity type (IOB2), in a fixed order."""
  if dataset not in ENTITY_TYPES:
    raise ValueError(f"Unknown NER dataset {dataset!r}; expected one of {sorted(ENTITY_TYPES)}")
  return ["O"] + [f"{p}-{t}" for t in ENTITY_TYPES[dataset] for p in ("B", "I")]


@dataclasses.dataclass
class Sentence:
  """One sentence: its words and (IOB2) labels, the document it belongs to, and where it is."""
  words: List[str]
  labels: List[str]
  document: int
  source: str = ""


# ------------------------------------------------------------------------------------ reading


def iob1_to_iob2(tags: Sequence[str]) -> List[str]:
  """I-X at the start of an entity becomes B-X; B-X and O are unchanged."""
  out = []
  for i, tag in enumerate(tags):
    if tag.startswith("I-"):
      prev = out[i - 1] if i else "O"
      if prev == "O" or prev[2:] != tag[2:]:
        tag = "B-" + tag[2:]
    out.append(tag)
  return out


def read_conll(path: str, scheme: str = "iob2", labels: Optional[Sequence[str]] = None,
               num_columns: Optional[int] = None) -> List[Sentence]:
  """Sentences of a CoNLL-style column file, labels converted to IOB2.

  scheme: "iob1" or "iob2" (what the file uses). labels: the allowed IOB2 labels (an unknown
  one is an error naming the file and line). num_columns: expected columns per line (default:
  those of the first token line). Tabs separate columns when a line has one, else whitespace.
  """
  if scheme not in ("iob1", "iob2"):
    raise ValueError(f"scheme={scheme!r}: expected 'iob1' or 'iob2'")
  allowed = set(labels) if labels is not None else None
  sentences: List[Sentence] = []
  words: List[str] = []
  tags: List[str] = []
  document, start_line = 0, 0

  def flush():
    if words:
      fixed = iob1_to_iob2(tags) if scheme == "iob1" else list(tags)
      for tag, line in zip(fixed, tag_lines):
        if allowed is not None and tag not in allowed:
          raise ValueError(f"{path}:{line}: unknown label {tag!r} (expected one of "
                           f"{sorted(allowed)})")
      sentences.append(Sentence(list(words), fixed, document, f"{path}:{start_line}"))
    words.clear(), tags.clear(), tag_lines.clear()

  tag_lines: List[int] = []
  with filesystem.open(path, encoding="utf-8") as f:
    for number, raw in enumerate(f, start=1):
      line = raw.rstrip("\r\n")
      if not line.strip():
        flush()
        continue
      columns = line.split("\t") if "\t" in line else line.split()
      if num_columns is None:
        num_columns = len(columns)
        if num_columns < 2:
          raise ValueError(f"{path}:{number}: expected at least 2 columns (word and "
                           f"label), got 1: {line!r}")
      if len(columns) != num_columns:
        raise ValueError(f"{path}:{number}: expected {num_columns} columns, got "
                         f"{len(columns)}: {line!r}")
      if columns[0] == DOCSTART:
        flush()
        if sentences:
          document += 1
        continue
      if not words:
        start_line = number
      words.append(columns[0])
      tags.append(columns[-1])
      tag_lines.append(number)
  flush()
  if not sentences:
    raise ValueError(f"{path}: no sentences")
  return sentences


# ------------------------------------------------------------------------------------ metric


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]
                  ) -> Dict[str, float]:
  """Entity-level micro precision / recall / F1 (exact span and type), plus per-type F1."""
  if len(gold) != len(predicted):
    raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
  true_by_type = collections.Counter()
  pred_by_type = collections.Counter()
  hit_by_type = collections.Counter()
  for i, (g, p) in enumerate(zip(gold, predicted)):
    if len(g) != len(p):
      raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")
    g_set, p_set = set(get_entities(g)), set(get_entities(p))
    for kind, _, _ in g_set:
      true_by_type[kind] += 1
    for kind, _, _ in p_set:
      pred_by_type[kind] += 1
    for kind, _, _ in g_set & p_set:
      hit_by_type[kind] += 1

  def prf(hit, pred, true):
    p = hit / pred if pred else 0.0
    r = hit / true if true else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)

  precision, recall, f1 = prf(sum(hit_by_type.values()), sum(pred_by_type.values()),
                              sum(true_by_type.values()))
  out = {"precision": precision, "recall": recall, "f1": f1}
  for kind in sorted(set(true_by_type) | set(pred_by_type)):
    out[f"f1_{kind}"] = prf(hit_by_type[kind], pred_by_type[kind], true_by_type[kind])[2]
  return out


# ------------------------------------------------------------------------------------ features


def _context_ids(sentences, index, word_ids, budget) -> Tuple[List[int], List[int]]:
  """Tokens of the neighbouring sentences of the same document, alternately before and after,
  until `budget` tokens are used (maximal document context)."""
  before, after = [], []
  left, right = index - 1, index + 1
  document = sentences[index].document
  while budget > 0:
    grew = False
    for side in ("left", "right"):
      j = left if side == "left" else right
      if 0 <= j < len(sentences) and sentences[j].document == document and budget > 0:
        ids = [t for w in word_ids[j] for t in w]
        if side == "left":
          before = ids[-budget:] + before
          left -= 1
        else:
          after = after + ids[:budget]
          right += 1
        budget -= min(len(ids), budget)
        grew = True
    if not grew:
      break
  return before, after


def convert_to_features(sentences: Sequence[Sentence], tokenizer, labels: Sequence[str],
                        max_seq_length: int, document_context: bool = False
                        ) -> Tuple[Dict[str, np.ndarray], np.ndarray, np.ndarray]:
  """Rows of `[CLS] (context) sentence-chunk (context) [SEP]`.

  A sentence longer than max_seq_length - 2 pieces is split into several rows at word
  boundaries. Returns (arrays, example_index [N], word_index [N, S]):
   input_ids, input_mask, segment_ids [N, S] int32 and label_ids [N, S] int32 (the word's
   label id on its first piece, IGNORE_LABEL elsewhere; unknown labels of unlabelled splits
   are 0); word_index is the word of each scored position (-1 elsewhere).
  """
  label_to_id = {label: i for i, label in enumerate(labels)}
  cls_id, sep_id, pad_id, unk_id = (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id,
                                    tokenizer.unk_id)
  budget = max_seq_length - 2
  all_words = [w for s in sentences for w in s.words]
  flat = tokenizer.encode_batch(all_words) if all_words else []
  # A word that tokenises to nothing (only control characters) still needs a position.
  flat = [ids[:budget] or [unk_id] for ids in flat]
  word_ids, k = [], 0
  for s in sentences:
    word_ids.append(flat[k:k + len(s.words)])
    k += len(s.words)

  rows = collections.defaultdict(list)
  example_index, word_index = [], []
  for i, s in enumerate(sentences):
    chunks, current, used = [], [], 0
    for w, ids in enumerate(word_ids[i]):
      if current and used + len(ids) > budget:
        chunks.append(current)
        current, used = [], 0
      current.append(w)
      used += len(ids)
    chunks.append(current)
    for chunk in chunks:
      ids, label_ids, words = [], [], []
      for w in chunk:
        piece_ids = word_ids[i][w]
        ids += piece_ids
        label_ids += [label_to_id.get(s.labels[w], 0)] + [IGNORE_LABEL] * (len(piece_ids) - 1)
        words += [w] + [-1] * (len(piece_ids) - 1)
      before, after = ([], [])
      if document_context and len(chunks) == 1:
        before, after = _context_ids(sentences, i, word_ids, budget - len(ids))
      ids = [cls_id] + before + ids + after + [sep_id]
      label_ids = ([IGNORE_LABEL] * (1 + len(before)) + label_ids +
                   [IGNORE_LABEL] * (len(after) + 1))
      words = [-1] * (1 + len(before)) + words + [-1] * (len(after) + 1)
      pad = max_seq_length - len(ids)
      rows["input_ids"].append(ids + [pad_id] * pad)
      rows["input_mask"].append([1] * len(ids) + [0] * pad)
      rows["segment_ids"].append([0] * max_seq_length)
      rows["label_ids"].append(label_ids + [IGNORE_LABEL] * pad)
      word_index.append(words + [-1] * pad)
      example_index.append(i)
  arrays = {k: np.asarray(v, np.int32).reshape(-1, max_seq_length) for k, v in rows.items()}
  return (arrays, np.asarray(example_index, np.int32),
          np.asarray(word_index, np.int32).reshape(-1, max_seq_length))


def predict_labels(sentences: Sequence[Sentence], labels: Sequence[str],
                   example_index: np.ndarray, word_index: np.ndarray,
                   logits: np.ndarray) -> List[List[str]]:
  """Each word's label from the logits [N, S, K] at its first piece."""
  predicted = [["O"] * len(s.words) for s in sentences]
  best = np.asarray(logits).argmax(-1)                                  # [N, S]
  rows, positions = np.nonzero(word_index >= 0)
  for r, p in zip(rows, positions):
    predicted[example_index[r]][word_index[r, p]] = labels[best[r, p]]
  return predicted


def write_conll(path: str, sentences: Sequence[Sentence], predicted: Sequence[Sequence[str]]
                ) -> str:
  """`word gold predicted` per line, blank line between sentences (conlleval's input)."""
  filesystem.makedirs(filesystem.dirname(path) or ".")
  lines = []
  for s, p in zip(sentences, predicted):
    for word, gold, pred in zip(s.words, s.labels, p):
      lines.append(f"{word} {gold} {pred}\n")
    lines.append("\n")
  filesystem.write_text(path, "".join(lines))
  return path


# ------------------------------------------------------------------ the fine-tuning task


def labels_for(config) -> List[str]:
  return list(config.labels) if config.labels else label_list(config.dataset)


def split_path(config, split: str) -> str:
  explicit = config.data[f"{split}_file"]
  if explicit:
    return explicit
  key = (config.dataset, config.data.scheme)
  if not config.data.data_dir or key not in FILES:
    raise ValueError(f"NER split {split!r}: set --config.data.{split}_file=PATH or "
                     f"--config.data.data_dir=DIR (known layouts: {sorted(FILES)})")
  return filesystem.join(config.data.data_dir, FILES[key][split])


def read_split(config, split: str) -> List[Sentence]:
  return read_conll(split_path(config, split), config.data.scheme, labels_for(config))


def _make_features(config, examples, tokenizer, split):
  arrays, example_index, word_index = convert_to_features(
      examples, tokenizer, labels_for(config), config.max_seq_length, config.document_context)
  return finetuning.Features(arrays, example_index, {"word_index": word_index})


def _predict(config, examples, features, outputs):
  return predict_labels(examples, labels_for(config), features.example_index,
                        features.meta["word_index"], outputs["logits"])


def _write(config, workdir, split, examples, predictions) -> List[str]:
  return [write_conll(filesystem.join(workdir, f"{split}_predictions.txt"), examples, predictions)]


class NerTask(Task):
  """CoNLL-2003 / WNUT-17 named entities (config: experiments/ner.py)."""
  best_metric = "f1"
  eval_splits = ("dev",)
  token_features = ("label_ids",)
  token_outputs = ("logits",)
  output_kind = output_kinds.TAGGING
  input_format = ("[CLS] words [SEP], each word tokenized on its own (its first piece carries "
                  "its label)")

  def __init__(self, config):
    super().__init__(config)
    self.name = f"ner_{config.dataset}"
    self.labels = tuple(labels_for(config))
    self.test_splits = (("test",) if config.data.test_file or config.data.data_dir
                        else ())

  def read_examples(self, split):
    return read_split(self.config, split)

  def make_features(self, examples, tokenizer, split):
    return _make_features(self.config, examples, tokenizer, split)

  def make_head(self):
    return heads.TokenTaggingHead(len(self.labels), self.config.head_dropout)

  def loss(self, outputs, batch):
    return heads.token_tagging_loss(outputs, batch)

  def predict(self, examples, features, outputs):
    return _predict(self.config, examples, features, outputs)

  def metrics(self, examples, predictions):
    return entity_scores([s.labels for s in examples], predictions)

  def write_predictions(self, workdir, split, examples, predictions):
    return _write(self.config, workdir, split, examples, predictions)

  def parse_input(self, record, guid):
    """A sentence (words split at whitespace) / {"words": [...]} or {"text": ...}."""
    del guid
    if "columns" in record:
      words = " ".join(record["columns"]).split()
    elif "words" in record:
      words = record["words"]
      if not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words):
        raise BadInput('"words" must be a list of non-empty strings')
    else:
      words = text_field(record, "text").split()
    if not words:
      raise BadInput("no words")
    return Sentence(list(words), ["O"] * len(words), document=0)

  def signature_notes(self, directory):
    del directory
    return {"tagging": {"scheme": self.config.data.scheme,
                        "document_context": self.config.document_context}}


TASK = NerTask


def run(config, workdir: str) -> Dict:
  return finetuning.run_task(NerTask, config, workdir)
