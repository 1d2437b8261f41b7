"""BERT tokenization: WordPiece (`FullTokenizer`), SentencePiece (`SentencePieceTokenizer`) and
any Hugging Face `tokenizer.json` (`HuggingFaceTokenizer`: byte-level BPE as ModernBERT ships, or
WordPiece, Unigram ...), all behind one interface; `create_tokenizer` picks one.

`FullTokenizer` gives token for token what the reference gives: Hugging Face's slow Python
`BertTokenizer` (`BertTokenizerLegacy` in transformers 5), which is the original
google-research/bert `tokenization.py` with three differences that we follow because parity with
it is the requirement:
  * special tokens ([PAD] [UNK] [CLS] [SEP] [MASK]) written in the text are cut out before anything
    else and never split or lower-cased;
  * the whole text is NFC-normalised after cleaning (this only changes results when not
    lower-casing, e.g. "e" + U+0301 becomes "é");
  * every Unicode "C*" character is dropped while cleaning (the original drops only Cc and Cf;
    HF also drops private-use Co, unassigned Cn and lone surrogates Cs).
`max_input_chars_per_word` defaults to 200 like the original (HF uses 100).

Engine: normalisation (cleaning, CJK spacing, NFC, lower-casing, accent stripping, punctuation
splitting) runs in Python but only as whole-string C operations (`re.sub`, `str.lower`,
`unicodedata.normalize`) over character classes built from Python's own `unicodedata`, the tables the
reference uses. The greedy WordPiece step runs in Hugging Face `tokenizers` (Rust). We do not use the
Rust `BertNormalizer`/`BertPreTokenizer`: checked codepoint by codepoint they differ from the
reference on about 800 assigned characters (older Unicode tables in Rust, no NFC, no final-sigma
lower-casing), so they cannot give parity. `BasicTokenizer` + `WordpieceTokenizer` are the same
algorithm in pure Python (used when `tokenizers` is missing, and by the tests as a cross-check).
"""
import collections
import json
import re
import threading
import unicodedata
from typing import Dict, Iterable, List, Optional, Sequence, Union

try:  # The fast WordPiece engine; a pure-Python path does the same work without it.
  import tokenizers as _hf_tokenizers
except ImportError:  # pragma: no cover - tokenizers is a declared dependency
  _hf_tokenizers = None

from bert_jax.io import filesystem

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)

# The reference (HF) cuts these out of the raw text with a trie before any normalisation.
_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")
_SPECIAL_SET = frozenset(SPECIAL_TOKENS)

TextLike = Union[str, bytes]


def convert_to_unicode(text) -> str:
  """Returns `text` as `str`. Bytes are decoded as UTF-8 with invalid bytes dropped.

  Dropping (errors="ignore") is what the original BERT code does. Tokens cannot tell it apart from
  errors="replace" except inside a special token: U+FFFD is removed while cleaning anyway, so
  b"ab\\xffcd" gives the same tokens either way, but b"[CL\\xffS]" becomes "[CLS]" only with "ignore".
  """
  if isinstance(text, str):
    return text
  if isinstance(text, (bytes, bytearray)):
    return bytes(text).decode("utf-8", "ignore")
  raise ValueError(f"Unsupported string type: {type(text)}")


def printable_text(text) -> str:
  """The original's helper for logging; in Python 3 the same as `convert_to_unicode`."""
  return convert_to_unicode(text)


def load_vocab(vocab_file: str) -> Dict[str, int]:
  """Ordered token -> id from a file with one token per line (id = line number).

  Read exactly as HF reads it (text mode, only the trailing newline removed) so that both agree on
  every vocabulary. A token listed twice keeps its last id, as in both references.
  """
  if not vocab_file or not filesystem.isfile(vocab_file):
    raise FileNotFoundError(f"WordPiece vocabulary file not found: {vocab_file!r}")
  vocab = collections.OrderedDict()
  with filesystem.open(vocab_file, "r") as reader:
    for index, token in enumerate(reader):
      vocab[token.rstrip("\n")] = index
  if not vocab:
    raise ValueError(f"WordPiece vocabulary file is empty: {vocab_file}")
  return vocab


def convert_by_vocab(vocab, items) -> list:
  """Maps every item through `vocab` (a KeyError names the first unknown item)."""
  return [vocab[item] for item in items]


def ids_to_tokens(inv_vocab: Dict[int, str], ids: Iterable[int], source: str) -> List[str]:
  """The tokens of `ids`; an id outside the vocabulary is an error naming `source`."""
  out = []
  for i in ids:
    i = int(i)
    if i not in inv_vocab:
      raise ValueError(f"Token id {i} is out of range for {source} ({len(inv_vocab)} entries)")
    out.append(inv_vocab[i])
  return out


def whitespace_tokenize(text: str) -> List[str]:
  """Splits on Python whitespace (`str.split()`), as the reference does."""
  return text.split()


# ---------------------------------------------------------------------------------------------
# Character classes, built once from Python's unicodedata (the tables the reference uses).


def _class_from_codepoints(codepoints: Iterable[int]) -> str:
  """A regex character class body, as ranges, for a sorted iterable of code points."""
  parts = []
  start = prev = None
  for cp in codepoints:
    if start is None:
      start = prev = cp
    elif cp == prev + 1:
      prev = cp
    else:
      parts.append((start, prev))
      start = prev = cp
  if start is not None:
    parts.append((start, prev))
  # \\U escapes keep the pattern ASCII and cover surrogates and every plane.
  return "".join(
      f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in parts)


def _char_class(codepoints: Sequence[int]) -> str:
  """A regex matching one character of `codepoints` (sorted), fast on BMP text.

  `re` compiles a class that mixes BMP and astral characters into a list of ranges scanned one by
  one (about 15x slower on our classes of hundreds of ranges); a BMP-only class becomes a
  constant-time bitmap. So: the BMP class, or, behind a one-range look-ahead, the astral class.
  """
  bmp = [cp for cp in codepoints if cp < 0x10000]
  astral = [cp for cp in codepoints if cp >= 0x10000]
  pattern = "[" + _class_from_codepoints(bmp) + "]" if bmp else ""
  if astral:
    astral_pattern = "(?=[\\U00010000-\\U0010ffff])[" + _class_from_codepoints(astral) + "]"
    pattern = f"(?:{pattern}|{astral_pattern})" if pattern else astral_pattern
  return pattern


CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def is_punctuation(char: str) -> bool:
  """The original `_is_punctuation`: all non-alphanumeric ASCII, and every Unicode P* category."""
  cp = ord(char)
  if (33 <= cp <= 47) or (58 <= cp <= 64) or (91 <= cp <= 96) or (123 <= cp <= 126):
    return True
  return unicodedata.category(char).startswith("P")


class _Tables:
  """Compiled regexes for the whole-string normalisation steps."""

  def __init__(self):
    drop, space, mark, punct = [], [], [], []
    category = unicodedata.category
    for cp in range(0x110000):
      char = chr(cp)
      cat = category(char)
      # The reference's _clean_text: drop NUL, U+FFFD and (HF's _is_control) every C* category
      # but tab/newline/CR, which with " " and Zs (_is_whitespace) become spaces. (The original
      # BERT code drops only Cc and Cf; HF, our parity target, also drops Co, Cn and Cs.)
      if cp == 0 or cp == 0xFFFD or (cat[0] == "C" and char not in "\t\n\r"):
        drop.append(cp)
      elif cat == "Zs" or char in " \t\n\r":
        space.append(cp)
      elif cat == "Mn":
        mark.append(cp)
      elif cat[0] == "P" or (33 <= cp <= 47) or (58 <= cp <= 64) or (91 <= cp <= 96) or (
          123 <= cp <= 126):
        punct.append(cp)  # is_punctuation
    self.drop = re.compile(_char_class(drop) + "+")
    self.space = re.compile(_char_class(space))
    self.mark = re.compile(_char_class(mark) + "+")
    # Each punctuation character is its own token: surrounding it with spaces is the same split.
    # Used as " ".join(punct.split(text)): split keeps the captured characters, join adds the
    # spaces, all in C (a "\\1" template would be expanded in Python for every match).
    self.punct = re.compile("(" + _char_class(punct) + ")")
    cjk = "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in CJK_RANGES)
    self.cjk = re.compile("([" + cjk + "])")
    # ASCII fast path: one str.translate does cleaning, whitespace and punctuation splitting.
    table = {}
    for cp in range(128):
      char = chr(cp)
      if cp in (0x09, 0x0A, 0x0D):
        table[cp] = " "
      elif unicodedata.category(char) == "Cc":  # 0-8, 11, 12, 14-31, 127 (0 included)
        table[cp] = None
      elif is_punctuation(char):
        table[cp] = f" {char} "
    self.ascii_table = str.maketrans(table)


_TABLES: Optional[_Tables] = None
_TABLES_LOCK = threading.Lock()


def _tables() -> _Tables:
  global _TABLES
  if _TABLES is None:
    with _TABLES_LOCK:
      if _TABLES is None:
        _TABLES = _Tables()  # ~0.3 s: one pass over all code points
  return _TABLES


class BasicTokenizer:
  """Cleaning, CJK spacing, (lower-casing + accent stripping), punctuation splitting.

  `normalize(text)` returns the words joined by single spaces (what the WordPiece engine consumes);
  `tokenize(text)` returns them as a list. Special tokens in the text are kept whole.
  """

  def __init__(self, do_lower_case: bool = True):
    self.do_lower_case = do_lower_case

  def tokenize(self, text: TextLike) -> List[str]:
    normalized = self.normalize(text)
    return normalized.split(" ") if normalized else []

  def normalize(self, text: TextLike) -> str:
    """The words of `text`, separated by single spaces (no leading/trailing space)."""
    text = convert_to_unicode(text)
    if "[" in text and _SPECIAL_SPLIT.search(text):
      # Pieces alternate: text, special token, text, ... (re.split with one capturing group).
      pieces = _SPECIAL_SPLIT.split(text)
      out = []
      for i, piece in enumerate(pieces):
        normalized = piece if i % 2 else self._normalize_piece(piece)
        if normalized:
          out.append(normalized)
      return " ".join(out)
    return self._normalize_piece(text)

  def _normalize_piece(self, text: str) -> str:
    """The reference `BasicTokenizer.tokenize` on text free of special tokens, as one string."""
    if not text:
      return ""
    t = _tables()
    if text.isascii():
      # Cleaning can join "[CL\x01S]" into a special token, which the reference keeps whole.
      if "[" in text and _SPECIAL_SPLIT.search(t.drop.sub("", text)):
        return self._normalize_words(self._clean(text))
      if self.do_lower_case:
        text = text.lower()
      # One translate does the cleaning, the whitespace mapping and the punctuation splitting.
      return " ".join(text.translate(t.ascii_table).split())
    text = self._clean(text)
    if "[" in text and _SPECIAL_SPLIT.search(text):
      return self._normalize_words(text)
    return self._finish(text)

  def _clean(self, text: str) -> str:
    """Reference `_clean_text`, `_tokenize_chinese_chars` and the NFC step, in that order."""
    t = _tables()
    text = t.drop.sub("", text)
    text = t.space.sub(" ", text)
    if not text.isascii():
      text = " ".join(t.cjk.split(text))
      text = unicodedata.normalize("NFC", text)
    return text

  def _finish(self, text: str) -> str:
    """Lower-casing, accent stripping and punctuation splitting of cleaned text, then words.

    Done on the whole string, not word by word as the reference: lower-casing is context-free
    except for Greek final sigma, whose context ends at whitespace, and NFD reordering and mark
    removal never cross a space. `str.split()` then splits where the reference's final
    `whitespace_tokenize` does; Python's whitespace includes all of Rust's, so the joined words
    contain no character the Rust whitespace split would cut again.
    """
    if self.do_lower_case:
      text = text.lower()
      if not text.isascii():
        text = unicodedata.normalize("NFD", text)
        text = _tables().mark.sub("", text)
    text = " ".join(_tables().punct.split(text))
    return " ".join(text.split())

  def _normalize_words(self, cleaned: str) -> str:
    """Slow path, word by word: some word of the cleaned text is a special token."""
    out = []
    for word in cleaned.split():
      if word in _SPECIAL_SET:
        out.append(word)
      else:
        finished = self._finish(word)
        if finished:
          out.append(finished)
    return " ".join(out)


class WordpieceTokenizer:
  """Greedy longest-match-first WordPiece, in pure Python (the reference algorithm)."""

  def __init__(self, vocab: Dict[str, int], unk_token: str = UNK,
               max_input_chars_per_word: int = 200):
    self.vocab = vocab
    self.unk_token = unk_token
    self.max_input_chars_per_word = max_input_chars_per_word

  def tokenize(self, text: str) -> List[str]:
    output_tokens = []
    for token in whitespace_tokenize(convert_to_unicode(text)):
      if len(token) > self.max_input_chars_per_word:
        output_tokens.append(self.unk_token)
        continue
      sub_tokens = []
      start = 0
      while start < len(token):
        end = len(token)
        cur_substr = None
        while start < end:
          substr = token[start:end]
          if start > 0:
            substr = "##" + substr
          if substr in self.vocab:
            cur_substr = substr
            break
          end -= 1
        if cur_substr is None:
          sub_tokens = None  # one unmatched part makes the whole word [UNK]
          break
        sub_tokens.append(cur_substr)
        start = end
      if sub_tokens is None:
        output_tokens.append(self.unk_token)
      else:
        output_tokens.extend(sub_tokens)
    return output_tokens


# Reserved placeholder entries: [unused0], [unused1], ... (BERT's release, the vocabularies
# `data_pipelines.build_vocab --num_unused` writes, ModernBERT's tokenizer.json).
_RESERVED_TOKEN = re.compile(r"\[unused\d+\]", re.IGNORECASE)


def _special_ids(vocab: Dict[str, int], special_tokens: Iterable[str]) -> List[int]:
  """Ids of `special_tokens` and of the reserved `[unusedN]` entries of `vocab`, sorted."""
  special = frozenset(special_tokens)
  return sorted(i for token, i in vocab.items()
                if token in special or _RESERVED_TOKEN.fullmatch(token))


def _special_id(vocab: Dict[str, int], token: str, where: str) -> int:
  if token not in vocab:
    raise KeyError(f"Special token {token} is not in the vocabulary {where}")
  return vocab[token]


class FullTokenizer:
  """WordPiece tokenizer, token for token the same as the reference (see the module docstring)."""

  pair_separators = 1   # [SEP]s between the two texts of a pair (bert_jax.text.pairs)

  def __init__(self, vocab_file: str, do_lower_case: bool = True,
               max_input_chars_per_word: int = 200):
    self.vocab_file = vocab_file
    self.vocab = load_vocab(vocab_file)
    self.inv_vocab = {v: k for k, v in self.vocab.items()}
    self.do_lower_case = do_lower_case
    self.max_input_chars_per_word = max_input_chars_per_word
    if UNK not in self.vocab:
      raise ValueError(f"Vocabulary {vocab_file} has no {UNK} token (line '{UNK}' missing)")
    self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
    self.wordpiece_tokenizer = WordpieceTokenizer(self.vocab, UNK, max_input_chars_per_word)
    self._engine = None
    if _hf_tokenizers is not None:
      from tokenizers import models, pre_tokenizers
      engine = _hf_tokenizers.Tokenizer(models.WordPiece(
          dict(self.vocab), unk_token=UNK, continuing_subword_prefix="##",
          max_input_chars_per_word=max_input_chars_per_word))
      # The normalised text has single spaces between words and no other whitespace, so a
      # whitespace split gives exactly our words. No normaliser and no added tokens: special
      # tokens reach WordPiece as words and map to themselves, as in the reference.
      engine.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
      self._engine = engine

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  @property
  def pad_id(self) -> int:
    return _special_id(self.vocab, PAD, self.vocab_file)

  @property
  def unk_id(self) -> int:
    return _special_id(self.vocab, UNK, self.vocab_file)

  @property
  def cls_id(self) -> int:
    return _special_id(self.vocab, CLS, self.vocab_file)

  @property
  def sep_id(self) -> int:
    return _special_id(self.vocab, SEP, self.vocab_file)

  @property
  def mask_id(self) -> int:
    return _special_id(self.vocab, MASK, self.vocab_file)

  @property
  def special_ids(self) -> List[int]:
    """Ids that are no ordinary text piece, sorted: [PAD] [UNK] [CLS] [SEP] [MASK] and the
    reserved `[unusedN]` entries (what the masking's in-use random ids leave out)."""
    return _special_ids(self.vocab, SPECIAL_TOKENS)

  def tokenize(self, text: TextLike) -> List[str]:
    normalized = self.basic_tokenizer.normalize(text)
    if not normalized:
      return []
    if self._engine is None:
      return self.wordpiece_tokenizer.tokenize(normalized)
    return self._engine.encode(normalized, add_special_tokens=False).tokens

  def encode_batch(self, texts: Sequence[TextLike]) -> List[List[int]]:
    """Ids of `tokenize(text)` for every text; the fast path for data creation."""
    normalize = self.basic_tokenizer.normalize
    normalized = [normalize(text) for text in texts]
    if self._engine is None:
      return [self.convert_tokens_to_ids(self.wordpiece_tokenizer.tokenize(n))
              for n in normalized]
    encodings = self._engine.encode_batch_fast(normalized, add_special_tokens=False)
    return [e.ids for e in encodings]

  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> List[int]:
    vocab, unk = self.vocab, self.vocab[UNK]
    return [vocab.get(token, unk) for token in tokens]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> List[str]:
    return ids_to_tokens(self.inv_vocab, ids, f"the vocabulary {self.vocab_file}")

  def is_word_continuation(self, token: str) -> bool:
    """True for a '##x' piece, which continues the word of the previous token."""
    return len(token) > 2 and token.startswith("##")


# Names under which a SentencePiece model may carry BERT's special tokens: ours first, then the
# SentencePiece defaults (<pad>, <unk>) that ALBERT-style models use.
_SPM_SPECIAL_ALIASES = {PAD: (PAD, "<pad>"), UNK: (UNK, "<unk>"), CLS: (CLS,), SEP: (SEP,),
                        MASK: (MASK,)}

# The layout `data_pipelines.build_vocab` trains SentencePiece models with.
SPM_SPECIAL_IDS = {PAD: 0, UNK: 1, CLS: 2, SEP: 3, MASK: 4}


class SentencePieceTokenizer:
  """SentencePiece (unigram or BPE) with BERT's special tokens, behind the FullTokenizer interface.

  Models trained by `python -m data_pipelines.build_vocab --model_type=sentencepiece` reserve
  [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4 (`SPM_SPECIAL_IDS`, the ALBERT layout with BERT's
  names). Other models are accepted when they carry those pieces, or <pad>/<unk> for the first two.
  Special tokens written in the text are cut out first and kept whole (like `FullTokenizer`); the
  text around them is encoded separately, so "a[SEP]b" gives "▁a [SEP] ▁b".
  """

  pair_separators = 1   # [SEP]s between the two texts of a pair (bert_jax.text.pairs)

  def __init__(self, spm_model_file: str, do_lower_case: bool = False):
    import sentencepiece as spm
    if not spm_model_file or not filesystem.isfile(spm_model_file):
      raise FileNotFoundError(f"SentencePiece model file not found: {spm_model_file!r}")
    self.spm_model_file = spm_model_file
    self.do_lower_case = do_lower_case
    if filesystem.is_url(spm_model_file):
      with filesystem.open(spm_model_file, "rb") as f:
        self.sp = spm.SentencePieceProcessor(model_proto=f.read())
    else:
      self.sp = spm.SentencePieceProcessor(model_file=spm_model_file)
    self.vocab = collections.OrderedDict(
        (self.sp.id_to_piece(i), i) for i in range(self.sp.get_piece_size()))
    self.inv_vocab = {v: k for k, v in self.vocab.items()}
    self._special_piece = {}
    for name, aliases in _SPM_SPECIAL_ALIASES.items():
      for alias in aliases:
        if alias in self.vocab:
          self._special_piece[name] = alias
          break
    if UNK not in self._special_piece:
      raise ValueError(f"SentencePiece model {spm_model_file} has no [UNK] or <unk> piece")
    self._special_pieces = frozenset(self._special_piece.values())
    # Longest first, so that no special piece is cut by a shorter one that prefixes it.
    self._special_split = re.compile("(" + "|".join(
        re.escape(p) for p in sorted(self._special_pieces, key=len, reverse=True)) + ")")

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

  def _special_id(self, name: str) -> int:
    if name not in self._special_piece:
      raise KeyError(f"Special token {name} is not in the SentencePiece model "
                     f"{self.spm_model_file}")
    return self.vocab[self._special_piece[name]]

  @property
  def pad_id(self) -> int:
    return self._special_id(PAD)

  @property
  def unk_id(self) -> int:
    return self._special_id(UNK)

  @property
  def cls_id(self) -> int:
    return self._special_id(CLS)

  @property
  def sep_id(self) -> int:
    return self._special_id(SEP)

  @property
  def mask_id(self) -> int:
    return self._special_id(MASK)

  @property
  def special_ids(self) -> List[int]:
    """Ids that are no ordinary text piece, sorted: BERT's special pieces, the model's control,
    unknown and unused pieces, and reserved `[unusedN]` entries (what the masking's in-use
    random ids leave out)."""
    marked = [piece for piece, i in self.vocab.items()
              if self.sp.is_control(i) or self.sp.is_unknown(i) or self.sp.is_unused(i)]
    return _special_ids(self.vocab, self._special_pieces | frozenset(marked))

  def _pieces(self, text: TextLike) -> List[str]:
    """Text and special-token pieces, alternating (even: text, odd: special)."""
    text = convert_to_unicode(text)
    pieces = self._special_split.split(text)
    if self.do_lower_case:
      pieces = [p if i % 2 else p.lower() for i, p in enumerate(pieces)]
    return pieces

  def tokenize(self, text: TextLike) -> List[str]:
    out = []
    for i, piece in enumerate(self._pieces(text)):
      if i % 2:
        out.append(piece)
      elif piece:
        out.extend(self.sp.encode(piece, out_type=str))
    return out

  def encode_batch(self, texts: Sequence[TextLike]) -> List[List[int]]:
    """Ids of `tokenize(text)` for every text (one batched SentencePiece call)."""
    split = [self._pieces(text) for text in texts]
    plain = [pieces[0] for pieces in split if len(pieces) == 1]
    encoded = iter(self.sp.encode(plain, out_type=int)) if plain else iter(())
    out = []
    for pieces in split:
      if len(pieces) == 1:
        out.append(next(encoded))
        continue
      ids = []
      for i, piece in enumerate(pieces):
        if i % 2:
          ids.append(self.vocab[piece])
        elif piece:
          ids.extend(self.sp.encode(piece, out_type=int))
      out.append(ids)
    return out

  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> List[int]:
    vocab, unk = self.vocab, self.unk_id
    return [vocab.get(token, unk) for token in tokens]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> List[str]:
    out = []
    for i in ids:
      i = int(i)
      if not 0 <= i < self.vocab_size:
        raise ValueError(f"Token id {i} is out of range for the SentencePiece model "
                         f"{self.spm_model_file} ({self.vocab_size} pieces)")
      out.append(self.inv_vocab[i])
    return out

  def is_word_continuation(self, token: str) -> bool:
    """True for a piece without the '▁' word-start mark that is not a special token."""
    if token in self._special_pieces:
      return False
    if token in self.vocab and self.sp.is_control(self.vocab[token]):
      return False
    return not token.startswith("\u2581")

  def decode(self, ids: Sequence[int]) -> str:
    return self.sp.decode([int(i) for i in ids])


# Names under which a tokenizer.json may carry BERT's special tokens, after those its own
# post-processor, model (unk_token) and padding declare: BERT's, then RoBERTa's / XLNet's.
_HF_SPECIAL_ALIASES = {PAD: (PAD, "<pad>", "<|padding|>"), UNK: (UNK, "<unk>"),
                       CLS: (CLS, "<cls>", "<s>"), SEP: (SEP, "<sep>", "</s>"),
                       MASK: (MASK, "<mask>")}


def _byte_level_spaces() -> frozenset:
  """The characters GPT-2's byte-level alphabet writes the whitespace bytes as ('Ġ' for a space,
  'Ċ' for a newline, ...): a byte-level token that starts with one starts a word."""
  printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
               + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
  mapping, shifted = {}, 0
  for byte in range(256):
    if byte in printable:
      mapping[byte] = chr(byte)
    else:
      mapping[byte] = chr(256 + shifted)
      shifted += 1
  return frozenset(mapping[b] for b in b" \t\n\r\x0b\x0c")


def _components(spec: Optional[dict]) -> List[dict]:
  """A normalizer / pre-tokenizer / post-processor spec and, for a "Sequence", its parts."""
  if not spec:
    return []
  parts = spec.get("normalizers") or spec.get("pretokenizers") or spec.get("processors")
  if spec.get("type") == "Sequence" and parts:
    return [c for part in parts for c in _components(part)]
  return [spec]


# RoBERTa's special tokens as transformers' RobertaTokenizerFast declares them (bos, eos, unk,
# sep, pad, cls, mask: the order it appends those a vocab.json lacks).
_ROBERTA_SPECIAL = ("<s>", "</s>", "<unk>", "<pad>", "<mask>")
MERGES_FILE = "merges.txt"


def _is_bpe_vocab(spec) -> bool:
  """Whether a parsed JSON file is a byte-level BPE vocab.json (token -> id), not a
  tokenizer.json (which has a "model" object)."""
  return (isinstance(spec, dict) and bool(spec) and not isinstance(spec.get("model"), dict)
          and all(isinstance(v, int) and not isinstance(v, bool) for v in spec.values()))


def _read_merges(merges_file: str) -> List[tuple]:
  """The merges of a merges.txt as the `tokenizers` library reads them: one 'a b' pair a line,
  '#version' lines skipped (blank lines too)."""
  merges = []
  for number, line in enumerate(filesystem.read_text(merges_file).splitlines(), 1):
    if not line.strip() or line.startswith("#version"):
      continue
    parts = line.split(" ")
    if len(parts) != 2:
      raise ValueError(f"{merges_file}, line {number}: a merge is two tokens separated by one "
                       f"space, got {line!r}")
    merges.append((parts[0], parts[1]))
  return merges


def _roberta_engine(vocab_file: str, vocab: Dict[str, int]):
  """The `tokenizers` pipeline transformers' `RobertaTokenizerFast` builds from a vocab.json and
  the merges.txt beside it: byte-level BPE (no unk token, no continuing-subword prefix), ByteLevel
  pre-tokenizer without a prefix space and ByteLevel decoder, no normalizer (cased), the special
  tokens <s> </s> <unk> <pad> <mask> (appended in that order where vocab.json lacks them) and
  RobertaProcessing (<s> A </s></s> B </s>)."""
  from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
  directory = filesystem.dirname(vocab_file)
  merges_file = filesystem.join(directory, MERGES_FILE)
  if not filesystem.isfile(merges_file):
    raise FileNotFoundError(
        f"{vocab_file} is a byte-level BPE vocabulary (RoBERTa's vocab.json) but its folder "
        f"{directory or '.'} has no {MERGES_FILE} beside it: a vocab.json needs its merges.txt "
        "(or pass the model's tokenizer.json instead)")
  engine = _hf_tokenizers.Tokenizer(models.BPE(
      vocab=vocab, merges=_read_merges(merges_file), dropout=None, continuing_subword_prefix="",
      end_of_word_suffix="", fuse_unk=False))
  engine.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  engine.decoder = decoders.ByteLevel()
  engine.add_special_tokens([AddedToken(t, special=True, normalized=False, lstrip=False,
                                        rstrip=False) for t in _ROBERTA_SPECIAL])
  engine.post_processor = processors.RobertaProcessing(
      ("</s>", engine.token_to_id("</s>")), ("<s>", engine.token_to_id("<s>")),
      trim_offsets=True, add_prefix_space=False)
  return engine


class HuggingFaceTokenizer:
  """A Hugging Face `tokenizer.json` (the `tokenizers` library) behind the FullTokenizer interface.

  What ModernBERT-class checkpoints ship instead of a vocab.txt: byte-level BPE with [CLS] [SEP]
  [MASK] [PAD] [UNK] (`python -m data_pipelines.build_vocab --model_type=bpe` trains one); any
  other model the library reads works too (WordPiece, Unigram).

  Tokens and ids are the library's own `encode(text, add_special_tokens=False)`: the file's
  normalizer, pre-tokenizer and model, special tokens written in the text cut out whole by its
  added vocabulary; never its post-processor (`bert_jax.text.pairs` adds [CLS]/[SEP]), padding or
  truncation. Casing is the file's: its normalizer lower-cases or it does not, and
  `do_lower_case` is not applied on top (`self.do_lower_case` reports what the normalizer does).

  `pair_separators`: how many [SEP]s the file's post-processor puts between the two texts of a
  pair: 2 for RoBERTa / XLM-R (`RobertaProcessing`, or a pair template `<s> $A </s> </s> $B </s>`),
  else 1 (`bert_jax.text.pairs` joins pairs with that many).

  Special tokens are found by name: [CLS] and [SEP] first from the post-processor (the first and
  last special token of its single-sequence template, or BERT/RoBERTa processing's cls/sep),
  [UNK] from the model, [PAD] from the padding settings, then each by its names (`[CLS]`, `<cls>`,
  `<s>`, ...: `_HF_SPECIAL_ALIASES`) among the added special tokens, then the whole vocabulary. A
  missing one is an error naming the file when it is asked for.

  `tokenizer_file` may instead be a byte-level BPE `vocab.json` with `merges.txt` in the same
  folder (older RoBERTa releases, fairseq conversions: no tokenizer.json): the pipeline is then
  the one transformers' `RobertaTokenizerFast` builds from those two files (`_roberta_engine`),
  ids for ids. `source_files` names the files read (vocab.json and merges.txt for that form);
  `tokenizer_json()` is the pipeline as one tokenizer.json text (what to write where the
  tokenizer travels, e.g. beside a saved model).
  """

  def __init__(self, tokenizer_file: str):
    if _hf_tokenizers is None:  # pragma: no cover - a declared dependency
      raise ImportError("A tokenizer.json needs the `tokenizers` library (pip install tokenizers)")
    if not tokenizer_file or not filesystem.isfile(tokenizer_file):
      raise FileNotFoundError(f"tokenizer.json file not found: {tokenizer_file!r}")
    self.tokenizer_file = tokenizer_file
    text = filesystem.read_text(tokenizer_file)
    try:
      spec = json.loads(text)
    except ValueError as e:  # json.JSONDecodeError
      raise ValueError(f"{tokenizer_file} is not a Hugging Face tokenizer.json: {e}") from e
    if _is_bpe_vocab(spec):   # RoBERTa's vocab.json (+ merges.txt beside it)
      engine = _roberta_engine(tokenizer_file, spec)
      text = engine.to_str()
      spec = json.loads(text)
      self.source_files = (tokenizer_file, filesystem.join(filesystem.dirname(tokenizer_file),
                                                           MERGES_FILE))
    else:
      try:
        engine = _hf_tokenizers.Tokenizer.from_str(text)
      except Exception as e:  # the library's own parse error
        raise ValueError(f"{tokenizer_file} is not a Hugging Face tokenizer.json (nor a "
                         f"vocab.json of token ids): {e}") from e
      self.source_files = (tokenizer_file,)
    self._json_text = text
    # The file's padding and truncation settings (a BERT tokenizer.json often pads to 128) would
    # change every length; rows are padded and truncated by bert_jax.text.pairs.
    engine.no_padding()
    engine.no_truncation()
    self._engine = engine
    self.vocab = dict(sorted(engine.get_vocab(with_added_tokens=True).items(),
                             key=lambda item: item[1]))
    self.inv_vocab = {v: k for k, v in self.vocab.items()}
    missing = next((i for i in range(len(self.vocab)) if i not in self.inv_vocab), None)
    if missing is not None:
      raise ValueError(f"{tokenizer_file}: the ids are not 0..{len(self.vocab) - 1} without gaps "
                       f"(no token has id {missing})")
    added = engine.get_added_tokens_decoder()
    self._added = frozenset(t.content for t in added.values())
    special_added = frozenset(t.content for t in added.values() if t.special)
    self._special_added = special_added
    self._special_piece = self._find_special_tokens(spec, special_added)
    self._special_pieces = frozenset(self._special_piece.values()) | self._added
    self.pair_separators = self._find_pair_separators(spec)
    model = spec.get("model") or {}
    normalizers = _components(spec.get("normalizer"))
    self.do_lower_case = any(
        n.get("type") == "Lowercase" or (n.get("type") == "BertNormalizer" and n.get("lowercase"))
        for n in normalizers)
    # What marks a piece that continues a word (see is_word_continuation).
    self._continuing_prefix = ""
    self._word_start = frozenset()
    if model.get("type") in ("WordPiece", "BPE") and model.get("continuing_subword_prefix"):
      self._continuing_prefix = model["continuing_subword_prefix"]
    else:
      for pre in _components(spec.get("pre_tokenizer")):
        if pre.get("type") == "ByteLevel":
          self._word_start = _byte_level_spaces()
        elif pre.get("type") == "Metaspace":
          self._word_start = frozenset(pre.get("replacement") or "\u2581")

  def _find_special_tokens(self, spec: dict, special_added: frozenset) -> Dict[str, str]:
    """BERT name -> this file's token (see the class docstring for the order of the sources)."""
    found: Dict[str, str] = {}
    for processor in _components(spec.get("post_processor")):
      kind = processor.get("type")
      if kind in ("BertProcessing", "RobertaProcessing"):
        found.setdefault(CLS, processor["cls"][0])
        found.setdefault(SEP, processor["sep"][0])
      elif kind == "TemplateProcessing":
        template = processor.get("single") or []
        names = {name: entry.get("tokens") or [] for name, entry in
                 (processor.get("special_tokens") or {}).items()}
        first_sequence = next((i for i, item in enumerate(template) if "Sequence" in item),
                              len(template))
        before = [item["SpecialToken"]["id"] for item in template[:first_sequence]
                  if "SpecialToken" in item]
        after = [item["SpecialToken"]["id"] for item in template[first_sequence:]
                 if "SpecialToken" in item]
        for name, ids in ((CLS, before[:1]), (SEP, after[-1:])):
          tokens = names.get(ids[0], [ids[0]]) if ids else []
          if len(tokens) == 1:
            found.setdefault(name, tokens[0])
    model = spec.get("model") or {}
    if model.get("unk_token"):
      found.setdefault(UNK, model["unk_token"])
    elif model.get("type") == "Unigram" and model.get("unk_id") is not None:
      found.setdefault(UNK, model["vocab"][model["unk_id"]][0])
    if (spec.get("padding") or {}).get("pad_token"):
      found.setdefault(PAD, spec["padding"]["pad_token"])
    found = {name: token for name, token in found.items() if token in self.vocab}
    for name, aliases in _HF_SPECIAL_ALIASES.items():
      for pool in (special_added, self.vocab):
        match = next((alias for alias in aliases if alias in pool), None)
        if name not in found and match is not None:
          found[name] = match
    return found

  def _find_pair_separators(self, spec: dict) -> int:
    """[SEP]s between A and B in the post-processor's pair layout (1 unless it says otherwise)."""
    for processor in _components(spec.get("post_processor")):
      kind = processor.get("type")
      if kind == "RobertaProcessing":
        return 2
      if kind == "TemplateProcessing":
        template = processor.get("pair") or []
        positions = [i for i, item in enumerate(template) if "Sequence" in item]
        if len(positions) != 2:
          continue
        names = {name: entry.get("tokens") or [] for name, entry in
                 (processor.get("special_tokens") or {}).items()}
        middle = [token for item in template[positions[0] + 1:positions[1]]
                  if "SpecialToken" in item
                  for token in names.get(item["SpecialToken"]["id"], [item["SpecialToken"]["id"]])]
        sep = self._special_piece.get(SEP)
        if middle and all(token == sep for token in middle):
          return len(middle)
    return 1

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def special_token(self, name: str) -> str:
    """This file's token for BERT's special token `name` ([CLS], [SEP], [PAD], [UNK], [MASK])."""
    if name not in self._special_piece:
      raise KeyError(f"Special token {name} is not in {self.tokenizer_file} (looked for "
                     f"{' / '.join(_HF_SPECIAL_ALIASES[name])} in its post-processor, model, "
                     "padding and vocabulary)")
    return self._special_piece[name]

  @property
  def special_tokens(self) -> Dict[str, str]:
    """BERT name -> this file's token, for the special tokens it has."""
    return dict(self._special_piece)

  @property
  def pad_id(self) -> int:
    return self.vocab[self.special_token(PAD)]

  @property
  def unk_id(self) -> int:
    return self.vocab[self.special_token(UNK)]

  @property
  def cls_id(self) -> int:
    return self.vocab[self.special_token(CLS)]

  @property
  def sep_id(self) -> int:
    return self.vocab[self.special_token(SEP)]

  @property
  def mask_id(self) -> int:
    return self.vocab[self.special_token(MASK)]

  @property
  def special_ids(self) -> List[int]:
    """Ids that are no ordinary text piece, sorted: BERT's special tokens as found here, the
    added tokens the file marks special, and reserved `[unusedN]` entries (what the masking's
    in-use random ids leave out). Added tokens not marked special (ModernBERT's runs of spaces)
    are text."""
    return _special_ids(self.vocab, frozenset(self._special_piece.values()) | self._special_added)

  def tokenize(self, text: TextLike) -> List[str]:
    # The vocabulary's tokens of the ids: the library's own token strings may carry the text an
    # added token stripped (' [MASK]' for a [MASK] with lstrip), which is no vocabulary entry.
    ids = self._engine.encode(convert_to_unicode(text), add_special_tokens=False).ids
    return [self.inv_vocab[i] for i in ids]

  def encode_batch(self, texts: Sequence[TextLike]) -> List[List[int]]:
    """Ids of `tokenize(text)` for every text (one batched call into the library)."""
    encodings = self._engine.encode_batch_fast([convert_to_unicode(t) for t in texts],
                                               add_special_tokens=False)
    return [e.ids for e in encodings]

  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> List[int]:
    vocab = self.vocab
    unk = self.vocab.get(self._special_piece.get(UNK))
    out = []
    for token in tokens:
      i = vocab.get(token, unk)
      if i is None:
        raise KeyError(f"Token {token!r} is not in {self.tokenizer_file}, which has no [UNK]")
      out.append(i)
    return out

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> List[str]:
    return ids_to_tokens(self.inv_vocab, ids, str(self.tokenizer_file))

  def is_word_continuation(self, token: str) -> bool:
    """Whether `token` continues the word of the token before it (whole-word masking).

    WordPiece (or BPE with a continuing-subword prefix): a '##x' piece. Byte-level BPE: a piece
    that does not start with the space marker 'Ġ' (or another whitespace byte's character);
    SentencePiece-style Metaspace: a piece without '▁'. Special and added tokens never continue
    a word. Per token only, without context: the first piece after [CLS] or [SEP] starts a word
    because the masking never joins a piece to a special token (`data_pipelines.masking`); a
    byte-level text's first piece has no 'Ġ' (ModernBERT adds no prefix space), so a sentence
    that follows another inside one segment joins its first piece to the last word before it.
    A file with no word mark (e.g. BPE over a whitespace split): never (each piece alone).
    """
    if not token or token in self._special_pieces:
      return False
    if self._continuing_prefix:
      return len(token) > len(self._continuing_prefix) and token.startswith(
          self._continuing_prefix)
    if self._word_start:
      return token[0] not in self._word_start
    return False

  def decode(self, ids: Sequence[int]) -> str:
    return self._engine.decode([int(i) for i in ids], skip_special_tokens=False)

  def tokenizer_json(self) -> str:
    """The pipeline as one Hugging Face tokenizer.json text: the file's own text for a
    tokenizer.json, the built pipeline for a vocab.json + merges.txt (loads in `tokenizers` /
    transformers' `PreTrainedTokenizerFast` with the same ids)."""
    return self._json_text


def create_tokenizer(vocab_file: Optional[str] = None, spm_model_file: Optional[str] = None,
                     do_lower_case: bool = True, tokenizer_file: Optional[str] = None
                     ) -> Union[FullTokenizer, SentencePieceTokenizer, HuggingFaceTokenizer]:
  """A WordPiece `FullTokenizer` (vocab_file), a `SentencePieceTokenizer` (spm_model_file) or a
  `HuggingFaceTokenizer` (tokenizer_file: a tokenizer.json, or RoBERTa's byte-level BPE
  vocab.json with its merges.txt beside it; a tokenizer.json's own normalizer decides the casing,
  so do_lower_case does not apply to it).

  Exactly one of the three must be given; an empty string counts as not given (absl flag
  default).
  """
  given = [name for name, value in (("vocab_file", vocab_file), ("spm_model_file", spm_model_file),
                                    ("tokenizer_file", tokenizer_file)) if value]
  if len(given) != 1:
    raise ValueError("create_tokenizer needs exactly one of vocab_file (WordPiece), "
                     "spm_model_file (SentencePiece) and tokenizer_file (a Hugging Face "
                     f"tokenizer.json); got vocab_file={vocab_file!r}, "
                     f"spm_model_file={spm_model_file!r}, tokenizer_file={tokenizer_file!r}")
  if vocab_file:
    return FullTokenizer(vocab_file, do_lower_case=do_lower_case)
  if tokenizer_file:
    return HuggingFaceTokenizer(tokenizer_file)
  return SentencePieceTokenizer(spm_model_file, do_lower_case=do_lower_case)


def validate_case_matches_checkpoint(do_lower_case: bool, init_checkpoint: Optional[str]) -> None:
  """The original's guard: a released Google checkpoint name implies its casing."""
  if not init_checkpoint:
    return
  match = re.match(r"^.*?([A-Za-z0-9_-]+)/bert_model.ckpt", init_checkpoint)
  if match is None:
    return
  model_name = match.group(1)
  lower_models = {"uncased_L-24_H-1024_A-16", "uncased_L-12_H-768_A-12",
                  "multilingual_L-12_H-768_A-12", "chinese_L-12_H-768_A-12"}
  cased_models = {"cased_L-12_H-768_A-12", "cased_L-24_H-1024_A-16",
                  "multi_cased_L-12_H-768_A-12"}
  if model_name in lower_models and not do_lower_case:
    raise ValueError(f"{init_checkpoint} is an uncased model: use do_lower_case=True")
  if model_name in cased_models and do_lower_case:
    raise ValueError(f"{init_checkpoint} is a cased model: use do_lower_case=False")
