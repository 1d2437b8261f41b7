r"""What each of bert_jax's elementwise building blocks is worth in a whole pre-training step.

  python benchmarks/cpu_step_ablation.py --size=mini --rounds=6

The step of `pretrain_step_throughput.py` (seq 128, batch 32, 20 masked positions, fp32, AdamW)
compiled several times in one process, each variant swapping parts of `bert_jax.ops` back to
the textbook JAX/Flax forms, and timed in interleaved rounds (best round each):

  current       bert_jax as it is
  jax_gelu      jax.nn.gelu(approximate=False) instead of ops.gelu
  flax_dropout  flax.linen.Dropout (32-bit bernoulli draws) instead of ops.Dropout
  textbook      both

Micro-benchmarks of a single op mislead here: XLA fuses each op with its neighbours, so only
the whole step says what a change is worth.
"""
import argparse
import functools
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from benchmarks.pretrain_step_throughput import jax_step  # noqa: E402
from bert_jax import ops  # noqa: E402

CURRENT = {"gelu": ops.gelu, "Dropout": ops.Dropout, "add_bias": ops.add_bias}
TEXTBOOK = {"gelu": functools.partial(jax.nn.gelu, approximate=False), "Dropout": nn.Dropout,
            "add_bias": lambda x, bias: x + bias}
VARIANTS = {"current": (), "jax_gelu": ("gelu",), "flax_dropout": ("Dropout",),
            "plain_bias": ("add_bias",), "textbook": ("gelu", "Dropout", "add_bias")}


def compiled_step(size: str, batch: int, seq: int, swapped):
  """The train step compiled with the `swapped` parts of bert_jax.ops replaced; a callable."""
  for name in CURRENT:  # the model looks these up when the step is traced (its first call)
    setattr(ops, name, TEXTBOOK[name] if name in swapped else CURRENT[name])
  try:
    one = jax_step(size, batch, seq)
    one()
  finally:
    for name, fn in CURRENT.items():
      setattr(ops, name, fn)
  return one


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--size", default="mini")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
  parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds; best counts")
  args = parser.parse_args()
  print(bench_util.machine_line(), flush=True)
  names = args.variants.split(",")
  fns = {n: compiled_step(args.size, args.batch, args.seq, VARIANTS[n]) for n in names}
  seconds = bench_util.interleaved_best(fns, rounds=args.rounds, steps=args.steps)
  for name in names:
    print(json.dumps({"size": args.size, "variant": name, "steps_per_sec": round(1 / seconds[name], 3),
                      "ms_per_step": round(1e3 * seconds[name], 1),
                      "vs_current": round(seconds[name] / seconds["current"], 3)
                      if "current" in seconds else None}), flush=True)


if __name__ == "__main__":
  main()
