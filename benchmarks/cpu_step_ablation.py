r"""What each of bert_jax's hand-tuned building blocks is worth in a whole pre-training step.

  python benchmarks/cpu_step_ablation.py --size=mini --rounds=6

The step of `pretrain_step_throughput.py` (seq 128, batch 32, 20 masked positions, fp32, AdamW)
compiled several times in one process, each variant swapping one part back to the textbook
JAX/Flax form, and timed in interleaved rounds (best round each):

  current           bert_jax as it is
  jax_gelu          jax.nn.gelu(approximate=False) instead of ops.gelu
  flax_dropout      flax.linen.Dropout (32-bit bernoulli draws) instead of ops.Dropout
  plain_bias        x + bias instead of ops.add_bias
  einsum_attention  einsums over [B, S, N, D] instead of modeling.xla_attention's layout
  optax_xent        optax.softmax_cross_entropy_with_integer_labels and argmax accuracy
                    instead of ops.softmax_cross_entropy
  textbook          all of them

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

# As bert_jax.main does, before JAX, TensorFlow or PyTorch start threads: both sides of the
# comparison then reuse freed host memory (bert_jax/host_memory.py).
from bert_jax import host_memory  # noqa: E402
host_memory.keep_freed_memory()

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from benchmarks.pretrain_step_throughput import jax_step  # noqa: E402
from bert_jax import modeling, ops  # noqa: E402


def einsum_attention(q, k, v, bias, dropout):
  """The attention of modeling.xla_attention as einsums over [B, S, N, D]."""
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  logits = jnp.einsum("bqnd,bknd->bnqk", q, k, preferred_element_type=jnp.float32)  # [B,N,S,S]
  probs = dropout(jax.nn.softmax(logits + bias, axis=-1).astype(v.dtype))
  return jnp.einsum("bnqk,bknd->bqnd", probs, v)                                    # [B,S,N,D]


def optax_cross_entropy(logits, labels):
  logits = logits.astype(jnp.float32)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return nll, (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


# (module, attribute): textbook replacement. The model and loss look these up when the step is
# traced (its first call).
TEXTBOOK = {"jax_gelu": (ops, "gelu", functools.partial(jax.nn.gelu, approximate=False)),
            "flax_dropout": (ops, "Dropout", nn.Dropout),
            "plain_bias": (ops, "add_bias", lambda x, bias: x + bias),
            "einsum_attention": (modeling, "xla_attention", einsum_attention),
            "optax_xent": (ops, "softmax_cross_entropy", optax_cross_entropy)}
VARIANTS = {"current": (), **{name: (name,) for name in TEXTBOOK}, "textbook": tuple(TEXTBOOK)}


def compiled_step(size: str, batch: int, seq: int, swapped):
  """The train step compiled with the `swapped` parts replaced by TEXTBOOK's; a callable."""
  saved = {name: getattr(module, attr) for name, (module, attr, _) in TEXTBOOK.items()}
  for name in swapped:
    module, attr, replacement = TEXTBOOK[name]
    setattr(module, attr, replacement)
  try:
    one = jax_step(size, batch, seq)
    one()
  finally:
    for name, (module, attr, _) in TEXTBOOK.items():
      setattr(module, attr, saved[name])
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
