r"""Peak memory and throughput of `data_pipelines.create_pretraining_data` at growing input sizes.

  python -m benchmarks.create_pretraining_data_scale --sizes_mb=10,100 \
    --text='../shared/data/text/gutenberg/*.txt' \
    --vocab_file=../shared/data/bert/vocab_uncased_L-12_H-768_A-12.txt

Builds corpora of the requested sizes from the given text (documents of 40 consecutive lines,
repeated in shuffled order until the size is reached), runs the real command line on each in a
fresh process and reports its peak resident memory and throughput. The claim under test: memory
is bounded by one block of documents plus one shuffle bucket, so it does not grow with the input
(target < 2 GB at 100 MB).

`--beam` also runs the Beam pipeline (`--runner=DirectRunner`, `--beam_workers` processes in
multi-processing mode) on each corpus, after the single-machine builder in the same run, and
checks that both wrote the same files. Peak memory (sampled every 0.1 s) is given per process:
the driver (the command's own process), the largest worker process (a builder worker, or a Beam
SDK worker), and all of them at once. The DirectRunner's driver holds every PCollection in memory
(it is a test runner), so its peak grows with the input; a distributed runner's workers hold one
block or one bucket each.
"""
import glob
import hashlib
import json
import os
import random
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
_WORKERS = flags.DEFINE_integer("num_workers", 1, "Worker processes of the single-machine run.")
_BEAM = flags.DEFINE_bool("beam", False, "Also run the Beam pipeline on the DirectRunner "
                          "(multi-processing) on each corpus, against the single-machine builder.")
_BEAM_WORKERS = flags.DEFINE_integer("beam_workers", 2, "DirectRunner worker processes "
                                     "(--direct_num_workers).")

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


def _run(corpus, output, extra_args, tmp):
  """One fresh run of the command line: (seconds, instances, peak RSS in MB of the driver, of
  the largest worker process, of all its processes together)."""
  import psutil
  stats = os.path.join(tmp, "stats.json")
  cmd = [sys.executable, "-m", "data_pipelines.create_pretraining_data",
         f"--input_file={corpus}", f"--output_file={output}@4",
         f"--vocab_file={os.path.abspath(_VOCAB.value)}", f"--dupe_factor={_DUPE.value}",
         f"--masking={_MASKING.value}", "--noprogress", f"--stats_file={stats}", *extra_args]
  start = time.time()
  process = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  # Sampled every 0.1 s over the process tree (ru_maxrss of children would count a forked
  # helper as big as its parent, and not tell the driver from its workers).
  driver, peaks, total_peak = psutil.Process(process.pid), {}, 0
  while process.poll() is None:
    total = 0
    try:
      tree = [driver] + driver.children(recursive=True)
    except psutil.Error:
      tree = []
    for member in tree:
      try:
        rss = member.memory_info().rss
      except psutil.Error:
        continue
      peaks[member.pid] = max(peaks.get(member.pid, 0), rss)
      total += rss
    total_peak = max(total_peak, total)
    time.sleep(0.1)
  elapsed = time.time() - start
  if process.returncode:
    raise subprocess.CalledProcessError(process.returncode, cmd)
  with open(stats) as f:
    instances = json.load(f)["instances"]
  driver_peak = peaks.pop(process.pid, 0)
  return elapsed, instances, driver_peak / 2**20, max(peaks.values(), default=0) / 2**20, \
      total_peak / 2**20


def _digest(pattern):
  sha = hashlib.sha256()
  for path in sorted(glob.glob(pattern)):
    with open(path, "rb") as f:
      sha.update(f.read())
  return sha.hexdigest()


def main(argv):
  del argv
  docs = _documents(_TEXT.value)
  runs = [("single machine", f"{_WORKERS.value} process(es)", [f"--num_workers={_WORKERS.value}"])]
  if _BEAM.value:
    runs.append(("Beam DirectRunner", f"{_BEAM_WORKERS.value} SDK workers",
                 ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
                  f"--direct_num_workers={_BEAM_WORKERS.value}"]))
  print("| input | dupe | masking | builder | workers | instances/s | MB/s | peak RSS: driver "
        "| largest worker | all processes | time | same files |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  with tempfile.TemporaryDirectory() as tmp:
    for size in _SIZES.value:
      corpus = os.path.join(tmp, f"corpus_{size}mb.txt")
      _write_corpus(corpus, docs, int(float(size) * 1e6))
      reference = None
      for index, (builder, workers, extra_args) in enumerate(runs):
        output = os.path.join(tmp, f"out{index}.tfrecord")
        elapsed, instances, driver_mb, worker_mb, total_mb = _run(corpus, output, extra_args,
                                                                  tmp)
        digest = _digest(output + "-*")
        reference = reference or digest
        for path in glob.glob(output + "-*"):
          os.remove(path)
        print(f"| {size} MB | {_DUPE.value} | {_MASKING.value} | {builder} | {workers} | "
              f"{instances / elapsed:,.0f} | {float(size) / elapsed:.2f} | {driver_mb:,.0f} MB | "
              f"{f'{worker_mb:,.0f} MB' if worker_mb > 1 else '-'} | {total_mb:,.0f} MB | "
              f"{elapsed:.0f} s | "
              f"{'yes' if digest == reference else 'NO'} |", flush=True)


if __name__ == "__main__":
  app.run(main)
