r"""The CPU pre-training step of any family against its `transformers` model, in one run.

  python -m benchmarks.pretrain_step_throughput --sizes=mini --rounds=5        # BERT
  python -m benchmarks.pretrain_step_throughput --family=roberta --sizes=mini
  python -m benchmarks.pretrain_step_throughput --family=modernbert --rounds=3   # 7 x 256, 8 x 512

bert_jax's side is the family's pre-training job (`registry.job`), placed and compiled as a run
does (`runtime.job.state_and_step`); its useful FLOPs are the job's (`Job.model_flops`: the MLM
head at the masked positions only, local layers over their band). The peer trains the family's
`transformers` model of the same shape on the same batch with the recipe's AdamW:
`BertForPreTraining` (MLM logits at every position, NSP), `RobertaForMaskedLM`, or
`ModernBertForMaskedLM` (sdpa, `sparse_prediction=True`). `--dtype=bfloat16`: bert_jax's
bfloat16 compute against the peer under `torch.autocast("cpu", torch.bfloat16)`. Utilisation is
over this machine's 2048^3 matmul rate in the same run, each side's through its own framework.
The sides are timed in alternating rounds, best round each (bench_util.interleaved_best).
"""
import argparse
import json
import os

from benchmarks import process_setup

process_setup.prepare(main=__name__ == "__main__")

from benchmarks import bench_util  # noqa: E402
from bert_jax.model.config import NAMED_SIZES, BertConfig  # noqa: E402
from experiments import pretrain_roberta, pretraining_defaults  # noqa: E402

BERT_VOCAB, MODERN_VOCAB = 30522, 50368
# Per family: sizes (a BERT size, or LAYERSxHIDDEN), batch, seq, masked fraction (0: 20 a row).
DEFAULTS = {"bert": ("mini,small", 32, 128, 0.0), "roberta": ("mini", 32, 128, 0.0),
            "modernbert": ("7x256", 8, 512, 0.30)}


def shape(size: str):
  """(layers, hidden) of a BERT size's name or of `LAYERSxHIDDEN`."""
  return NAMED_SIZES.get(size) or tuple(int(x) for x in size.split("x"))


def predictions_for(family: str, seq: int) -> int:
  rate = DEFAULTS[family][3]
  return int(round(rate * (seq - 2))) if rate else 20


def experiment(family: str, size: str, batch: int, seq: int, dtype: str = "float32",
               local_attention: int = 128):
  """The family's pre-training config at this shape: `pretraining_defaults` (BERT's vocabulary),
  `pretrain_roberta`, or `pretrain_modernbert`'s recipe on ModernBERT-base's architecture."""
  layers, hidden = shape(size)
  predictions = predictions_for(family, seq)
  if family == "modernbert":
    return bench_util.modern_pretraining_config(BertConfig.named(
        "modernbert-base", num_hidden_layers=layers, hidden_size=hidden,
        num_attention_heads=hidden // 64, intermediate_size=hidden * 3 // 2,
        vocab_size=MODERN_VOCAB, local_attention=local_attention), dtype=dtype, seq=seq,
        batch=batch, predictions=predictions)
  if family == "bert":
    c = pretraining_defaults.get_config(size if size in NAMED_SIZES else "base")
    c.model.vocab_size = BERT_VOCAB
  else:
    c = pretrain_roberta.get_config("size=roberta-base")
  c.model.update(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 64,
                 intermediate_size=4 * hidden, dtype=dtype)
  c.max_seq_length, c.max_predictions_per_seq, c.global_batch_size = seq, predictions, batch
  c.num_train_steps, c.warmup_steps = 1000, 10
  return c


def batch_of(config) -> dict:
  return bench_util.mlm_batch(config.global_batch_size, config.max_seq_length,
                              config.max_predictions_per_seq, config.model.vocab_size,
                              pairs=config.objective == "mlm_nsp")


def jax_step(config):
  """(a callable running one step of the job `config` trains, the step's useful FLOPs)."""
  run, job = bench_util.jax_train_step(config, batch_of(config))
  return run, job.model_flops(config.global_batch_size)


def torch_model(family: str, config):
  """The family's `transformers` model of `config.model`'s shape (random, train mode) and the
  recipe's AdamW settings (betas, weight decay, gradient clipping)."""
  import transformers
  m = config.model
  if family == "modernbert":
    return (bench_util.transformers_modernbert_mlm(BertConfig.from_dict(m.to_dict()), "sdpa"),
            (0.9, 0.98), 1e-5, 1.0)
  sizes = dict(hidden_size=m.hidden_size, num_hidden_layers=m.num_hidden_layers,
               num_attention_heads=m.num_attention_heads, intermediate_size=m.intermediate_size)
  if family == "bert":
    model = transformers.BertForPreTraining(transformers.BertConfig(vocab_size=BERT_VOCAB,
                                                                    **sizes))
    return model.train(), (0.9, 0.999), 0.01, 1.0
  model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
      vocab_size=m.vocab_size, max_position_embeddings=m.max_position_embeddings,
      type_vocab_size=1, pad_token_id=m.pad_token_id, layer_norm_eps=1e-5, **sizes))
  return model.train(), (0.9, 0.98), 0.01, 0.0


def torch_step(family: str, config, threads: int):
  """A callable running one AdamW step of the family's `transformers` model on the same batch."""
  import torch
  torch.set_num_threads(threads)
  model, betas, weight_decay, clip = torch_model(family, config)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=betas, eps=1e-6,
                          weight_decay=weight_decay)
  inputs = bench_util.torch_inputs(batch_of(config), token_types=family != "modernbert",
                                   labels=True, nsp=config.objective == "mlm_nsp")
  return bench_util.torch_train_step(model, opt, inputs, clip=clip,
                                     bfloat16=config.model.dtype == "bfloat16")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--family", default="bert", choices=sorted(DEFAULTS))
  parser.add_argument("--sizes", default=None,
                      help="comma list of BERT sizes or LAYERSxHIDDEN (default per family)")
  parser.add_argument("--batch", type=int, default=None)
  parser.add_argument("--seq", type=int, default=None)
  parser.add_argument("--local_attention", type=int, default=128, help="modernbert's window")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
  parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; best counts")
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  args = parser.parse_args()
  sizes, batch, seq, _ = DEFAULTS[args.family]
  args.sizes, args.batch, args.seq = args.sizes or sizes, args.batch or batch, args.seq or seq
  peak = bench_util.matmul_flops_per_sec(dtype=args.dtype)
  torch_peak = bench_util.torch_matmul_flops_per_sec(dtype=args.dtype, threads=args.threads)
  print(f"{bench_util.machine_line()}; {args.dtype} 2048^3 matmul: {peak / 1e9:.1f} GFLOP/s "
        f"through XLA, {torch_peak / 1e9:.1f} through PyTorch", flush=True)
  for size in args.sizes.split(","):
    c = experiment(args.family, size, args.batch, args.seq, args.dtype, args.local_attention)
    ours, useful = jax_step(c)
    sec = bench_util.interleaved_best({"bert_jax": ours,
                                       "transformers": torch_step(args.family, c, args.threads)},
                                      rounds=args.rounds, steps=args.steps)
    print(json.dumps({
        "family": args.family, "size": size, "dtype": args.dtype, "batch": args.batch,
        "seq": args.seq, "masked": c.max_predictions_per_seq,
        "bert_jax_steps_per_sec": round(1 / sec["bert_jax"], 3),
        "transformers_steps_per_sec": round(1 / sec["transformers"], 3),
        "ratio": round(sec["transformers"] / sec["bert_jax"], 2),
        "bert_jax_useful_gflops": round(useful / sec["bert_jax"] / 1e9, 1),
        "utilisation_vs_matmul": round(useful / sec["bert_jax"] / peak, 3),
        "transformers_utilisation_vs_its_matmul": round(
            useful / sec["transformers"] / torch_peak, 3)}), flush=True)


if __name__ == "__main__":
  main()
