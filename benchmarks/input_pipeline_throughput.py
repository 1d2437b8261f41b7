r"""tf.data pre-training pipeline throughput with dynamic masking, pinned to one CPU core.

  python -m benchmarks.input_pipeline_throughput --seq=128 --batch=256 --batches=200

Reads unmasked (dynamic) records through `data_pipelines.input_pipeline.create_pretraining_dataset`
exactly as training does (file shuffle, record shuffle, batch, parse, 80/10/10 masking with the
original budget rule, prefetch) and reports sequences/s after a warm-up. The process is pinned to
one core (`os.sched_setaffinity`) and TensorFlow to one thread. `--input_files` takes real records
(`python -m data_pipelines.create_pretraining_data --masking=dynamic ...`); without it the script
writes synthetic ones of the same shape: BERT-like lengths (90% full, 10% short), two segments,
~20% WordPiece continuation pieces. Target from the issue: >= 20,000 sequences/s at seq 128.
"""
import argparse
import json
import os
import platform
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pin_to_one_core() -> int:
  core = sorted(os.sched_getaffinity(0))[0]
  os.sched_setaffinity(0, {core})
  return core


def write_synthetic_records(directory: str, count: int, seq: int, vocab: int, files: int = 4):
  import numpy as np
  import tensorflow as tf
  from data_pipelines import features as F
  rng = np.random.RandomState(0)
  paths = []
  feature = lambda xs: tf.train.Feature(int64_list=tf.train.Int64List(value=xs))
  for f in range(files):
    path = os.path.join(directory, f"dynamic-{f}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for _ in range(count // files):
        length = seq if rng.rand() < 0.9 else rng.randint(10, seq)
        split = rng.randint(2, length - 2)
        ids = np.zeros(seq, np.int64)
        ids[:length] = rng.randint(999, vocab, size=length)
        ids[0], ids[split], ids[length - 1] = 101, 102, 102     # [CLS] A [SEP] B [SEP]
        segments = np.zeros(seq, np.int64)
        segments[split + 1:length] = 1
        continuation = (rng.rand(seq) < 0.2).astype(np.int64)
        continuation[[0, split, length - 1]] = 0
        continuation[length:] = 0
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            F.INPUT_IDS: feature(ids), F.INPUT_MASK: feature((np.arange(seq) < length) * 1),
            F.SEGMENT_IDS: feature(segments),
            F.NEXT_SENTENCE_LABELS: feature([int(rng.rand() < 0.5)]),
            F.IS_WORD_CONTINUATION: feature(continuation)})).SerializeToString())
    paths.append(path)
  return ",".join(paths)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--input_files", default="", help="dynamic records; default: synthetic")
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--warmup", type=int, default=20)
  parser.add_argument("--records", type=int, default=16384)
  parser.add_argument("--max_predictions", type=int, default=20)
  parser.add_argument("--whole_word_mask", action="store_true")
  parser.add_argument("--repeats", type=int, default=3, help="best of this many passes")
  args = parser.parse_args()

  core = pin_to_one_core()
  import tensorflow as tf
  tf.config.threading.set_inter_op_parallelism_threads(1)
  tf.config.threading.set_intra_op_parallelism_threads(1)
  from data_pipelines import input_pipeline, masking

  vocab = 30522
  with tempfile.TemporaryDirectory() as tmp:
    files = args.input_files or write_synthetic_records(tmp, args.records, args.seq, vocab)
    config = masking.MaskingConfig(max_predictions_per_seq=args.max_predictions,
                                   whole_word_mask=args.whole_word_mask)
    special = masking.SpecialTokens(cls_id=101, sep_id=102, pad_id=0, mask_id=103,
                                    vocab_size=vocab)
    best = 0.0
    for _ in range(args.repeats):
      dataset = input_pipeline.create_pretraining_dataset(
          files, global_batch_size=args.batch, max_seq_length=args.seq,
          max_predictions_per_seq=args.max_predictions, masking=config, special=special,
          seed=0, is_training=True, process_index=0, process_count=1,
          shuffle_buffer_size=10_000)
      iterator = iter(dataset)
      for _ in range(args.warmup):
        next(iterator)
      start = time.perf_counter()
      for _ in range(args.batches):
        batch = next(iterator)
      _ = batch["input_ids"].numpy()
      best = max(best, args.batches * args.batch / (time.perf_counter() - start))
  print(json.dumps({
      "machine": f"{platform.machine()}, pinned to core {core} of {os.cpu_count()}",
      "tensorflow": tf.__version__, "seq": args.seq, "batch": args.batch,
      "whole_word_mask": args.whole_word_mask, "batches": args.batches,
      "input": args.input_files or f"synthetic ({args.records} records)",
      "sequences_per_sec": round(best)}))


if __name__ == "__main__":
  main()
