r"""Pre-training step throughput: bert_jax vs Hugging Face `transformers` PyTorch, in one run.

  python -m benchmarks.pretrain_step_throughput --sizes=mini,small --batch=32 --seq=128
  python -m benchmarks.pretrain_step_throughput --family=roberta --sizes=mini

Both sides train `BertForPreTraining` of the same size (vocab 30522), batch, sequence length and
number of masked positions (20) with AdamW, fp32, on the same CPU threads. The peer computes MLM
logits at every position (how `transformers` works); bert_jax only at the masked ones.
`--family=roberta`: RoBERTa's step (`experiments/pretrain_roberta.py`: MLM alone, one token type,
its vocabulary of 50,265, AdamW betas (0.9, 0.98), no clipping) at a BERT size's shape, against
`RobertaForMaskedLM`. (ModernBERT's CPU step: benchmarks/modern_step_throughput.py.)

Useful FLOPs per step = 6 * (encoder matmul params) * tokens  + attention (12 * L * S^2 * H per
sequence, fwd+bwd)  + the masked-only MLM head (6 * P * (H^2 + H * V))  + pooler/NSP. Utilisation is
that over the measured float32 matmul rate of this machine (a 2048^3 matmul in the same run).
The two sides are timed in alternating rounds, best round each (benchmarks/bench_util.py), so
load from other work on a shared machine hurts both alike.
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# As bert_jax.main does, before JAX, TensorFlow or PyTorch start threads: both sides of the
# comparison then reuse freed host memory (bert_jax/runtime/host_memory.py).
from bert_jax.runtime import host_memory  # noqa: E402
host_memory.keep_freed_memory()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from bert_jax import parallel  # noqa: E402
from bert_jax.model.config import NAMED_SIZES  # noqa: E402
from bert_jax.runtime import job as jobs  # noqa: E402
from bert_jax.tasks import registry  # noqa: E402
from experiments import pretrain_roberta, pretraining_defaults  # noqa: E402

VOCAB, MASKED = 30522, 20
FAMILIES = ("bert", "roberta")


def experiment(family, size):
  """The family's pre-training config with the model of a named BERT size's shape."""
  if family == "bert":
    c = pretraining_defaults.get_config(size)
    c.model.vocab_size = VOCAB
    return c
  c = pretrain_roberta.get_config("size=roberta-base")
  layers, hidden = NAMED_SIZES[size]
  c.model.update(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 64,
                 intermediate_size=4 * hidden)
  return c


def make_batch(batch, seq, seed=0, vocab=VOCAB, pairs=True):
  rng = np.random.RandomState(seed)
  ids = rng.randint(10, vocab, size=(batch, seq)).astype(np.int32)
  positions = np.sort(np.stack([rng.choice(np.arange(1, seq - 1), MASKED, replace=False)
                                for _ in range(batch)]), axis=1).astype(np.int32)
  return {"input_ids": ids, "input_mask": np.ones_like(ids),
          "segment_ids": ((np.arange(seq)[None] >= seq // 2) * pairs).astype(np.int32).repeat(
              batch, 0),
          "masked_lm_positions": positions,
          "masked_lm_ids": rng.randint(10, vocab, size=(batch, MASKED)).astype(np.int32),
          "masked_lm_weights": np.ones((batch, MASKED), np.float32),
          "next_sentence_labels": rng.randint(0, 2, size=(batch, 1)).astype(np.int32)}


def useful_flops(layers, hidden, batch, seq, vocab=VOCAB, pooler=True):
  inter = 4 * hidden
  encoder = layers * (4 * hidden * hidden + 2 * hidden * inter)
  dense = 6 * encoder * batch * seq
  attention = 12 * layers * seq * seq * hidden * batch
  mlm = 6 * batch * MASKED * (hidden * hidden + hidden * vocab)
  pooler = 6 * batch * (hidden * hidden + 2 * hidden) if pooler else 0   # and NSP
  return dense + attention + mlm + pooler


def jax_step(size, batch, seq, model_overrides=None, family="bert"):
  """A callable running one bert_jax pre-training step (`model_overrides`: config.model fields,
  e.g. the `kernels` option of an ablation)."""
  c = experiment(family, size)
  c.model.update(model_overrides or {})
  c.max_seq_length, c.max_predictions_per_seq, c.global_batch_size = seq, MASKED, batch
  c.num_train_steps, c.warmup_steps = 1000, 10
  job = registry.job(c)   # the very job a pre-training run trains
  par = parallel.create(c)
  state, step = jobs.state_and_step(job, par)   # placed and compiled as the run does
  batch_data = par.put_batch(make_batch(batch, seq, vocab=c.model.vocab_size,
                                        pairs=family == "bert"))
  rng = jax.random.PRNGKey(1)
  holder = [state]

  def one():
    holder[0], metrics = step(holder[0], batch_data, rng)
    metrics["loss"].block_until_ready()

  return one


def torch_step(size, batch, seq, threads, family="bert"):
  import torch
  import transformers
  torch.set_num_threads(threads)
  layers, hidden = NAMED_SIZES[size]
  shape = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
               intermediate_size=4 * hidden)
  if family == "bert":
    model = transformers.BertForPreTraining(transformers.BertConfig(vocab_size=VOCAB, **shape))
  else:
    ours = experiment(family, size).model
    model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
        vocab_size=ours.vocab_size, max_position_embeddings=ours.max_position_embeddings,
        type_vocab_size=1, pad_token_id=ours.pad_token_id, layer_norm_eps=1e-5, **shape))
  model.train()
  betas, clip = ((0.9, 0.999), 1.0) if family == "bert" else ((0.9, 0.98), 0.0)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=betas, eps=1e-6, weight_decay=0.01)
  data = make_batch(batch, seq, vocab=model.config.vocab_size, pairs=family == "bert")
  labels = np.full((batch, seq), -100, np.int64)
  np.put_along_axis(labels, data["masked_lm_positions"], data["masked_lm_ids"], axis=1)
  inputs = {"input_ids": torch.tensor(data["input_ids"], dtype=torch.long),
            "attention_mask": torch.tensor(data["input_mask"], dtype=torch.long),
            "token_type_ids": torch.tensor(data["segment_ids"], dtype=torch.long),
            "labels": torch.tensor(labels)}
  if family == "bert":
    inputs["next_sentence_label"] = torch.tensor(data["next_sentence_labels"][:, 0],
                                                 dtype=torch.long)

  def one():
    opt.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    if clip:
      torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()

  return one


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--family", default="bert", choices=FAMILIES)
  parser.add_argument("--sizes", default="mini,small")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
  parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; best counts")
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  args = parser.parse_args()
  peak = bench_util.matmul_flops_per_sec()
  print(f"{bench_util.machine_line()}; float32 2048^3 matmul: {peak / 1e9:.1f} GFLOP/s",
        flush=True)
  for size in args.sizes.split(","):
    layers, hidden = NAMED_SIZES[size]
    sec = bench_util.interleaved_best(
        {"bert_jax": jax_step(size, args.batch, args.seq, family=args.family),
         "torch": torch_step(size, args.batch, args.seq, args.threads, family=args.family)},
        rounds=args.rounds, steps=args.steps)
    flops = useful_flops(layers, hidden, args.batch, args.seq,
                         vocab=experiment(args.family, size).model.vocab_size,
                         pooler=args.family == "bert")
    result = {"family": args.family, "size": size, "batch": args.batch, "seq": args.seq,
              "bert_jax_steps_per_sec": round(1 / sec["bert_jax"], 3),
              "torch_steps_per_sec": round(1 / sec["torch"], 3),
              "ratio": round(sec["torch"] / sec["bert_jax"], 2),
              "bert_jax_useful_gflops": round(flops / sec["bert_jax"] / 1e9, 1),
              "utilisation_vs_matmul": round(flops / sec["bert_jax"] / peak, 3)}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
