r"""Peak memory and throughput of `data_pipelines.create_pretraining_data` at growing input sizes.

  python benchmarks/create_pretraining_data_scale.py --sizes_mb=10,100 \
    --text='../shared/data/text/gutenberg/*.txt' \
    --vocab_file=../shared/data/bert/vocab_uncased_L-12_H-768_A-12.txt

Builds corpora of the requested sizes from the given text (documents of 40 consecutive lines,
repeated in shuffled order until the size is reached), runs the real command line on each in a
fresh process and reports its peak resident memory (ru_maxrss) and throughput. The claim under
test: memory is bounded by one block of documents plus one shuffle bucket, so it does not grow
with the input (target < 2 GB at 100 MB).
"""
import glob
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SIZES = flags.DEFINE_list("sizes_mb", ["10", "100"], "Input sizes in MB.")
_TEXT = flags.DEFINE_string("text", "../shared/data/text/gutenberg/*.txt", "Source text (glob).")
_VOCAB = flags.DEFINE_string("vocab_file", "../shared/data/bert/vocab_uncased_L-12_H-768_A-12.txt",
                             "WordPiece vocabulary.")
_DUPE = flags.DEFINE_integer("dupe_factor", 2, "Passes over the input.")
_MASKING = flags.DEFINE_enum("masking", "static", ["static", "dynamic"], "Record kind.")
_WORKERS = flags.DEFINE_integer("num_workers", 1, "Worker processes.")


def _documents(pattern):
  docs = []
  for path in sorted(glob.glob(pattern)):
    with open(path, encoding="utf-8", errors="replace") as f:
      lines = [l.strip() for l in f if l.strip()]
    docs.extend(lines[i:i + 40] for i in range(0, len(lines), 40))
  if not docs:
    raise FileNotFoundError(f"No text matches {pattern}")
  return docs


def _write_corpus(path, docs, size_bytes):
  rng = random.Random(0)
  written = 0
  with open(path, "w", encoding="utf-8") as f:
    while written < size_bytes:
      rng.shuffle(docs)
      for doc in docs:
        chunk = "\n".join(doc) + "\n\n"
        f.write(chunk)
        written += len(chunk.encode("utf-8"))
        if written >= size_bytes:
          break


def main(argv):
  del argv
  docs = _documents(_TEXT.value)
  print("| input | dupe | masking | workers | instances/s | MB/s | peak RSS | time |")
  print("|---|---|---|---|---|---|---|---|")
  with tempfile.TemporaryDirectory() as tmp:
    for size in _SIZES.value:
      corpus = os.path.join(tmp, f"corpus_{size}mb.txt")
      _write_corpus(corpus, docs, int(float(size) * 1e6))
      stats = os.path.join(tmp, "stats.json")
      cmd = [sys.executable, "-m", "data_pipelines.create_pretraining_data",
             f"--input_file={corpus}", f"--output_file={tmp}/out.tfrecord@4",
             f"--vocab_file={_VOCAB.value}", f"--dupe_factor={_DUPE.value}",
             f"--masking={_MASKING.value}", f"--num_workers={_WORKERS.value}",
             "--noprogress", f"--stats_file={stats}"]
      # A fresh process per size: ru_maxrss of the children is the peak of this run alone
      # because sizes grow (it is a maximum over all children so far).
      start = time.time()
      subprocess.run(cmd, cwd=ROOT, check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
      elapsed = time.time() - start
      peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
      with open(stats) as f:
        instances = json.load(f)["instances"]
      for path in glob.glob(os.path.join(tmp, "out.tfrecord*")):
        os.remove(path)
      print(f"| {size} MB | {_DUPE.value} | {_MASKING.value} | {_WORKERS.value} | "
            f"{instances / elapsed:,.0f} | {float(size) / elapsed:.2f} | {peak_mb:,.0f} MB | "
            f"{elapsed:.0f} s |", flush=True)


if __name__ == "__main__":
  app.run(main)
