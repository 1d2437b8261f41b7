"""Vocabulary training: WordPiece (our learner) and SentencePiece (unigram, BPE) on generated text."""
import collections
import math
import os
import random
import subprocess
import sys

import pytest

from bert_jax.text import tokenization
from data_pipelines import build_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def english_like_corpus(seed, lines):
  """Zipf-distributed pseudo-words with accents, some CJK, punctuation and mixed case."""
  rng = random.Random(seed)
  stems = ["".join(rng.choice("abcdefghiklmnoprstuvwy") for _ in range(rng.randint(2, 7)))
           for _ in range(400)]
  suffixes = ["", "", "", "s", "ed", "ing", "er", "ly", "ness"]
  extras = ["café", "Naïve", "東京", "中文", "ÉCOLE", "x86", "3.14", "don't", "e-mail"]
  weights = [1.0 / (i + 1) for i in range(len(stems))]
  out = []
  for _ in range(lines):
    words = []
    for _ in range(rng.randint(4, 16)):
      if rng.random() < 0.05:
        words.append(rng.choice(extras))
      else:
        word = rng.choices(stems, weights)[0] + rng.choice(suffixes)
        words.append(word.capitalize() if rng.random() < 0.1 else word)
    out.append(" ".join(words) + rng.choice([".", "!", "?", ",", ""]))
  return out


KO_STEMS = ["학교", "사람", "시간", "서울", "한국어", "공부", "친구", "선생님", "도서관", "음식",
            "날씨", "가족", "회사", "영화", "음악", "여행", "컴퓨터", "책"]


def korean_corpus(seed, lines):
  """Korean sentences from a small list of stems and particles (what SentencePiece should learn)."""
  rng = random.Random(seed)
  stems = KO_STEMS
  particles = ["은", "는", "이", "가", "을", "를", "에서", "에게", "하고", "의", "도", "로"]
  verbs = ["합니다", "갑니다", "좋아요", "있어요", "먹었어요", "봤어요", "했습니다", "배워요"]
  out = []
  for _ in range(lines):
    words = [rng.choice(stems) + rng.choice(particles) for _ in range(rng.randint(2, 6))]
    out.append(" ".join(words + [rng.choice(verbs)]) + rng.choice([".", "?", "!"]))
  return out


def write(path, lines):
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return str(path)


# ----------------------------------------------------------------------------------------------
# WordPiece


def naive_learn(word_counts, num_merges, min_frequency, criterion):
  """Reference learner: recount everything after every merge (slow, obviously right)."""
  segs = {w: [w[0]] + ["##" + c for c in w[1:]] for w in word_counts}
  pieces, known = [], {u for s in segs.values() for u in s}
  while len(pieces) < num_merges:
    units, pairs = collections.Counter(), collections.Counter()
    for w, s in segs.items():
      for u in s:
        units[u] += word_counts[w]
      for p in zip(s, s[1:]):
        pairs[p] += word_counts[w]
    total = sum(units.values())
    xlogx = lambda x: x * math.log(x) if x > 0 else 0.0  # noqa: E731
    best = None
    for (a, b), k in pairs.items():
      if k < min_frequency:
        continue
      ca, cb = units[a], units[b]
      if criterion == "ratio":
        gain = k / (ca * cb)
      elif a == b:
        gain = xlogx(max(ca - 2 * k, 0)) - xlogx(ca) + xlogx(k) + xlogx(total) - xlogx(total - k)
      else:
        gain = (xlogx(ca - k) - xlogx(ca) + xlogx(cb - k) - xlogx(cb) + xlogx(k) + xlogx(total)
                - xlogx(total - k))
      key = (-gain, -k, a, b)
      best = key if best is None or key < best else best
    if best is None:
      break
    a, b = best[2], best[3]
    for w, s in segs.items():
      new, i = [], 0
      while i < len(s):
        if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
          new.append(a + b[2:])
          i += 2
        else:
          new.append(s[i])
          i += 1
      segs[w] = new
    if a + b[2:] not in known:
      known.add(a + b[2:])
      pieces.append(a + b[2:])
  return pieces


@pytest.mark.parametrize("criterion", ["likelihood", "ratio"])
def test_incremental_learner_matches_naive(criterion):
  """The heap-based learner picks exactly the merges a full recount would pick."""
  rng = random.Random(3)
  counts = collections.Counter()
  for _ in range(600):
    counts["".join(rng.choice("abcdde") for _ in range(rng.randint(1, 8)))] += rng.randint(1, 9)
  counts["aaaaaa"] += 30  # repeated units: overlapping pairs
  got = build_vocab.learn_wordpiece(dict(counts), 120, min_frequency=2, criterion=criterion)
  assert got == naive_learn(dict(counts), 120, 2, criterion)
  assert len(got) == 120


def test_likelihood_learns_frequent_words_first():
  counts = {"the": 1000, "then": 40, "zyx": 2, "qv": 2}
  pieces = build_vocab.learn_wordpiece(counts, 3, min_frequency=2)
  assert "the" in pieces[:2]
  # The ratio shorthand goes for the rare, always-joint pairs (score 0.5) instead.
  ratio = build_vocab.learn_wordpiece(counts, 3, min_frequency=2, criterion="ratio")
  assert set(ratio) <= {"zy", "##yx", "qv", "zyx"}


def test_wordpiece_round_trip(tmp_path):
  corpus = english_like_corpus(seed=0, lines=3000)
  path = write(tmp_path / "corpus.txt", corpus)
  out = str(tmp_path / "vocab" / "vocab.txt")
  build_vocab.train_wordpiece([path], out, vocab_size=900, do_lower_case=True, num_unused=10)
  entries = open(out, encoding="utf-8").read().split("\n")[:-1]
  assert len(entries) == 900 and len(set(entries)) == 900
  assert entries[:1] == ["[PAD]"] and entries[1:11] == [f"[unused{i}]" for i in range(10)]
  assert entries[11:15] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  tok = tokenization.FullTokenizer(out, do_lower_case=True)
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 11, 12, 13, 14)
  chars = {c for line in corpus for w in tok.basic_tokenizer.tokenize(line) for c in w}
  assert all(c in tok.vocab and "##" + c in tok.vocab for c in chars)
  ids = tok.encode_batch(corpus)
  assert all(tok.unk_id not in line for line in ids)
  # A useful vocabulary: frequent words are a stem and a suffix at most (the corpus is built
  # that way), and text needs few pieces per word (1.71 here; characters alone would be ~6).
  words = [w for line in corpus for w in tok.basic_tokenizer.tokenize(line)]
  top = [w for w, _ in collections.Counter(words).most_common(40)]
  assert all(len(tok.tokenize(w)) <= 2 for w in top)
  assert sum(map(len, ids)) / len(words) < 1.8
  # Unseen characters are still [UNK]; cased input is lower-cased as in training.
  assert tok.tokenize("Ω") == ["[UNK]"]


def test_wordpiece_target_and_errors(tmp_path):
  path = write(tmp_path / "small.txt", ["abc abd abc", "", "abc!"])
  out = str(tmp_path / "v.txt")
  build_vocab.train_wordpiece([path], out, vocab_size=40, num_unused=0)
  entries = open(out, encoding="utf-8").read().split()
  # 5 special + 5 chars x 2 forms; "ab", "abc" occur >= min_frequency; nothing else can merge.
  assert len(entries) < 40 and {"ab", "abc"} <= set(entries)
  with pytest.raises(ValueError, match="vocab_size=12"):
    build_vocab.train_wordpiece([path], out, vocab_size=12, num_unused=0)
  empty = write(tmp_path / "empty.txt", ["", "   "])
  with pytest.raises(ValueError, match="empty.txt"):
    build_vocab.train_wordpiece([empty], out, vocab_size=100)
  with pytest.raises(ValueError, match="empty.txt"):
    build_vocab.train_sentencepiece([empty], str(tmp_path / "m"), vocab_size=100)
  with pytest.raises(FileNotFoundError, match="missing.txt"):
    build_vocab.expand_input_files(f"{path},{tmp_path}/missing.txt")
  with pytest.raises(FileNotFoundError, match=r"nothing\*.txt"):
    build_vocab.expand_input_files(str(tmp_path / "nothing*.txt"))
  assert build_vocab.expand_input_files(f"{tmp_path}/*.txt,{path}") == sorted(
      [path, str(tmp_path / "empty.txt"), out])


# ----------------------------------------------------------------------------------------------
# SentencePiece


# Unigram keeps only pieces used by the best segmentations: this small language fits in ~118.
@pytest.mark.parametrize("model_type,vocab_size", [("unigram", 100), ("bpe", 200)])
def test_sentencepiece_korean(tmp_path, model_type, vocab_size):
  corpus = korean_corpus(seed=1, lines=4000)
  path = write(tmp_path / "ko.txt", corpus)
  model = build_vocab.train_sentencepiece([path], str(tmp_path / "spm"), vocab_size=vocab_size,
                                          model_type=model_type, character_coverage=1.0,
                                          num_unused=3)
  assert os.path.isfile(model) and os.path.isfile(str(tmp_path / "spm.vocab"))
  tok = tokenization.create_tokenizer(spm_model_file=model, do_lower_case=False)
  assert isinstance(tok, tokenization.SentencePieceTokenizer)
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert tok.convert_ids_to_tokens(range(8)) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                  "[unused0]", "[unused1]", "[unused2]"]
  assert tok.vocab_size == vocab_size
  ids = tok.encode_batch(corpus[:500])
  for line, line_ids in zip(corpus[:500], ids):
    assert tok.unk_id not in line_ids
    assert tok.decode(line_ids) == line  # lossless round trip
    assert tok.convert_tokens_to_ids(tok.tokenize(line)) == line_ids
  # Every stem is learned as one word-initial piece: fewer pieces than characters.
  assert all("\u2581" + stem in tok.vocab for stem in KO_STEMS)
  assert sum(map(len, ids)) < 0.7 * sum(len(line.replace(" ", "")) for line in corpus[:500])
  # Special tokens in the text are kept whole; word-start pieces are not continuations.
  tokens = tok.tokenize("[CLS]학교에서 공부합니다[SEP][MASK]")
  assert tokens[0] == "[CLS]" and tokens[-2:] == ["[SEP]", "[MASK]"]
  assert tok.encode_batch(["[CLS]학교에서 공부합니다[SEP][MASK]"]) == [
      tok.convert_tokens_to_ids(tokens)]
  flags = [tok.is_word_continuation(t) for t in tokens]
  assert flags[0] is False and flags[-1] is False
  assert flags[1:-2] == [not t.startswith("\u2581") for t in tokens[1:-2]]
  assert not tok.is_word_continuation("\u2581학교")


def test_sentencepiece_lower_case(tmp_path):
  lines = english_like_corpus(seed=2, lines=1500)
  path = write(tmp_path / "en.txt", lines)
  model = build_vocab.train_sentencepiece([path], str(tmp_path / "en"), vocab_size=300,
                                          do_lower_case=True)
  tok = tokenization.SentencePieceTokenizer(model)
  assert tok.tokenize("ÉCOLE Cafe") == tok.tokenize("école cafe")
  assert tok.tokenize("[MASK]") == ["[MASK]"]


# ----------------------------------------------------------------------------------------------
# Command line


def test_cli(tmp_path):
  path = write(tmp_path / "corpus.txt", english_like_corpus(seed=4, lines=500))
  ko = write(tmp_path / "ko.txt", korean_corpus(seed=4, lines=1000))
  env = dict(os.environ, PYTHONPATH=ROOT)
  run = lambda *args: subprocess.run(  # noqa: E731
      [sys.executable, "-m", "data_pipelines.build_vocab", *args], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=120)
  result = run(f"--input_files={tmp_path}/corpus*.txt", f"--output_dir={tmp_path}/wp",
               "--vocab_size=400", "--num_unused=5")
  assert result.returncode == 0, result.stderr
  tok = tokenization.FullTokenizer(str(tmp_path / "wp" / "vocab.txt"))
  assert tok.vocab_size == 400 and tok.unk_id == 6
  result = run(f"--input_files={ko}", "--model_type=sentencepiece", "--spm_model_type=bpe",
               f"--output_file={tmp_path}/sp/ko", "--vocab_size=150", "--nodo_lower_case",
               "--num_unused=0", "--character_coverage=1.0")
  assert result.returncode == 0, result.stderr
  tok = tokenization.create_tokenizer(spm_model_file=str(tmp_path / "sp" / "ko.model"))
  assert tok.mask_id == 4
  result = run(f"--input_files={tmp_path}/absent.txt", f"--output_dir={tmp_path}/x")
  assert result.returncode != 0 and "absent.txt" in result.stderr
