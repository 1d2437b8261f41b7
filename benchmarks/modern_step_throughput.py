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
pre-training job compiles (`tasks/jobs/pretraining.py`; local layers banded at 512 tokens, by
blocks from 1,024).

Useful FLOPs: `model.flops.modern_training_flops` (local layers counted over their band only).
Utilisation is that over this machine's 2048^3 matmul rate in the same precision, measured in the
same run, each side's over its own framework's (XLA's for bert_jax, PyTorch's for transformers):
where PyTorch's matmuls are faster (bfloat16 on a CPU with AMX), that is the peer's head start.
The sides are timed in alternating rounds, best round each (benchmarks/bench_util.py).

`--part=decoder` times the MLM decoder and its loss alone, forward and backward: the masked
positions' hidden states [B*P, H] through the tied table [V, H] and the output bias to the mean
cross-entropy, by the model's own building blocks on bert_jax's side (`kernels.select`) and by
`nn.functional.linear` and `cross_entropy` (what `ModernBertForMaskedLM`'s decoder and loss run)
on transformers'. `--part=attention` times one local layer's attention alone, forward and
backward: bert_jax's (the band of the full mask, or the blocks: what the step runs at that length)
against PyTorch's `scaled_dot_product_attention` with the same band as its mask (transformers'
sdpa path); its FLOPs are the full [S, S] products', which both compute below 1,024 tokens.
`--local_attention_form=band|blocks` makes bert_jax's local layers take one form at any length
(default `auto`: `local_attention.use_blocks`), to measure where the two cross.
"""
import argparse
import functools
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# As bert_jax.main does, before JAX, TensorFlow or PyTorch start threads.
from bert_jax.runtime import host_memory  # noqa: E402
host_memory.keep_freed_memory()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from bert_jax.model import flops, kernels, local_attention  # noqa: E402
from bert_jax.families.modernbert import model as modern  # noqa: E402
from bert_jax.model.config import BertConfig  # noqa: E402
from bert_jax import parallel  # noqa: E402
from bert_jax.runtime import job as jobs  # noqa: E402
from bert_jax.tasks import registry  # noqa: E402

VOCAB, MASK_RATE = 50368, 0.30


def model_config(args) -> BertConfig:
  return BertConfig.named("modernbert-base", num_hidden_layers=args.layers,
                          hidden_size=args.hidden, num_attention_heads=args.hidden // 64,
                          intermediate_size=args.hidden * 3 // 2, vocab_size=VOCAB,
                          local_attention=args.local_attention)


def jax_step(args, predictions):
  c = bench_util.modern_pretraining_config(model_config(args), dtype=args.precision, seq=args.seq,
                                           batch=args.batch, predictions=predictions)
  job = registry.job(c)   # the very job a pre-training run trains
  par = parallel.create(c)
  state, step = jobs.state_and_step(job, par)   # placed and compiled as the run does
  data = par.put_batch(bench_util.modern_mlm_batch(args.batch, args.seq, predictions, VOCAB))
  rng = jax.random.PRNGKey(1)
  holder = [state]

  def one():
    holder[0], metrics = step(holder[0], data, rng)
    metrics["loss"].block_until_ready()

  return one


def decoder_data(args, predictions):
  """Hidden states [B*P, H], the tied table [V, H] (the modern init's scale), labels [B*P]."""
  rng = np.random.RandomState(0)
  rows = args.batch * predictions
  return (rng.standard_normal((rows, args.hidden)).astype(np.float32),
          (0.02 * rng.standard_normal((VOCAB, args.hidden))).astype(np.float32),
          rng.randint(0, VOCAB, rows).astype(np.int32))


def jax_decoder(args, predictions):
  """A call: the gradients (hidden, table, bias) of the mean NLL, as `torch_decoder`'s."""
  blocks = kernels.select("auto")   # what the model and the pre-training loss call
  dtype = jnp.dtype(args.precision)

  def loss(hidden, table, bias, labels):
    logits = blocks.add_bias(blocks.dense_matmul(hidden.astype(dtype), table.astype(dtype).T),
                             bias)                                              # [M, V]
    nll, _ = blocks.softmax_cross_entropy(logits, labels)                      # [M]
    return jnp.mean(nll)

  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  hidden, table, labels = (jnp.asarray(x) for x in decoder_data(args, predictions))
  bias = jnp.zeros((VOCAB,), jnp.float32)
  return lambda: jax.block_until_ready(grad(hidden, table, bias, labels))


def torch_decoder(args, predictions):
  import torch
  torch.set_num_threads(args.threads)
  hidden, table, labels = (torch.tensor(x) for x in decoder_data(args, predictions))
  table.requires_grad_(True)
  hidden.requires_grad_(True)
  bias = torch.zeros(VOCAB, requires_grad=True)
  labels = labels.long()
  autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bfloat16")

  def one():
    hidden.grad = table.grad = bias.grad = None
    with autocast:
      logits = torch.nn.functional.linear(hidden, table, bias)                 # [M, V]
    torch.nn.functional.cross_entropy(logits.float(), labels).backward()
    return hidden.grad, table.grad, bias.grad

  return one


def attention_data(args):
  """q, k, v and an output cotangent, each [B, S, N, D] float32."""
  rng = np.random.RandomState(0)
  shape = (args.batch, args.seq, args.hidden // 64, 64)
  return [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]


def jax_attention(args, predictions):
  """A call: the gradients (q, k, v) of <attention(q, k, v), cotangent>, as `torch_attention`'s."""
  del predictions
  q, k, v, cotangent = (jnp.asarray(x, args.precision) for x in attention_data(args))
  # The model's own local-layer dispatch (band or blocks by length), no padding, no dropout.
  context = modern.attention_context(model_config(args), jnp.ones(q.shape[:2], jnp.int32), None,
                                     "xla", args.seq)
  attend = functools.partial(context.attend, is_global=False, dropout=lambda probs: probs)
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v) * cotangent), argnums=(0, 1, 2)))
  return lambda: jax.block_until_ready(grad(q, k, v))


def torch_attention(args, predictions):
  del predictions
  import torch
  torch.set_num_threads(args.threads)
  dtype = torch.bfloat16 if args.precision == "bfloat16" else torch.float32
  q, k, v, cotangent = (torch.tensor(x.transpose(0, 2, 1, 3).copy(), dtype=dtype)
                        for x in attention_data(args))                         # [B, N, S, D]
  for x in (q, k, v):
    x.requires_grad_(True)
  positions = torch.arange(args.seq)
  band = (positions[:, None] - positions[None, :]).abs() <= args.local_attention // 2  # [S, S]

  def one():
    q.grad = k.grad = v.grad = None
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band)
    (out * cotangent).sum().backward()
    return tuple(x.grad.transpose(1, 2) for x in (q, k, v))                   # [B, S, N, D]

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
  parser.add_argument("--part", choices=("step", "decoder", "attention"), default="step",
                      help="the whole pre-training step, the MLM decoder and loss alone, or "
                           "one local layer's attention alone")
  parser.add_argument("--local_attention_form", choices=("auto", "band", "blocks"),
                      default="auto", help="bert_jax's local layers: as chosen, or one form")
  args = parser.parse_args()
  if args.local_attention_form != "auto":
    local_attention.BLOCKS_FROM = 1 if args.local_attention_form == "blocks" else 1 << 30
  predictions = int(round(MASK_RATE * (args.seq - 2)))
  peak = bench_util.matmul_flops_per_sec(dtype=args.precision)
  torch_peak = bench_util.torch_matmul_flops_per_sec(dtype=args.precision, threads=args.threads)
  print(f"{bench_util.machine_line()}; {args.precision} 2048^3 matmul: {peak / 1e9:.1f} GFLOP/s "
        f"through XLA, {torch_peak / 1e9:.1f} through PyTorch", flush=True)
  jax_side, torch_side = {"step": (jax_step, torch_step),
                          "decoder": (jax_decoder, torch_decoder),
                          "attention": (jax_attention, torch_attention)}[args.part]
  sec = bench_util.interleaved_best({"bert_jax": jax_side(args, predictions),
                                     "transformers": torch_side(args, predictions)},
                                    rounds=args.rounds, steps=args.steps)
  if args.part == "step":
    useful = flops.modern_training_flops(model_config(args), rows=args.batch, seq_len=args.seq,
                                         predictions=args.batch * predictions)
  elif args.part == "decoder":   # the logits product and its two gradients
    useful = 3 * 2 * args.batch * predictions * args.hidden * VOCAB
  else:   # two [S, S] products forward, four backward
    useful = 6 * 2 * args.batch * args.seq * args.seq * args.hidden
  print(json.dumps({
      "part": args.part, "local_attention_form": args.local_attention_form,
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
