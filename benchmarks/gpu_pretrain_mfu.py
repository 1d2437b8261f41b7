r"""GPU pre-training step: model-FLOP utilisation (MFU), packing, and the PyTorch peer, in one run.

  python -m benchmarks.gpu_pretrain_mfu --size=base --seq=128 --batch=256
  python -m benchmarks.gpu_pretrain_mfu --size=base --seq=512 --batch=64 --packing=both
  python -m benchmarks.gpu_pretrain_mfu --peer=none --variants=current,bf16_attention_logits
  python -m benchmarks.gpu_pretrain_mfu --family=modernbert --size=base --seq=1024 --batch=32 \
      --variants=current,xla_attention --peer=torch,torch_compile   # BERT_JAX_ALLOW_TRITON=1

bert_jax's pre-training step (`registry.job`, placed and compiled as a run does; bf16 compute,
float32 master weights, dropout on) against `transformers`' `BertForPreTraining` (bf16 autocast,
the same AdamW, SDPA) on the same batch, in alternating rounds. `--lengths`: `original` (the data
algorithm's 10% short instances), `full`, or FILE.npy (real corpus lengths: `--save_lengths`
writes them from records). Per configuration one JSON line: `mfu` (the FLOPs of every row
position over the GPU's nominal dense bf16 peak, as NVIDIA's and MLPerf's BERT numbers),
`useful_mfu` (real tokens only), the rate over a bf16 matmul of the same run, the peer's ratio.
`--packing=on`: several short pairs a row, compared by pairs per second. `--family=modernbert`:
the ModernBERT-family step (`experiments/pretrain_modernbert.py`'s recipe, full rows) against
`ModernBertForMaskedLM` (SDPA, `sparse_prediction=True`; `torch_compile`: compiled).
`--variants` compiles the step once per config change of VARIANTS in one process and times them
in the same rounds: a change measured against main on a shared GPU.
"""
import argparse
import functools
import json
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.55")  # the PyTorch peer needs the rest

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from bert_jax.model import flops, kernels, layers  # noqa: E402
from bert_jax.tasks.jobs import pretraining  # noqa: E402
from bert_jax.families.modernbert.config import modern_counterpart  # noqa: E402
from bert_jax.model.config import BertConfig  # noqa: E402
from data_pipelines import packing  # noqa: E402
from experiments import pretraining_defaults  # noqa: E402

VOCAB = 30522
MODERN_VOCAB, MODERN_MASK_RATE = 50368, 0.30   # ModernBERT's padded vocabulary and masking rate
# Nominal dense bfloat16 tensor-core peaks (vendor data sheets), FLOP/s.
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L4": 121e12}
CLS, SEP = 101, 102


def nominal_peak(device_kind: str) -> float:
  return next((v for k, v in PEAK_BF16.items() if k in device_kind), float("nan"))


def sample_lengths(how: str, count: int, seq: int, rng) -> np.ndarray:
  if how == "full":
    return np.full(count, seq)
  if how == "original":
    short = rng.rand(count) < 0.1
    return np.where(short, rng.randint(5, seq + 1, size=count), seq)
  measured = np.load(how)
  return np.minimum(rng.choice(measured, size=count), seq)


def instance(length: int, seq: int, max_pred: int, rng):
  """One masked NSP instance of `length` tokens, padded to `seq` (the record layout)."""
  ids = np.zeros(seq, np.int32)
  ids[:length] = rng.randint(1000, VOCAB, size=length)
  a_len = max(1, (length - 3) // 2)
  ids[0], ids[a_len + 1], ids[length - 1] = CLS, SEP, SEP
  segment = np.zeros(seq, np.int32)
  segment[a_len + 2:length] = 1
  # The original rule: round(15% of the tokens), at least 1, at most max_predictions_per_seq.
  count = min(max_pred, max(1, int(round(length * 0.15))))
  candidates = [i for i in range(length) if ids[i] not in (CLS, SEP)]
  positions = np.sort(rng.choice(candidates, size=min(count, len(candidates)), replace=False))
  pad = lambda x, dtype: np.pad(np.asarray(x, dtype), (0, max_pred - len(x)))
  return {"input_ids": ids, "input_mask": (np.arange(seq) < length).astype(np.int32),
          "segment_ids": segment,
          "masked_lm_positions": pad(positions, np.int32),
          "masked_lm_ids": pad(ids[positions], np.int32),
          "masked_lm_weights": pad(np.ones(len(positions)), np.float32),
          "next_sentence_labels": np.asarray([rng.randint(2)], np.int32)}


def make_batch(args, packed: bool, rng):
  """(numpy batch of `args.batch` rows, real tokens per row, pairs per row, per-pair lengths).

  A window of 8 batches of instances is made (and packed); every row costs the same to compute,
  so a random sample of rows is timed and credited with the window's averages.
  """
  lengths = sample_lengths(args.lengths, 8 * args.batch, args.seq, rng)
  examples = [instance(int(n), args.seq, args.max_pred, rng) for n in lengths]
  rows = (packing.pack_examples(examples, args.seq, args.max_pairs, args.max_pred + args.max_pairs)
          if packed else examples)
  chosen = rng.choice(len(rows), size=args.batch, replace=len(rows) < args.batch)
  return (packing.stack([rows[i] for i in chosen]), float(lengths.sum() / len(rows)),
          len(examples) / len(rows), lengths)


def model_flops(layers, hidden, lengths, predictions, pairs):
  """Training FLOPs (`bert_jax.model.flops`) of the encoder over sequences of `lengths`, each
  attending within itself, the masked-only MLM head and the pooler/NSP."""
  lengths = np.asarray(lengths, np.float64)
  return flops.training_flops(layers, hidden, 4 * hidden, VOCAB, tokens=float(lengths.sum()),
                              attention_pairs=float(np.square(lengths).sum()),
                              predictions=predictions, pairs=pairs)


# --variants: config.model overrides, each compiled in the same process and timed in the same
# rounds. The kernel ablations: `kernels="auto"` (current), every hand-tuned form, each part in
# textbook form, every textbook form.
VARIANTS = {"current": {}, "tuned": {"kernels": "tuned"},
            **{part: {"kernels": part} for part in kernels.PARTS},
            "textbook": {"kernels": "textbook"},
            # the model option: attention logits in bfloat16, upcast for the softmax
            "bf16_attention_logits": {"float32_attention_logits": False},
            # cuDNN's fused attention (it has no dropout): what a fused kernel would give
            "no_attention_dropout": {"attention_probs_dropout_prob": 0.0},
            # probes (change the recipe): what dropout costs on the XLA attention path
            "no_hidden_dropout": {"hidden_dropout_prob": 0.0},
            "xla_no_dropout": {"attention": "xla", "hidden_dropout_prob": 0.0,
                               "attention_probs_dropout_prob": 0.0},
            # the XLA attention path where the default would take cuDNN's kernel
            "xla_attention": {"attention": "xla"}}


def jax_config(args, overrides=()):
  c = pretraining_defaults.get_config(args.size)
  c.model.update(vocab_size=VOCAB, dtype=args.dtype, max_position_embeddings=max(512, args.seq),
                 **dict(overrides))
  c.max_seq_length, c.max_predictions_per_seq = args.seq, args.max_pred
  c.global_batch_size = args.batch
  c.num_train_steps, c.warmup_steps = 10_000, 100
  return c


def modern_bert_config(args) -> BertConfig:
  """ModernBERT-base or -large, or another BERT size's ModernBERT-family counterpart
  (`modern_counterpart`, as benchmarks/time_to_quality trains BERT-mini's); the vocabulary
  and the local window as `--vocab_size` and `--local_attention` say."""
  vocab = {"vocab_size": args.vocab_size, "pad_token_id": 0} if args.vocab_size else {
      "vocab_size": MODERN_VOCAB}   # another vocabulary: a WordPiece one, [PAD] = 0
  if args.size in ("base", "large"):
    config = BertConfig.named(f"modernbert-{args.size}", **vocab)
  else:
    config = modern_counterpart(BertConfig.named(args.size), **vocab)
  return config.replace(local_attention=args.local_attention or config.local_attention)


def family_config(args, overrides=()):
  if args.family == "bert":
    return jax_config(args, overrides)
  c = bench_util.modern_pretraining_config(modern_bert_config(args), dtype=args.dtype,
                                           seq=args.seq, batch=args.batch,
                                           predictions=args.max_pred)
  c.model.update(dict(overrides))
  return c


def jax_step(args, batch, variant="current"):
  """A callable running `steps` train steps of `variant` (compiled here), and its attention."""
  c = family_config(args, VARIANTS[variant])
  start = time.perf_counter()
  run, _ = bench_util.jax_train_step(c, batch)
  print(f"[{variant}] init (compile + run): {time.perf_counter() - start:.1f} s", flush=True)
  start = time.perf_counter()
  loss = float(run()["loss"])
  print(f"[{variant}] first step (compile + run): {time.perf_counter() - start:.1f} s, loss "
        f"{loss:.3f}", flush=True)
  return run, layers.attention_kind(pretraining.bert_config_from(c), deterministic=False,
                                    seq_len=args.seq)


def torch_step(args, batch):
  """transformers' BertForPreTraining of the same shapes on the same batch (bf16 autocast, the
  same AdamW, clipping at 1)."""
  import transformers
  named = BertConfig.named(args.size)
  layers, hidden = named.num_hidden_layers, named.hidden_size
  config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=hidden // 64, intermediate_size=4 * hidden,
                                   max_position_embeddings=max(512, args.seq))
  model = transformers.BertForPreTraining(config).cuda().train()
  inputs = bench_util.torch_inputs(batch, device="cuda", labels=True, nsp=True)
  return bench_util.torch_train_step(model, bench_util.torch_adamw(model, lr=1e-4), inputs,
                                     clip=1.0, bfloat16=True)


def torch_modern_step(args, batch, compiled: bool):
  """transformers' ModernBertForMaskedLM of the same shapes on the same batch (bf16 autocast, or
  float32 throughout with `--dtype=float32`; AdamW, no clipping: the recipe has none), eager or
  under torch.compile."""
  import torch
  device = "cuda" if torch.cuda.is_available() else "cpu"   # the CPU: to try the script out
  # float32: TF32 products, as XLA's default precision computes float32 matmuls on a GPU.
  torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
  model = bench_util.transformers_modernbert_mlm(modern_bert_config(args), "sdpa").to(device)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6,
                          weight_decay=1e-5)
  inputs = bench_util.torch_inputs(batch, device=device, token_types=False, labels=True)
  return bench_util.torch_train_step(model, opt, inputs,
                                     bfloat16=args.dtype == "bfloat16", compiled=compiled)


def timed(args, fns) -> dict:
  """Seconds per step of each callable (`fn(steps)`), `--steps` a round, in interleaved rounds;
  then, with `--profile`, 3 steps of the first (the first variant) under the profiler (a Perfetto
  trace for a per-kernel breakdown)."""
  sec = bench_util.interleaved_best({k: functools.partial(f, args.steps) for k, f in fns.items()},
                                    rounds=args.rounds, steps=1, warmup=1)
  if args.profile:
    with jax.profiler.trace(args.profile, create_perfetto_trace=True):
      next(iter(fns.values()))(3)
  return {k: v / args.steps for k, v in sec.items()}


def run_modern(args, kind: str, peak: float, matmul: float) -> None:
  """The ModernBERT-family step of each variant and the transformers peers, timed in the same
  interleaved rounds on full rows; one JSON line per side."""
  peers = [p for p in args.peer.split(",") if p != "none"]
  if "torch_compile" in peers and sys.modules.get("triton", False) is None:
    # bert_jax keeps Triton out of its processes (bert_jax/__init__.py: TensorFlow and Triton
    # cannot share one); this benchmark never imports TensorFlow, so it may let Triton in.
    raise SystemExit("--peer=torch_compile needs Triton (torch.compile's GPU kernels): run "
                     "with BERT_JAX_ALLOW_TRITON=1")
  batch = bench_util.mlm_batch(args.batch, args.seq, args.max_pred,
                               modern_bert_config(args).vocab_size)
  variants = args.variants.split(",")
  fns, implementation = jax_steps(args, batch, variants)
  for peer in peers:
    fns[peer] = torch_modern_step(args, batch, compiled=peer == "torch_compile")
  sec = timed(args, fns)
  needed = flops.modern_training_flops(modern_bert_config(args), rows=args.batch,
                                       seq_len=args.seq, predictions=args.batch * args.max_pred)
  for side in variants + peers:
    result = {"device": kind, "family": "modernbert", "size": args.size, "seq": args.seq,
              "batch_rows": args.batch, "masked_per_row": args.max_pred, "dtype": args.dtype,
              "side": side, "attention": implementation.get(side, "sdpa"),
              "steps_per_sec": round(1 / sec[side], 3),
              "tokens_per_sec": round(args.batch * args.seq / sec[side]),
              "mfu": round(needed / sec[side] / peak, 3),
              "vs_matmul": round(needed / sec[side] / matmul, 3)}
    result.update({f"ratio_vs_{peer}": round(sec[peer] / sec[side], 2)
                   for peer in peers if side in variants})
    print(json.dumps(result), flush=True)


def jax_steps(args, batch, variants):
  """({variant: its step callable}, {variant: its attention implementation})."""
  steps = {variant: jax_step(args, batch, variant) for variant in variants}
  return ({v: run for v, (run, _) in steps.items()},
          {v: attention for v, (_, attention) in steps.items()})


def save_lengths(pattern: str, out: str) -> None:
  """Real instance lengths (sum of input_mask) of create_pretraining_data records -> .npy."""
  import tensorflow as tf
  from data_pipelines import input_pipeline
  lengths = []
  for path in input_pipeline.expand_patterns(pattern):
    for raw in tf.data.TFRecordDataset(path):
      example = tf.train.Example.FromString(raw.numpy())
      lengths.append(sum(example.features.feature["input_mask"].int64_list.value))
  np.save(out, np.asarray(lengths, np.int32))
  print(f"{len(lengths)} lengths, mean {np.mean(lengths):.1f} -> {out}")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--family", default="bert", choices=["bert", "modernbert"])
  parser.add_argument("--size", default="base",
                      help="bert: a BERT size; modernbert: base|large, or a BERT size (its "
                           "ModernBERT-family counterpart, e.g. mini: time_to_quality's model)")
  parser.add_argument("--vocab_size", type=int, default=0,
                      help="modernbert: the vocabulary (0: ModernBERT's 50,368)")
  parser.add_argument("--local_attention", type=int, default=0,
                      help="modernbert: the local layers' window (0: the model's)")
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--batch", type=int, default=256, help="rows per step")
  parser.add_argument("--max_pred", type=int, default=0,
                      help="0: round(0.15 * seq) (modernbert: round(0.30 * seq))")
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--lengths", default="original")
  parser.add_argument("--packing", default="off", choices=["off", "on", "both"])
  parser.add_argument("--peer", default="torch",
                      help="torch or none; modernbert: a comma list of torch, torch_compile")
  parser.add_argument("--steps", type=int, default=10, help="steps per timed round")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--prng", default="rbg", choices=["threefry2x32", "rbg", "unsafe_rbg"],
                      help="jax_default_prng_impl (initialisation and dropout); threefry's "
                           "BERT-base initialisation takes ~4 min to compile on an H100")
  parser.add_argument("--variants", default="current",
                      help="comma list of VARIANTS (the first is the one the peer and "
                           "--profile use): " + ",".join(VARIANTS))
  parser.add_argument("--profile", default="", help="directory for a profiler trace of 3 steps")
  parser.add_argument("--matmul_n", type=int, default=8192, help="reference matmul size")
  parser.add_argument("--save_lengths", nargs=2, metavar=("RECORDS", "OUT_NPY"))
  args = parser.parse_args()
  jax.config.update("jax_default_prng_impl", args.prng)
  if args.save_lengths:
    return save_lengths(*args.save_lengths)
  rate = MODERN_MASK_RATE if args.family == "modernbert" else 0.15
  args.max_pred = args.max_pred or int(round(rate * args.seq))
  args.max_pairs = max(2, args.seq // 32)   # pairs per packed row
  kind = jax.devices()[0].device_kind
  peak = nominal_peak(kind)
  matmul = bench_util.matmul_flops_per_sec(args.matmul_n, dtype="bfloat16")
  print(f"{bench_util.machine_line()}; bf16 {args.matmul_n}^3 matmul {matmul / 1e12:.0f} TFLOP/s; "
        f"nominal peak {peak / 1e12:.0f} TFLOP/s", flush=True)
  if args.family == "modernbert":
    return run_modern(args, kind, peak, matmul)
  named = BertConfig.named(args.size)
  layers, hidden = named.num_hidden_layers, named.hidden_size
  for packed in {"off": [False], "on": [True], "both": [False, True]}[args.packing]:
    rng = np.random.RandomState(0)
    batch, tokens_per_row, pairs_per_row, lengths = make_batch(args, packed, rng)
    variants = args.variants.split(",")
    fns, implementation = jax_steps(args, batch, variants)
    if args.peer == "torch" and not packed:
      fns["torch"] = torch_step(args, batch)
    sec = timed(args, fns)
    predictions_per_row = float(np.mean([min(args.max_pred, max(1, round(0.15 * n)))
                                         for n in lengths])) * pairs_per_row
    # Computed: every row position, every prediction slot and every [CLS] slot of the rows.
    slots_per_row = args.max_pred + args.max_pairs if packed else args.max_pred
    cls_per_row = args.max_pairs if packed else 1
    computed = model_flops(layers, hidden, [args.seq] * args.batch, args.batch * slots_per_row,
                           args.batch * cls_per_row)
    # Useful: the real pairs of one step's worth of rows, each attending within itself.
    pairs = args.batch * pairs_per_row
    scale = pairs / len(lengths)
    useful = scale * model_flops(layers, hidden, lengths, 0, 0) + model_flops(
        layers, hidden, [], args.batch * predictions_per_row, pairs)
    for variant in variants:
      seconds, c = sec[variant], jax_config(args, VARIANTS[variant])
      result = {"device": kind, "size": args.size, "seq": args.seq, "batch_rows": args.batch,
                "dtype": args.dtype, "lengths": args.lengths, "packing": packed,
                "variant": variant, "attention": implementation[variant], "prng": args.prng,
                "hidden_dropout": c.model.hidden_dropout_prob,
                "attention_dropout": c.model.attention_probs_dropout_prob,
                "pairs_per_row": round(pairs_per_row, 3),
                "real_tokens_per_row": round(tokens_per_row, 1),
                "bert_jax_steps_per_sec": round(1 / seconds, 3),
                "pairs_per_sec": round(pairs / seconds, 1),
                "real_tokens_per_sec": round(args.batch * tokens_per_row / seconds),
                "mfu": round(computed / seconds / peak, 3),
                "useful_mfu": round(useful / seconds / peak, 3),
                "useful_vs_matmul": round(useful / seconds / matmul, 3),
                "vs_first_variant": round(seconds / sec[variants[0]], 3)}
      if "torch" in sec:
        result.update(torch_steps_per_sec=round(1 / sec["torch"], 3),
                      ratio_vs_torch=round(sec["torch"] / seconds, 2))
      print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
