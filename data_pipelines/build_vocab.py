r"""Vocabulary training: WordPiece (the WordPiece-paper criterion) or SentencePiece (unigram / BPE).

WordPiece, written as a BERT `vocab.txt` that `bert_jax.text.tokenization.FullTokenizer` loads:

  python -m data_pipelines.build_vocab --model_type=wordpiece \
    --input_files='../shared/data/text/gutenberg/*.txt' --output_dir=/tmp/vocab \
    --vocab_size=8000 --do_lower_case

SentencePiece, written as `<prefix>.model` and `<prefix>.vocab` for `SentencePieceTokenizer`:

  python -m data_pipelines.build_vocab --model_type=sentencepiece --spm_model_type=unigram \
    --input_files=korean.txt --output_dir=/tmp/spm --vocab_size=8000 --nodo_lower_case

Byte-level BPE, written as a Hugging Face `tokenizer.json` (what ModernBERT ships) for
`HuggingFaceTokenizer`; `--wordpiece_tokenizer_json` also writes a WordPiece vocab.txt as one:

  python -m data_pipelines.build_vocab --model_type=bpe \
    --input_files='../shared/data/text/gutenberg/*.txt' --output_dir=/tmp/bpe \
    --vocab_size=8000 --nodo_lower_case

Input: text files (comma list and/or globs), read line by line (never all in memory).

WordPiece layout (the released BERT one with num_unused=99): [PAD]=0, [unused0..N-1]=1..N,
[UNK], [CLS], [SEP], [MASK], then every training character and its `##` form (so that any word
made of seen characters can be tokenized without [UNK]), then the learned pieces in the order they
were learned. Learning (WordPiece paper, Schuster & Nakajima 2012): words from the BERT
BasicTokenizer start as characters (`w ##o ##r ##d`); repeatedly the adjacent pair (a, b) whose
merge most increases the log-likelihood of the data under a unigram model is merged (the exact
gain, see `learn_wordpiece`), until the vocabulary has `--vocab_size` entries or no pair occurs at
least `--min_frequency` times. `--wordpiece_criterion=ratio` uses the common shorthand
count(ab) / (count(a) * count(b)) instead; it ignores how often a pair occurs and learns a poor
vocabulary (Gutenberg, 8k entries: 2.26 pieces per word on Alice and no "the", against 1.05 with
the exact gain). Learning runs over the word-frequency table, so memory grows with the number
of distinct words, not with the corpus: ~11 s for the 5 MB Gutenberg set at 8k entries.
(Hugging Face's `WordPieceTrainer` merges by pair frequency, i.e. BPE, not this criterion, and
TF Text's `bert_vocab_from_dataset` learns top-down; hence our own implementation.)

SentencePiece models reserve BERT's special tokens at fixed ids: [PAD]=0, [UNK]=1, [CLS]=2,
[SEP]=3, [MASK]=4, then [unused0..N-1] (`bert_jax.text.tokenization.SPM_SPECIAL_IDS`). With
--do_lower_case the model itself case-folds (SentencePiece rule `nmt_nfkc_cf`).

BPE tokenizer.json (`train_bpe`): ModernBERT's form, trained by Hugging Face's `BpeTrainer`:
NFC normalisation (plus lower-casing with --do_lower_case: the file's normalizer does it, so
every reader lower-cases alike), GPT-2's byte-level pre-tokenizer without a prefix space (a
word after a space is 'Ġword'; no byte is ever unknown), the 256 byte characters always in the
vocabulary, byte-level decoder, and the `[CLS] A [SEP] (B [SEP])` post-processor. Special tokens
at the SentencePiece layout's ids: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4 (ModernBERT
has them at the end; `HuggingFaceTokenizer` finds them by name wherever they are), then
[unused0..N-1], then the merges.
"""
import collections
import heapq
import math
import os
import tempfile
from typing import Counter, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from absl import app, flags, logging

from bert_jax.io import filesystem
from bert_jax.text import tokenization

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("input_files", None, "Text files: comma-separated paths and/or globs.")
  flags.DEFINE_string("output_dir", None, "Directory for vocab.txt, <spm_model_prefix>.model "
                      "or tokenizer.json.")
  flags.DEFINE_string("output_file", None, "WordPiece: the vocab.txt path. SentencePiece: the "
                      "model prefix (writes PREFIX.model and PREFIX.vocab). BPE: the "
                      "tokenizer.json path.")
  flags.DEFINE_enum("model_type", "wordpiece", ["wordpiece", "sentencepiece", "bpe"],
                    "Vocabulary kind (bpe: a byte-level BPE tokenizer.json, as ModernBERT's).")
  flags.DEFINE_bool("wordpiece_tokenizer_json", False, "WordPiece: also write tokenizer.json "
                    "beside vocab.txt (the same vocabulary in Hugging Face's BERT form).")
  flags.DEFINE_enum("spm_model_type", "unigram", ["unigram", "bpe"], "SentencePiece algorithm.")
  flags.DEFINE_string("spm_model_prefix", "spm", "Model file name under --output_dir.")
  flags.DEFINE_integer("vocab_size", 30522, "Target vocabulary size, special tokens included.")
  flags.DEFINE_bool("do_lower_case", True, "Lower-case (and, for WordPiece, strip accents).")
  flags.DEFINE_integer("min_frequency", 2, "WordPiece, BPE: a pair must occur this often to "
                       "merge.")
  flags.DEFINE_enum("wordpiece_criterion", "likelihood", ["likelihood", "ratio"],
                    "WordPiece merge score: the exact unigram log-likelihood gain, or the "
                    "count(ab)/(count(a)*count(b)) shorthand (see learn_wordpiece).")
  flags.DEFINE_integer("num_unused", 99, "Reserved [unusedN] entries (99 in the BERT release).")
  flags.DEFINE_integer("max_input_chars_per_word", 200,
                       "WordPiece: longer words are skipped (they tokenize to [UNK] anyway).")
  flags.DEFINE_float("character_coverage", 0.9995, "SentencePiece character coverage (use 1.0 "
                     "for small alphabets).")
  flags.DEFINE_integer("input_sentence_size", 10_000_000, "SentencePiece: at most this many "
                       "lines are sampled for training.")
  flags.mark_flag_as_required("input_files")


# ----------------------------------------------------------------------------------------------
# Input


def expand_input_files(spec: str) -> List[str]:
  """Comma-separated paths and globs -> sorted unique files; a part that matches nothing fails."""
  files = []
  for part in (p.strip() for p in (spec or "").split(",")):
    if not part:
      continue
    matches = filesystem.glob(part) if filesystem.has_magic(part) else [part]
    matches = [m for m in matches if filesystem.isfile(m)]
    if not matches:
      raise FileNotFoundError(f"Input file not found (or glob matched no file): {part}")
    files.extend(m for m in matches if m not in files)
  if not files:
    raise ValueError(f"No input files given (--input_files={spec!r})")
  return files


def iter_lines(files: Sequence[str]) -> Iterator[str]:
  """Non-empty lines of every file, streamed; undecodable bytes become U+FFFD (dropped later)."""
  for path in files:
    with filesystem.open(path, encoding="utf-8", errors="replace") as f:
      for line in f:
        line = line.strip()
        if line:
          yield line


def _require_text(files: Sequence[str]) -> None:
  """Fails, naming the files, when they hold no text at all."""
  for _ in iter_lines(files):
    return
  raise ValueError(f"Empty corpus: no non-blank line in {', '.join(files)}")


# ----------------------------------------------------------------------------------------------
# WordPiece


def count_words(lines: Iterable[str], do_lower_case: bool = True,
                max_input_chars_per_word: int = 200) -> Counter:
  """Word -> count over the BERT BasicTokenizer words of `lines` (the words WordPiece sees)."""
  basic = tokenization.BasicTokenizer(do_lower_case=do_lower_case)
  counts: Counter = collections.Counter()
  for line in lines:
    counts.update(basic.normalize(line).split())
  for special in tokenization.SPECIAL_TOKENS:
    counts.pop(special, None)  # kept whole by the tokenizer; they are in the vocab already
  for word in [w for w in counts if len(w) > max_input_chars_per_word]:
    del counts[word]  # the tokenizer maps these to [UNK] whatever the vocabulary
  return counts


def special_layout(num_unused: int) -> List[str]:
  """[PAD], [unused0..num_unused-1], [UNK], [CLS], [SEP], [MASK]: the BERT release's head."""
  return (["[PAD]"] + [f"[unused{i}]" for i in range(num_unused)] +
          ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])


def alphabet(word_counts: Dict[str, int]) -> List[str]:
  """Every character of the words, then the `##` form of each (sorted: a stable file)."""
  chars = sorted({c for word in word_counts for c in word})
  return chars + ["##" + c for c in chars]


def _xlogx(x: float) -> float:
  return x * math.log(x) if x > 0 else 0.0


def learn_wordpiece(word_counts: Dict[str, int], num_merges: int, min_frequency: int = 2,
                    criterion: str = "likelihood") -> List[str]:
  """Up to `num_merges` new pieces, in the order they are learned.

  criterion="likelihood": the merge that most increases the log-likelihood of the current
    segmentation under a unigram model, sum_u c_u log(c_u / N). Merging the k occurrences of
    (a, b) changes it by exactly
      (c_a-k)log(c_a-k) - c_a log c_a + (c_b-k)log(c_b-k) - c_b log c_b + k log k
      + N log N - (N-k)log(N-k)
    (the new unit counted as new). This is the WordPiece paper's rule.
  criterion="ratio": count(ab) / (count(a) * count(b)), the popular shorthand for it. It ignores
    how often the pair occurs, so among pairs above `min_frequency` it prefers rare, always-joint
    pairs: on Gutenberg at 8k entries "the" is not learned and text needs ~2.3 pieces per word.

  Kept incrementally: counts of units and of adjacent pairs, which words hold each pair, and a
  max-heap of scores evaluated lazily. A merge only touches the words that contain the pair;
  scores are pushed again for every pair whose count changed and every pair that involves a, b or
  the new unit (whose unit counts changed). The only other change is N shrinking, which lowers
  every likelihood gain. So a stored score is never below the pair's true score unless a fresher
  entry exists, and the popped pair whose re-computed score still beats the next stored one is
  the true best (lazy greedy). Ties go to the more frequent pair, then the smaller strings.
  """
  if criterion not in ("likelihood", "ratio"):
    raise ValueError(f"Unknown WordPiece criterion {criterion!r}: likelihood or ratio")
  words: List[List[str]] = []
  freqs: List[int] = []
  unit_count: Dict[str, int] = collections.defaultdict(int)
  pair_count: Dict[Tuple[str, str], int] = collections.defaultdict(int)
  pair_words: Dict[Tuple[str, str], set] = collections.defaultdict(set)
  unit_pairs: Dict[str, set] = collections.defaultdict(set)
  for word, freq in word_counts.items():
    units = [word[0]] + ["##" + c for c in word[1:]]
    index = len(words)
    words.append(units)
    freqs.append(freq)
    for u in units:
      unit_count[u] += freq
    for pair in zip(units, units[1:]):
      pair_count[pair] += freq
      pair_words[pair].add(index)
      unit_pairs[pair[0]].add(pair)
      unit_pairs[pair[1]].add(pair)
  total = sum(unit_count.values())  # N, the number of units in the segmented corpus
  min_count = max(min_frequency, 1)

  def score(pair) -> Optional[Tuple[float, int, str, str]]:
    """Heap key (smaller is better) of merging `pair` now, or None when it may not merge."""
    k = pair_count.get(pair, 0)
    if k < min_count:
      return None
    a, b = pair
    ca, cb = unit_count[a], unit_count[b]
    if criterion == "ratio":
      gain = k / (ca * cb)
    elif a == b:  # "##x ##x": each merge takes two of the same unit (overlaps over-count k)
      gain = (_xlogx(max(ca - 2 * k, 0)) - _xlogx(ca) + _xlogx(k)
              + _xlogx(total) - _xlogx(total - k))
    else:
      gain = (_xlogx(ca - k) - _xlogx(ca) + _xlogx(cb - k) - _xlogx(cb) + _xlogx(k)
              + _xlogx(total) - _xlogx(total - k))
    return (-gain, -k, a, b)

  heap = [entry for entry in map(score, pair_count) if entry is not None]
  heapq.heapify(heap)
  known = set(unit_count)
  pieces: List[str] = []
  while len(pieces) < num_merges and heap:
    entry = heapq.heappop(heap)
    pair = (entry[2], entry[3])
    current = score(pair)
    if current is None:
      continue  # the pair is gone or became too rare
    if heap and current > heap[0]:
      heapq.heappush(heap, current)  # its score dropped: re-rank it
      continue
    a, b = pair
    merged = a + b[2:]  # b is never word-initial, so it always carries the "##" prefix
    changed = set()
    for index in list(pair_words[pair]):
      units, freq = words[index], freqs[index]
      for old in zip(units, units[1:]):
        pair_count[old] -= freq
        pair_words[old].discard(index)
        changed.add(old)
      new_units, i = [], 0
      while i < len(units):
        if i + 1 < len(units) and units[i] == a and units[i + 1] == b:
          new_units.append(merged)
          i += 2
        else:
          new_units.append(units[i])
          i += 1
      merges = len(units) - len(new_units)
      unit_count[a] -= merges * freq
      unit_count[b] -= merges * freq
      unit_count[merged] += merges * freq
      total -= merges * freq
      words[index] = new_units
      for new in zip(new_units, new_units[1:]):
        pair_count[new] += freq
        pair_words[new].add(index)
        unit_pairs[new[0]].add(new)
        unit_pairs[new[1]].add(new)
        changed.add(new)
    for p in changed:
      if pair_count.get(p, 0) <= 0:
        pair_count.pop(p, None)
        pair_words.pop(p, None)
    for unit in (a, b, merged):
      unit_pairs[unit] = {p for p in unit_pairs[unit] if p in pair_count}
      changed |= unit_pairs[unit]
    for p in changed:
      entry = score(p)
      if entry is not None:
        heapq.heappush(heap, entry)
    if merged not in known:  # the same string can arise from two different splits
      known.add(merged)
      pieces.append(merged)
  return pieces


def build_wordpiece_vocab(word_counts: Dict[str, int], vocab_size: int, min_frequency: int = 2,
                          num_unused: int = 99, criterion: str = "likelihood") -> List[str]:
  """The full vocab.txt entries: special layout, alphabet, then learned pieces up to vocab_size."""
  head = special_layout(num_unused)
  chars = alphabet(word_counts)
  budget = vocab_size - len(head) - len(chars)
  if budget < 0:
    raise ValueError(
        f"--vocab_size={vocab_size} cannot hold the {len(head)} special entries and the "
        f"{len(chars)} characters (with their ## forms) of the corpus; raise it to at least "
        f"{len(head) + len(chars)} or lower --num_unused")
  pieces = learn_wordpiece(word_counts, budget, min_frequency, criterion)
  taken = set(head) | set(chars)
  return head + chars + [p for p in pieces if p not in taken]


def write_lines(path: str, entries: Sequence[str]) -> None:
  filesystem.makedirs(filesystem.dirname(filesystem.absolute(path)))
  # Atomic: never leave a half-written vocabulary behind.
  filesystem.write_text(path, "".join(entry + "\n" for entry in entries))


def train_wordpiece(input_files: Sequence[str], output_file: str, vocab_size: int = 30522,
                    do_lower_case: bool = True, min_frequency: int = 2, num_unused: int = 99,
                    max_input_chars_per_word: int = 200, criterion: str = "likelihood") -> str:
  """Learns a WordPiece vocabulary from text files and writes it to `output_file`."""
  counts = count_words(iter_lines(input_files), do_lower_case, max_input_chars_per_word)
  if not counts:
    raise ValueError(f"Empty corpus: no word in {', '.join(input_files)}")
  entries = build_wordpiece_vocab(counts, vocab_size, min_frequency, num_unused, criterion)
  write_lines(output_file, entries)
  logging.info("Wrote %d WordPiece entries (%d distinct words) to %s", len(entries), len(counts),
               output_file)
  return output_file


# ----------------------------------------------------------------------------------------------
# SentencePiece


def train_sentencepiece(input_files: Sequence[str], model_prefix: str, vocab_size: int = 32000,
                        model_type: str = "unigram", do_lower_case: bool = False,
                        num_unused: int = 0, character_coverage: float = 0.9995,
                        input_sentence_size: int = 10_000_000) -> str:
  """Trains a SentencePiece model with BERT's special tokens reserved; returns PREFIX.model."""
  _require_text(input_files)
  filesystem.makedirs(filesystem.dirname(filesystem.absolute(model_prefix)))
  if filesystem.is_url(model_prefix):
    # SentencePiece writes only local files: train into a local temporary directory, then copy
    # PREFIX.model and PREFIX.vocab to the URL.
    with tempfile.TemporaryDirectory(prefix="bert_jax_spm_") as directory:
      local_prefix = os.path.join(directory, filesystem.basename(model_prefix))
      _train_sentencepiece(input_files, local_prefix, vocab_size, model_type, do_lower_case,
                           num_unused, character_coverage, input_sentence_size)
      for suffix in (".model", ".vocab"):
        filesystem.copy(local_prefix + suffix, model_prefix + suffix)
  else:
    _train_sentencepiece(input_files, model_prefix, vocab_size, model_type, do_lower_case,
                         num_unused, character_coverage, input_sentence_size)
  return model_prefix + ".model"


def _train_sentencepiece(input_files: Sequence[str], model_prefix: str, vocab_size: int,
                         model_type: str, do_lower_case: bool, num_unused: int,
                         character_coverage: float, input_sentence_size: int) -> None:
  """SentencePiece training into the local files PREFIX.model and PREFIX.vocab."""
  import sentencepiece as spm
  ids = tokenization.SPM_SPECIAL_IDS
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter_lines(input_files),  # streamed; SentencePiece samples from it
        model_prefix=model_prefix, vocab_size=vocab_size, model_type=model_type,
        character_coverage=character_coverage, input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True,
        pad_id=ids["[PAD]"], pad_piece="[PAD]", unk_id=ids["[UNK]"], unk_piece="[UNK]",
        bos_id=-1, eos_id=-1,
        # Control symbols take the next ids in order ([CLS]=2, [SEP]=3, [MASK]=4, [unused*]);
        # the tokenizer cuts them out of the text itself, so SentencePiece never matches them.
        control_symbols=["[CLS]", "[SEP]", "[MASK]"] + [f"[unused{i}]" for i in range(num_unused)],
        normalization_rule_name="nmt_nfkc_cf" if do_lower_case else "nmt_nfkc",
        minloglevel=2)
  except RuntimeError as e:
    # E.g. "Vocabulary size too high (N). Please set it to a value <= M." on a small corpus.
    raise ValueError(f"SentencePiece training on {', '.join(input_files)} failed: {e}") from e


# ----------------------------------------------------------------------------------------------
# Hugging Face tokenizer.json: byte-level BPE (ModernBERT's form) and WordPiece

TOKENIZER_JSON = "tokenizer.json"


def _bert_post_processor(cls_id: int, sep_id: int):
  """`[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]` (B in segment 1), as bert_jax.text.pairs."""
  from tokenizers import processors
  return processors.TemplateProcessing(
      single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
      special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])


def _write_tokenizer(tokenizer, output_file: str) -> None:
  filesystem.makedirs(filesystem.dirname(filesystem.absolute(output_file)))
  filesystem.write_text(output_file, tokenizer.to_str(pretty=True))  # atomic, any filesystem


def train_bpe(input_files: Sequence[str], output_file: str, vocab_size: int = 50368,
              do_lower_case: bool = False, min_frequency: int = 2, num_unused: int = 0) -> str:
  """Trains a byte-level BPE tokenizer.json (see the module docstring); returns its path."""
  from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                          trainers)
  _require_text(input_files)
  # [MASK] takes the space before it, as ModernBERT's and RoBERTa's do ("a [MASK]" is 'a', [MASK]).
  specials = [tokenization.PAD, tokenization.UNK, tokenization.CLS, tokenization.SEP,
              AddedToken(tokenization.MASK, lstrip=True, special=True)] + [
                  f"[unused{i}]" for i in range(num_unused)]
  # No unk_token: every byte has a character of its own, so nothing is ever unknown.
  tokenizer = Tokenizer(models.BPE())
  tokenizer.normalizer = (normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
                          if do_lower_case else normalizers.NFC())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tokenizer.decoder = decoders.ByteLevel()
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  if vocab_size < len(specials) + len(alphabet):
    raise ValueError(f"--vocab_size={vocab_size} cannot hold the {len(specials)} special entries "
                     f"and the {len(alphabet)} byte characters; raise it to at least "
                     f"{len(specials) + len(alphabet)}")
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=max(min_frequency, 1),
                                special_tokens=specials, initial_alphabet=alphabet,
                                show_progress=False)
  tokenizer.train_from_iterator(iter_lines(input_files), trainer=trainer)
  tokenizer.post_processor = _bert_post_processor(tokenizer.token_to_id(tokenization.CLS),
                                                  tokenizer.token_to_id(tokenization.SEP))
  _write_tokenizer(tokenizer, output_file)
  logging.info("Wrote a byte-level BPE tokenizer.json of %d entries to %s",
               tokenizer.get_vocab_size(), output_file)
  return output_file


def write_wordpiece_tokenizer_json(vocab_file: str, output_file: str, do_lower_case: bool = True,
                                   max_input_chars_per_word: int = 200) -> str:
  """A WordPiece vocab.txt as a tokenizer.json in Hugging Face's BERT form (what transformers
  writes for BertTokenizerFast): BertNormalizer, BertPreTokenizer, WordPiece, [CLS]/[SEP].

  The same ids as `FullTokenizer` on ordinary text; the Rust BertNormalizer differs from the
  reference on some rare characters (see bert_jax/text/tokenization.py's module docstring).
  """
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
  vocab = tokenization.load_vocab(vocab_file)
  tokenizer = Tokenizer(models.WordPiece(dict(vocab), unk_token=tokenization.UNK,
                                         max_input_chars_per_word=max_input_chars_per_word))
  tokenizer.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=do_lower_case)
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tokenizer.decoder = decoders.WordPiece(prefix="##")
  tokenizer.add_special_tokens([t for t in tokenization.SPECIAL_TOKENS if t in vocab])
  tokenizer.post_processor = _bert_post_processor(vocab[tokenization.CLS],
                                                  vocab[tokenization.SEP])
  _write_tokenizer(tokenizer, output_file)
  return output_file


# ----------------------------------------------------------------------------------------------


def main(argv):
  del argv
  files = expand_input_files(FLAGS.input_files)
  if not FLAGS.output_dir and not FLAGS.output_file:
    raise app.UsageError("Give --output_dir or --output_file")
  if FLAGS.model_type == "wordpiece":
    output = FLAGS.output_file or filesystem.join(FLAGS.output_dir, "vocab.txt")
    train_wordpiece(files, output, FLAGS.vocab_size, FLAGS.do_lower_case, FLAGS.min_frequency,
                    FLAGS.num_unused, FLAGS.max_input_chars_per_word, FLAGS.wordpiece_criterion)
    if FLAGS.wordpiece_tokenizer_json:
      json_file = filesystem.join(filesystem.dirname(filesystem.absolute(output)),
                                  TOKENIZER_JSON)
      write_wordpiece_tokenizer_json(output, json_file, FLAGS.do_lower_case,
                                     FLAGS.max_input_chars_per_word)
      output = f"{output} and {json_file}"
  elif FLAGS.model_type == "bpe":
    output = FLAGS.output_file or filesystem.join(FLAGS.output_dir, TOKENIZER_JSON)
    train_bpe(files, output, FLAGS.vocab_size, FLAGS.do_lower_case, FLAGS.min_frequency,
              FLAGS.num_unused)
  else:
    prefix = FLAGS.output_file or filesystem.join(FLAGS.output_dir, FLAGS.spm_model_prefix)
    output = train_sentencepiece(files, prefix, FLAGS.vocab_size, FLAGS.spm_model_type,
                                 FLAGS.do_lower_case, FLAGS.num_unused,
                                 FLAGS.character_coverage, FLAGS.input_sentence_size)
  print(f"Wrote {output}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
