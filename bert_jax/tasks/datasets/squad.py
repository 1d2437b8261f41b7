"""SQuAD v1.1 / v2.0: reading, windowed features and n-best post-processing (spec section 5).

The feature layout follows the original `run_squad.py`:
  * `[CLS] question [SEP] passage-window [SEP]`, the question truncated to `max_query_length`;
  * the passage is split into windows of at most `max_seq_length - len(question) - 3` tokens that
    start `doc_stride` tokens apart;
  * a token is scored only in the window where it has the most context,
    `min(left, right) + 0.01 * window_length`;
  * a training answer that is not wholly inside a window (and every unanswerable question) is
    labelled at `[CLS]` (position 0).

One deliberate difference: instead of the original's heuristic `get_final_text` (re-tokenise the
prediction and align it with the whitespace-split passage), every WordPiece keeps the character
span it came from in the ORIGINAL passage. A predicted span (start token, end token) is then
`context[char_start[start]:char_end[end]]`, exact for lower-cased vocabularies, stripped accents,
punctuation glued to words and odd whitespace. The same spans place the gold answers on tokens.

Features are numpy arrays (model inputs plus the per-token character spans that post-processing
needs), so any loop can batch them. Shape letters: N features, S max_seq_length.
"""
import collections
import dataclasses
import json
import logging
import unicodedata
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from bert_jax.io import filesystem
from bert_jax.tasks.framework import best_model, finetuning, output_kinds
from bert_jax.tasks.framework.task import Task, columns, text_field
from bert_jax.model import heads
from bert_jax.tasks.datasets import squad_metrics
from bert_jax.text import tokenization
from bert_jax.text.pairs import join_pair

log = logging.getLogger(__name__)

# Defaults of the original run_squad.py.
MAX_SEQ_LENGTH = 384
DOC_STRIDE = 128
MAX_QUERY_LENGTH = 64
N_BEST_SIZE = 20
MAX_ANSWER_LENGTH = 30


@dataclasses.dataclass
class SquadExample:
  """One question on one passage. `answers` are (text, character start) pairs."""
  qas_id: str
  question_text: str
  context_text: str
  answers: List[Tuple[str, int]]
  is_impossible: bool = False
  title: str = ""


@dataclasses.dataclass
class ReadStats:
  """What the reader skipped, so callers can report it."""
  num_questions: int = 0
  num_skipped: int = 0
  skipped_ids: List[str] = dataclasses.field(default_factory=list)


# ------------------------------------------------------------------------------------ reading


def answer_matches_context(context: str, text: str, start: int) -> bool:
  """The gold answer text is found in the passage at its character offset."""
  return 0 <= start and bool(text) and context[start:start + len(text)] == text


class SquadDataError(ValueError):
  """A SQuAD file without the official layout (names the file and the JSON path)."""


def _field(record, name: str, kind: type, where: str):
  """record[name], which must be a `kind`; else an error naming the JSON path."""
  if not isinstance(record, dict):
    raise SquadDataError(f"{where}: expected a JSON object, got {type(record).__name__}")
  if name not in record:
    raise SquadDataError(f"{where}: missing {name!r}")
  value = record[name]
  if not isinstance(value, kind) or isinstance(value, bool):
    names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
    raise SquadDataError(f"{where}.{name}: expected {names}, got {type(value).__name__}")
  return value


def examples_from_articles(articles: Sequence[dict], is_training: bool, source: str = "SQuAD",
                           stats: Optional[ReadStats] = None) -> List[SquadExample]:
  """Examples from the `data` list of a SQuAD JSON file (v1.1 or v2.0, detected per question).

  Training questions keep their first answer (the original requires exactly one); evaluation
  questions keep all of them for the metric. A training answer whose text is not at its offset is
  counted in `stats` and skipped with a warning naming the question id, as the original does.
  A missing or mistyped field is an error naming its JSON path (`FILE: data[0].paragraphs[2]
  .qas[1] (id ...): missing 'question'`).
  """
  stats = stats if stats is not None else ReadStats()
  examples = []
  for a, article in enumerate(articles):
    at_article = f"{source}: data[{a}]"
    for p, paragraph in enumerate(_field(article, "paragraphs", list, at_article)):
      at_paragraph = f"{at_article}.paragraphs[{p}]"
      context = _field(paragraph, "context", str, at_paragraph)
      for q, qa in enumerate(_field(paragraph, "qas", list, at_paragraph)):
        at_question = f"{at_paragraph}.qas[{q}]"
        qid = str(_field(qa, "id", (str, int), at_question))
        at_question += f" (id {qid})"
        question = _field(qa, "question", str, at_question)
        stats.num_questions += 1
        is_impossible = bool(qa.get("is_impossible", False))
        answers = []
        for n, answer in enumerate(qa.get("answers", [])):
          at_answer = f"{at_question}.answers[{n}]"
          answers.append((_field(answer, "text", str, at_answer),
                          _field(answer, "answer_start", int, at_answer)))
        if is_training and not is_impossible:
          if not answers:
            raise SquadDataError(f"{at_question}: answerable but has no answer")
          answers = answers[:1]
          text, start = answers[0]
          if not answer_matches_context(context, text, start):
            log.warning("%s: answer %r is not in the context at offset %d; skipped",
                        at_question, text, start)
            stats.num_skipped += 1
            stats.skipped_ids.append(qid)
            continue
        if is_impossible:
          answers = []
        examples.append(SquadExample(qid, question, context, answers, is_impossible,
                                     article.get("title", "")))
  return examples


def read_squad_json(path: str, is_training: bool,
                    stats: Optional[ReadStats] = None) -> List[SquadExample]:
  """Examples from an official SQuAD v1.1 / v2.0 JSON file."""
  with filesystem.open(path, encoding="utf-8") as f:
    try:
      data = json.load(f)
    except json.JSONDecodeError as e:
      raise SquadDataError(f"{path}:{e.lineno}: not valid JSON ({e})") from None
  if not isinstance(data, dict) or not isinstance(data.get("data"), list):
    raise SquadDataError(f"{path}: not a SQuAD file (no top-level 'data' list)")
  return examples_from_articles(data["data"], is_training, source=path, stats=stats)


def _decode(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def read_tfds(split: str, is_training: bool, name: str = "squad", data_dir: Optional[str] = None,
              stats: Optional[ReadStats] = None) -> List[SquadExample]:
  """Examples from tensorflow-datasets `squad` (`squad/v1.1`, `squad/v2.0`).

  The TFDS records are regrouped into articles so that both sources share one reader.
  """
  import tensorflow_datasets as tfds
  dataset = tfds.load(name, split=split, data_dir=data_dir)
  paragraphs = collections.OrderedDict()
  for record in tfds.as_numpy(dataset):
    context = _decode(record["context"])
    title = _decode(record.get("title", b""))
    answers = record["answers"]
    texts = [_decode(t) for t in answers["text"]]
    starts = [int(s) for s in answers["answer_start"]]
    qa = {"id": _decode(record["id"]), "question": _decode(record["question"]),
          "answers": [{"text": t, "answer_start": s} for t, s in zip(texts, starts)],
          "is_impossible": bool(record.get("is_impossible", not texts))}
    paragraphs.setdefault((title, context), []).append(qa)
  articles = collections.OrderedDict()
  for (title, context), qas in paragraphs.items():
    articles.setdefault(title, []).append({"context": context, "qas": qas})
  data = [{"title": t, "paragraphs": p} for t, p in articles.items()]
  return examples_from_articles(data, is_training, source=f"tfds:{name}/{split}", stats=stats)


def gold_answers_json(examples: Sequence[SquadExample]) -> List[dict]:
  """The examples back in the official `data` layout (what the evaluation reads)."""
  paragraphs = collections.OrderedDict()
  for ex in examples:
    paragraphs.setdefault((ex.title, ex.context_text), []).append({
        "id": ex.qas_id, "question": ex.question_text, "is_impossible": ex.is_impossible,
        "answers": [{"text": t, "answer_start": s} for t, s in ex.answers]})
  articles = collections.OrderedDict()
  for (title, context), qas in paragraphs.items():
    articles.setdefault(title, []).append({"context": context, "qas": qas})
  return [{"title": t, "paragraphs": p} for t, p in articles.items()]


# ------------------------------------------------------------- passage tokens with char spans


def _is_whitespace(c: str) -> bool:
  # The original's word splitter: these five separate words; other Unicode spaces are left to
  # the tokenizer (which turns them into spaces too).
  return c in " \t\r\n" or ord(c) == 0x202F


def split_words(text: str) -> List[Tuple[int, int]]:
  """Whitespace-separated words of `text` as [start, end) character spans (the original split)."""
  spans, start = [], None
  for i, c in enumerate(text):
    if _is_whitespace(c):
      if start is not None:
        spans.append((start, i))
        start = None
    elif start is None:
      start = i
  if start is not None:
    spans.append((start, len(text)))
  return spans


def _normalize_char(c: str, do_lower_case: bool) -> Tuple[str, bool]:
  """What the basic tokenizer makes of one character: (text, stands alone as its own word).

  Mirrors `tokenization.BasicTokenizer` character by character: control characters vanish,
  whitespace becomes a space, lower-casing strips accents (NFD then drop Mn), punctuation and
  CJK ideographs become separate words.
  """
  cp = ord(c)
  cat = unicodedata.category(c)
  if cp == 0 or cp == 0xFFFD or (cat[0] == "C" and c not in "\t\n\r"):
    return "", False
  if cat == "Zs" or c in " \t\n\r":
    return " ", False
  if tokenization.is_punctuation(c) or any(a <= cp <= b for a, b in tokenization.CJK_RANGES):
    return c, True
  if do_lower_case:
    c = unicodedata.normalize("NFD", c.lower())
    c = "".join(ch for ch in c if unicodedata.category(ch) != "Mn")
  return c, False


def _basic_words(text: str, offset: int, do_lower_case: bool) -> List[List[Tuple[str, int]]]:
  """The basic-tokenizer words of `text`, each a list of (normalised char, original index)."""
  words, current = [], []
  for i, c in enumerate(text):
    norm, alone = _normalize_char(c, do_lower_case)
    if norm == " " or alone:
      if current:
        words.append(current)
      current = []
      if alone:
        words.append([(ch, offset + i) for ch in norm])
      continue
    current.extend((ch, offset + i) for ch in norm)
  if current:
    words.append(current)
  return words


def _piece_text(piece: str) -> str:
  if piece.startswith("##"):
    return piece[2:]
  return piece.lstrip("\u2581")  # SentencePiece's word-start marker


def align_pieces(text: str, offset: int, pieces: Sequence[str], do_lower_case: bool,
                 unk_token: str = tokenization.UNK) -> List[Tuple[int, int]]:
  """Character spans [start, end) in the passage of the WordPieces of one whitespace word.

  `text` is the word, found at `offset` in the passage. When the pieces cannot be aligned
  character by character (a special token written in the text, or a context-dependent case
  mapping such as the Greek final sigma), every piece gets the span of the whole word: still
  inside the passage, only coarser.
  """
  whole = [(offset, offset + len(text))] * len(pieces)
  words = _basic_words(text, offset, do_lower_case)
  spans = []
  w, pos = 0, 0
  for piece in pieces:
    if w >= len(words):
      return whole
    word = words[w]
    if piece == unk_token:
      if pos:  # [UNK] always replaces a whole basic word
        return whole
      spans.append((word[0][1], word[-1][1] + 1))
      w += 1
      continue
    piece_text = _piece_text(piece)
    chars = word[pos:pos + len(piece_text)]
    if "".join(ch for ch, _ in chars) != piece_text or not chars:
      return whole
    spans.append((chars[0][1], chars[-1][1] + 1))
    pos += len(piece_text)
    if pos == len(word):
      w, pos = w + 1, 0
  if w != len(words):
    return whole
  return spans


@dataclasses.dataclass
class PassageTokens:
  """The WordPieces of a passage and the [start, end) character span of each."""
  tokens: List[str]
  char_spans: List[Tuple[int, int]]


def tokenize_passage(tokenizer, context: str) -> PassageTokens:
  """Tokenises whitespace word by whitespace word, as the original does, keeping char spans."""
  do_lower_case = getattr(tokenizer, "do_lower_case", False)
  word_spans = split_words(context)
  words = [context[s:e] for s, e in word_spans]
  ids = tokenizer.encode_batch(words) if words else []
  tokens, spans = [], []
  for (start, end), word, word_ids in zip(word_spans, words, ids):
    pieces = tokenizer.convert_ids_to_tokens(word_ids)
    tokens.extend(pieces)
    spans.extend(align_pieces(word, start, pieces, do_lower_case))
  return PassageTokens(tokens, spans)


def answer_token_span(passage: PassageTokens, start: int, end: int) -> Optional[Tuple[int, int]]:
  """First and last passage token overlapping the characters [start, end), or None."""
  hits = [i for i, (s, e) in enumerate(passage.char_spans) if s < end and e > start]
  return (hits[0], hits[-1]) if hits else None


# ------------------------------------------------------------------------------------ features


def doc_windows(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> List[Tuple[int, int]]:
  """(start, length) of each passage window, as the original's sliding-window loop."""
  windows, start = [], 0
  while start < num_tokens:
    length = min(num_tokens - start, max_tokens_for_doc)
    windows.append((start, length))
    if start + length == num_tokens:
      break
    start += min(length, doc_stride)
  return windows


def is_max_context(windows: Sequence[Tuple[int, int]], index: int, position: int) -> bool:
  """Whether window `index` gives passage token `position` its best score
  min(left, right) + 0.01 * length (the first window wins ties)."""
  best_score, best_index = None, None
  for i, (start, length) in enumerate(windows):
    end = start + length - 1
    if position < start or position > end:
      continue
    score = min(position - start, end - position) + 0.01 * length
    if best_score is None or score > best_score:
      best_score, best_index = score, i
  return best_index == index


FEATURE_KEYS = ("input_ids", "input_mask", "segment_ids", "start_positions", "end_positions",
                "example_index", "token_char_start", "token_char_end", "token_is_max_context")


def convert_examples_to_features(examples: Sequence[SquadExample], tokenizer,
                                 max_seq_length: int = MAX_SEQ_LENGTH,
                                 doc_stride: int = DOC_STRIDE,
                                 max_query_length: int = MAX_QUERY_LENGTH
                                 ) -> Dict[str, np.ndarray]:
  """Windowed features of every example (one example can give several features).

  Returns numpy arrays:
    input_ids, input_mask, segment_ids        [N, S] int32
    start_positions, end_positions             [N] int32, the first answer (0 = [CLS])
    example_index                              [N] int32, index into `examples`
    token_char_start, token_char_end           [N, S] int32, the passage characters of each
                                               passage token, -1 elsewhere
    token_is_max_context                       [N, S] bool
  """
  # [CLS] question [SEP] passage [SEP]; RoBERTa's tokenizers join the two with two separators.
  separators = getattr(tokenizer, "pair_separators", 1)
  specials = 2 + separators
  if max_seq_length < max_query_length + specials + 1:
    raise ValueError(f"max_seq_length={max_seq_length} leaves no room for the passage after a "
                     f"question of max_query_length={max_query_length} and {specials} special "
                     "tokens")
  cls_id, sep_id, pad_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
  rows = collections.defaultdict(list)
  passages: Dict[str, PassageTokens] = {}
  for example_index, ex in enumerate(examples):
    if ex.context_text not in passages:  # questions share passages: tokenise each once
      passages[ex.context_text] = tokenize_passage(tokenizer, ex.context_text)
    passage = passages[ex.context_text]
    query_ids = tokenizer.encode_batch([ex.question_text])[0][:max_query_length]
    doc_ids = tokenizer.convert_tokens_to_ids(passage.tokens)
    answer = None
    if ex.answers and not ex.is_impossible:
      text, start = ex.answers[0]
      answer = answer_token_span(passage, start, start + len(text))
    max_tokens_for_doc = max_seq_length - len(query_ids) - specials
    windows = doc_windows(len(doc_ids), max_tokens_for_doc, doc_stride)
    doc_offset = len(query_ids) + 1 + separators  # [CLS] question [SEP] (or </s></s>)
    for w, (w_start, w_len) in enumerate(windows):
      ids, segments = join_pair(query_ids, doc_ids[w_start:w_start + w_len], cls_id, sep_id,
                                separators)
      char_start = np.full(max_seq_length, -1, np.int32)
      char_end = np.full(max_seq_length, -1, np.int32)
      max_context = np.zeros(max_seq_length, bool)
      for j in range(w_len):
        s, e = passage.char_spans[w_start + j]
        char_start[doc_offset + j], char_end[doc_offset + j] = s, e
        max_context[doc_offset + j] = is_max_context(windows, w, w_start + j)
      start_pos = end_pos = 0
      if answer is not None and w_start <= answer[0] and answer[1] < w_start + w_len:
        start_pos = answer[0] - w_start + doc_offset
        end_pos = answer[1] - w_start + doc_offset
      pad = max_seq_length - len(ids)
      rows["input_ids"].append(ids + [pad_id] * pad)
      rows["input_mask"].append([1] * len(ids) + [0] * pad)
      rows["segment_ids"].append(segments + [0] * pad)
      rows["start_positions"].append(start_pos)
      rows["end_positions"].append(end_pos)
      rows["example_index"].append(example_index)
      rows["token_char_start"].append(char_start)
      rows["token_char_end"].append(char_end)
      rows["token_is_max_context"].append(max_context)
  if not rows:
    return {k: np.zeros((0, max_seq_length) if k.startswith(("input", "segment", "token"))
                        else (0,), bool if k == "token_is_max_context" else np.int32)
            for k in FEATURE_KEYS}
  out = {k: np.asarray(v, np.int32) for k, v in rows.items() if k != "token_is_max_context"}
  out["token_is_max_context"] = np.asarray(rows["token_is_max_context"], bool)
  return out


MODEL_INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")


# ----------------------------------------------------------------------------- post-processing


@dataclasses.dataclass
class Predictions:
  """What post-processing writes: official predictions, n-best lists, v2.0 null odds.

  `best_non_null` is the best non-empty answer of every question (used to tune the threshold).
  """
  predictions: Dict[str, str]
  nbest: Dict[str, List[dict]]
  null_odds: Dict[str, float]
  best_non_null: Dict[str, str]


def _top_indices(logits: np.ndarray, n: int) -> np.ndarray:
  return np.argsort(-logits, kind="stable")[:n]


def _softmax(scores: Sequence[float]) -> List[float]:
  x = np.asarray(scores, np.float64)
  x = np.exp(x - x.max())
  return list(x / x.sum())


def postprocess(examples: Sequence[SquadExample], features: Dict[str, np.ndarray],
                start_logits: np.ndarray, end_logits: np.ndarray, *,
                n_best_size: int = N_BEST_SIZE, max_answer_length: int = MAX_ANSWER_LENGTH,
                version_2_with_negative: bool = False,
                null_score_diff_threshold: float = 0.0) -> Predictions:
  """Best answer of every example from the logits of all its windows (the original algorithm).

  start_logits, end_logits: [N, S], one row per feature. Candidates are the n_best_size best
  start and end positions of every window, kept when both are passage tokens, the start is
  scored in this window (max context), end >= start and the span has at most
  max_answer_length tokens. With v2.0 the null score is the smallest [CLS] score over the
  windows; a question is answered "" when null - best_non_null > null_score_diff_threshold.
  """
  start_logits = np.asarray(start_logits, np.float64)
  end_logits = np.asarray(end_logits, np.float64)
  by_example = collections.defaultdict(list)
  for f, ex_index in enumerate(features["example_index"]):
    by_example[int(ex_index)].append(f)
  char_start, char_end = features["token_char_start"], features["token_char_end"]
  max_context = features["token_is_max_context"]

  out = Predictions({}, {}, {}, {})
  for ex_index, ex in enumerate(examples):
    candidates = []  # (score, start_logit, end_logit, char start, char end)
    null = None      # (score, start_logit, end_logit)
    for f in by_example.get(ex_index, []):
      s_log, e_log = start_logits[f], end_logits[f]
      if version_2_with_negative:
        score = s_log[0] + e_log[0]
        if null is None or score < null[0]:
          null = (score, s_log[0], e_log[0])
      for i in _top_indices(s_log, n_best_size):
        if char_start[f, i] < 0 or not max_context[f, i]:
          continue
        for j in _top_indices(e_log, n_best_size):
          if char_start[f, j] < 0 or j < i or j - i + 1 > max_answer_length:
            continue
          candidates.append((s_log[i] + e_log[j], s_log[i], e_log[j],
                             int(char_start[f, i]), int(char_end[f, j])))
    candidates.sort(key=lambda c: -c[0])
    nbest, seen = [], set()
    for score, s, e, c0, c1 in candidates:
      if len(nbest) >= n_best_size:
        break
      text = ex.context_text[c0:c1]
      if text in seen:  # the same text from another window or span: keep the best only
        continue
      seen.add(text)
      nbest.append({"text": text, "start_logit": s, "end_logit": e})
    if version_2_with_negative and null is not None and "" not in seen:
      nbest.append({"text": "", "start_logit": null[1], "end_logit": null[2]})
    if not nbest:  # no valid span at all (the original's placeholder)
      nbest.append({"text": "empty", "start_logit": 0.0, "end_logit": 0.0})
    nbest.sort(key=lambda n: -(n["start_logit"] + n["end_logit"]))
    probs = _softmax([n["start_logit"] + n["end_logit"] for n in nbest])
    out.nbest[ex.qas_id] = [
        {"text": n["text"], "probability": float(p), "start_logit": float(n["start_logit"]),
         "end_logit": float(n["end_logit"])} for n, p in zip(nbest, probs)]
    non_null = next((n for n in nbest if n["text"]), None)
    out.best_non_null[ex.qas_id] = non_null["text"] if non_null else ""
    if not version_2_with_negative:
      out.predictions[ex.qas_id] = nbest[0]["text"]
      continue
    best_score = non_null["start_logit"] + non_null["end_logit"] if non_null else -np.inf
    null_score = null[0] if null is not None else -np.inf
    diff = float(null_score - best_score)
    out.null_odds[ex.qas_id] = diff if np.isfinite(diff) else (1e9 if diff > 0 else -1e9)
    answer_null = non_null is None or diff > null_score_diff_threshold
    out.predictions[ex.qas_id] = "" if answer_null else non_null["text"]
  return out


def apply_null_threshold(predictions: Predictions, threshold: float) -> Dict[str, str]:
  """Official predictions for a given null threshold: "" when null_odds > threshold."""
  return {qid: ("" if predictions.null_odds[qid] > threshold else text)
          for qid, text in predictions.best_non_null.items()}


PREDICTIONS_FILE = "predictions.json"
NBEST_FILE = "nbest_predictions.json"
NULL_ODDS_FILE = "null_odds.json"
THRESHOLD_FILE = "squad_null_threshold.json"


def write_predictions(directory: str, predictions: Predictions,
                      official: Optional[Dict[str, str]] = None) -> Dict[str, str]:
  """Writes predictions.json, nbest_predictions.json and (v2.0) null_odds.json; returns paths."""
  filesystem.makedirs(directory)
  files = {PREDICTIONS_FILE: official if official is not None else predictions.predictions,
           NBEST_FILE: predictions.nbest}
  if predictions.null_odds:
    files[NULL_ODDS_FILE] = predictions.null_odds
  paths = {}
  for name, value in files.items():
    paths[name] = filesystem.join(directory, name)
    filesystem.write_text(paths[name], json.dumps(value, indent=2, ensure_ascii=False) + "\n")
  return paths


def save_null_threshold(directory: str, threshold: float, metrics: Optional[dict] = None) -> str:
  """Stores the tuned v2.0 threshold beside the fine-tuned model."""
  filesystem.makedirs(directory)
  path = filesystem.join(directory, THRESHOLD_FILE)
  filesystem.write_text(path, json.dumps({"null_score_diff_threshold": float(threshold),
                                          "tuned_on": metrics or {}}, indent=2) + "\n")
  return path


def load_null_threshold(directory: str, default: Optional[float] = None) -> float:
  """The threshold stored by `save_null_threshold`; `default` (if given) when there is none."""
  path = filesystem.join(directory, THRESHOLD_FILE)
  if not filesystem.exists(path):
    if default is not None:
      return default
    raise FileNotFoundError(f"{path}: no tuned SQuAD v2.0 null threshold (fine-tune with "
                            "dev evaluation first, or pass one explicitly)")
  return float(json.loads(filesystem.read_text(path))["null_score_diff_threshold"])


# ------------------------------------------------------------------ the fine-tuning task


def _read_split(config, split: str) -> List[SquadExample]:
  """`train` / `dev` / `test` from the JSON files in config.data, else from TFDS."""
  data = config.data
  files = {"train": data.train_file, "dev": data.dev_file, "test": data.get("test_file", "")}
  stats = ReadStats()
  if files.get(split):
    examples = read_squad_json(files[split], is_training=(split == "train"), stats=stats)
  elif data.get("tfds_name") and split in ("train", "dev"):
    tfds_split = {"train": "train", "dev": "validation"}[split]
    examples = read_tfds(tfds_split, is_training=(split == "train"), name=data.tfds_name,
                         data_dir=data.get("tfds_data_dir") or None, stats=stats)
  else:
    raise ValueError(f"SQuAD split {split!r}: set --config.data.{split}_file=PATH (official "
                     "JSON) or --config.data.tfds_name=squad/v1.1|squad/v2.0")
  if stats.num_skipped:
    log.warning("SQuAD %s: skipped %d of %d questions whose answer is not at its offset",
                split, stats.num_skipped, stats.num_questions)
  if config.version == "1.1" and any(ex.is_impossible for ex in examples):
    raise ValueError(f"SQuAD split {split!r} has unanswerable questions (v2.0 data): use "
                     "experiments/squad.py:version=2.0")
  return examples


def _make_features(config, examples, tokenizer, split):
  f = convert_examples_to_features(examples, tokenizer, config.max_seq_length, config.doc_stride,
                                   config.max_query_length)
  arrays = {k: f[k] for k in MODEL_INPUT_KEYS + ("start_positions", "end_positions")}
  meta = {k: f[k] for k in ("example_index", "token_char_start", "token_char_end",
                            "token_is_max_context")}
  return finetuning.Features(arrays, f["example_index"], meta)


def _predict(config, examples, features, outputs) -> List[dict]:
  """One dict per example: official text at threshold 0 plus what threshold tuning needs."""
  p = postprocess(examples, features.meta, outputs["start_logits"], outputs["end_logits"],
                  n_best_size=config.n_best_size, max_answer_length=config.max_answer_length,
                  version_2_with_negative=config.version == "2.0",
                  null_score_diff_threshold=config.null_score_diff_threshold)
  return [{"id": ex.qas_id, "text": p.predictions[ex.qas_id], "nbest": p.nbest[ex.qas_id],
           "best_non_null": p.best_non_null[ex.qas_id],
           "null_odds": p.null_odds.get(ex.qas_id)} for ex in examples]  # None for v1.1


def _as_predictions(predictions: Sequence[dict]) -> Predictions:
  return Predictions({p["id"]: p["text"] for p in predictions},
                     {p["id"]: p["nbest"] for p in predictions},
                     {p["id"]: p["null_odds"] for p in predictions if p["null_odds"] is not None},
                     {p["id"]: p["best_non_null"] for p in predictions})


def _metrics(config, examples, predictions) -> Dict[str, float]:
  gold = squad_metrics.gold_from_examples(examples)
  p = _as_predictions(predictions)
  if config.version != "2.0":
    return squad_metrics.evaluate(gold, p.predictions)
  at_config = squad_metrics.evaluate(gold, p.predictions, p.null_odds)
  if not config.tune_null_threshold:
    return dict(at_config, null_threshold=config.null_score_diff_threshold)
  threshold, tuned = squad_metrics.tune_null_threshold(gold, p.best_non_null, p.null_odds)
  # exact / f1 are at the tuned threshold (the paper's protocol: tau chosen on dev).
  return dict(tuned, null_threshold=threshold, exact_at_config_threshold=at_config["exact"],
              f1_at_config_threshold=at_config["f1"])


def _write_predictions(config, workdir, split, examples, predictions) -> List[str]:
  """dev -> WORKDIR/, any other split -> WORKDIR/<split>/. v2.0: the threshold tuned on dev is
  stored in WORKDIR/best/ (beside the fine-tuned model) and applied to every other split."""
  p = _as_predictions(predictions)
  directory = workdir if split == "dev" else filesystem.join(workdir, split)
  best_dir = filesystem.join(workdir, best_model.BEST_DIR)
  official = None
  if config.version == "2.0" and config.tune_null_threshold:
    if split == "dev":
      threshold, metrics = squad_metrics.tune_null_threshold(
          squad_metrics.gold_from_examples(examples), p.best_non_null, p.null_odds)
      save_null_threshold(best_dir, threshold, metrics)
    else:
      # This run's tuned threshold, else the one stored with the model we started from.
      threshold = config.null_score_diff_threshold
      for d in (best_dir, config.init_checkpoint):
        if filesystem.isfile(filesystem.join(d, THRESHOLD_FILE)):
          threshold = load_null_threshold(d)
          break
    official = apply_null_threshold(p, threshold)
  paths = write_predictions(directory, p, official)
  if split == "dev" and config.version == "2.0" and config.tune_null_threshold:
    paths[THRESHOLD_FILE] = filesystem.join(best_dir, THRESHOLD_FILE)
  return list(paths.values())


class SquadTask(Task):
  """SQuAD v1.1 / v2.0 (config: experiments/squad.py)."""
  best_metric = "f1"
  eval_splits = ("dev",)
  token_outputs = ("start_logits", "end_logits")
  output_kind = output_kinds.SPAN
  input_format = ("[CLS] question [SEP] context window [SEP] (long contexts in windows of "
                  "max_seq_length, doc_stride apart)")

  def __init__(self, config):
    if config.version not in ("1.1", "2.0"):
      raise ValueError(f"config.version={config.version!r}: expected '1.1' or '2.0'")
    super().__init__(config)
    self.name = f"squad_v{config.version}"
    self.test_splits = ("test",) if config.data.test_file else ()

  def read_examples(self, split):
    return _read_split(self.config, split)

  def make_features(self, examples, tokenizer, split):
    return _make_features(self.config, examples, tokenizer, split)

  def make_head(self):
    return heads.SpanHead()

  def loss(self, outputs, batch):
    return heads.span_loss(outputs, batch)

  def predict(self, examples, features, outputs):
    return _predict(self.config, examples, features, outputs)

  def metrics(self, examples, predictions):
    return _metrics(self.config, examples, predictions)

  def write_predictions(self, workdir, split, examples, predictions):
    return _write_predictions(self.config, workdir, split, examples, predictions)

  def parse_input(self, record, guid):
    """`question<TAB>context` / {"id": ..., "question": ..., "context": ...}."""
    if "columns" in record:
      question, context = columns(record, ("question", "context"))
    else:
      question, context = text_field(record, "question"), text_field(record, "context")
    return SquadExample(str(record.get("id", guid)), question, context, [])

  def read_input_file(self, path, fmt):
    """squad_json: the official JSON file, every question an example (with its id)."""
    del fmt
    for example in read_squad_json(path, is_training=False):
      yield example.qas_id, example

  def null_threshold(self, directory):
    """v2.0: the threshold tuned on dev and stored in best/, else the config's."""
    if self.config.version != "2.0":
      return None
    return load_null_threshold(directory,
                               default=self.config.null_score_diff_threshold)

  def signature_notes(self, directory):
    notes = {k: self.config[k] for k in (
        "version", "max_query_length", "doc_stride", "max_answer_length", "n_best_size")}
    threshold_file = filesystem.join(directory, THRESHOLD_FILE)
    if filesystem.exists(threshold_file):   # SQuAD v2.0: the tuned "no answer" threshold
      notes.update(json.loads(filesystem.read_text(threshold_file)))
    return {"span": notes}


TASK = SquadTask


def run(config, workdir: str) -> Dict:
  return finetuning.run_task(SquadTask, config, workdir)
