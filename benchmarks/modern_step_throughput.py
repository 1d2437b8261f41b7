r"""ModernBERT-class pre-training step: bert_jax vs transformers' `ModernBertForMaskedLM`, one run.

  python -m benchmarks.modern_step_throughput --layers=7 --hidden=256 --batch=8 --seq=512

Both sides train the same ModernBERT-family masked LM (pre-norm, GeGLU, rotary positions, every
third layer global and the others in a `--local_attention`-token window; vocabulary 50,368) on
the same batch with 30% of the positions masked, AdamW, on the same CPU threads, in float32 or
(`--precision=bfloat16`) mixed precision: float32 parameters and bfloat16 activations and
matmuls, bert_jax's `config.model.dtype="bfloat16"` against the same model's forward under
`torch.autocast("cpu", torch.bfloat16)` (PyTorch's mixed precision on a CPU).
transformers runs its `sdpa` attention with `sparse_prediction=True` (the MLM head only at the
masked positions, as ModernBERT trains and as bert_jax always does). bert_jax runs the step its
pre-training job compiles (`tasks/jobs/pretraining.py`; local layers by blocks from 512 tokens).

Useful FLOPs: `model.flops.modern_training_flops` (local layers counted over their band only).
Utilisation is that over this machine's 2048^3 matmul rate in the same precision, measured in the
same run, each side's over its own framework's (XLA's for bert_jax, PyTorch's for transformers):
where PyTorch's matmuls are faster (bfloat16 on a CPU with AMX), that is the peer's head start.
The sides are timed in alternating rounds, best round each (benchmarks/bench_util.py).
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# As bert_jax.main does, before JAX, TensorFlow or PyTorch start threads.
from bert_jax.runtime import host_memory  # noqa: E402
host_memory.keep_freed_memory()

import jax  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from bert_jax.model import flops  # noqa: E402
from bert_jax.model.config import BertConfig  # noqa: E402
from bert_jax.tasks.jobs import pretraining  # noqa: E402

VOCAB, MASK_RATE = 50368, 0.30


def model_config(args) -> BertConfig:
  return BertConfig.named("modernbert-base", num_hidden_layers=args.layers,
                          hidden_size=args.hidden, num_attention_heads=args.hidden // 64,
                          intermediate_size=args.hidden * 3 // 2, vocab_size=VOCAB,
                          local_attention=args.local_attention)


def jax_step(args, predictions):
  c = bench_util.modern_pretraining_config(model_config(args), dtype=args.precision, seq=args.seq,
                                           batch=args.batch, predictions=predictions)
  job = pretraining.make_job(c)   # the very step a pre-training run trains
  state = jax.jit(job.init_state)()
  step = jax.jit(job.train_step, donate_argnums=(0,))
  data = jax.device_put(bench_util.modern_mlm_batch(args.batch, args.seq, predictions,
                                                     VOCAB))
  rng = jax.random.PRNGKey(1)
  holder = [state]

  def one():
    holder[0], metrics = step(holder[0], data, rng)
    metrics["loss"].block_until_ready()

  return one


def torch_step(args, predictions):
  import torch
  torch.set_num_threads(args.threads)
  model = bench_util.transformers_modernbert_mlm(model_config(args), "sdpa")
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6,
                          weight_decay=1e-5)
  inputs = bench_util.modern_mlm_torch_inputs(
      bench_util.modern_mlm_batch(args.batch, args.seq, predictions, VOCAB))

  autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bfloat16")

  def one():
    opt.zero_grad(set_to_none=True)
    with autocast:
      loss = model(**inputs).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

  return one


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--layers", type=int, default=7)
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--local_attention", type=int, default=128)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=512)
  parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
  parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; best counts")
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32")
  args = parser.parse_args()
  predictions = int(round(MASK_RATE * (args.seq - 2)))
  peak = bench_util.matmul_flops_per_sec(dtype=args.precision)
  torch_peak = bench_util.torch_matmul_flops_per_sec(dtype=args.precision, threads=args.threads)
  print(f"{bench_util.machine_line()}; {args.precision} 2048^3 matmul: {peak / 1e9:.1f} GFLOP/s "
        f"through XLA, {torch_peak / 1e9:.1f} through PyTorch", flush=True)
  sec = bench_util.interleaved_best({"bert_jax": jax_step(args, predictions),
                                     "transformers": torch_step(args, predictions)},
                                    rounds=args.rounds, steps=args.steps)
  useful = flops.modern_training_flops(model_config(args), rows=args.batch, seq_len=args.seq,
                                       predictions=args.batch * predictions)
  print(json.dumps({
      "precision": args.precision, "layers": args.layers, "hidden": args.hidden,
      "local_attention": args.local_attention,
      "batch": args.batch, "seq": args.seq, "masked": predictions,
      "bert_jax_steps_per_sec": round(1 / sec["bert_jax"], 3),
      "transformers_steps_per_sec": round(1 / sec["transformers"], 3),
      "ratio": round(sec["transformers"] / sec["bert_jax"], 2),
      "bert_jax_useful_gflops": round(useful / sec["bert_jax"] / 1e9, 1),
      "utilisation_vs_matmul": round(useful / sec["bert_jax"] / peak, 3),
      "transformers_utilisation_vs_its_matmul": round(
          useful / sec["transformers"] / torch_peak, 3)}), flush=True)


if __name__ == "__main__":
  main()
