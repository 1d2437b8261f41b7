r"""What each of bert_jax's hand-tuned building blocks is worth in a whole pre-training step.

  python -m benchmarks.cpu_step_ablation --size=mini --rounds=6

The step of `pretrain_step_throughput.py` (seq 128, batch 32, 20 masked positions, fp32, AdamW)
compiled several times in one process, each variant with one part back in its textbook JAX/Flax
form through the model option `config.model.kernels` (bert_jax/model/kernels.py), and timed in
interleaved rounds (best round each):

  current           bert_jax as it is (kernels="auto": every tuned form on CPU)
  jax_gelu, flax_dropout, plain_bias, einsum_attention, optax_xent, autodiff_dense
                    one part in its textbook form (kernels="<part>")
  textbook          all of them (kernels="textbook")

Micro-benchmarks of a single op mislead here: XLA fuses each op with its neighbours, so only
the whole step says what a change is worth.
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# As bert_jax.main does, before JAX, TensorFlow or PyTorch start threads: both sides of the
# comparison then reuse freed host memory (bert_jax/runtime/host_memory.py).
from bert_jax.runtime import host_memory  # noqa: E402
host_memory.keep_freed_memory()

from benchmarks import ablations, bench_util, pretrain_step_throughput  # noqa: E402

# Float32 on CPU: cast_then_gather (the lookup's dtype under mixed precision) changes nothing
# here, and "tuned" is "current".
CPU_PARTS = tuple(p for p in ablations.PARTS if p != "cast_then_gather")
VARIANTS = {name: overrides for name, overrides in ablations.kernel_variants(CPU_PARTS).items()
            if name != "tuned"}


def compiled_step(size: str, batch: int, seq: int, overrides):
  """`pretrain_step_throughput.jax_step` with `overrides` of config.model, compiled; a callable
  running one step."""
  one = pretrain_step_throughput.jax_step(size, batch, seq, overrides)
  one()  # traced and compiled here
  return one


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--size", default="mini")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--variants", default=",".join(VARIANTS),
                      help="comma list of: " + ",".join(VARIANTS))
  parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
  parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds; best counts")
  args = parser.parse_args()
  print(bench_util.machine_line(), flush=True)
  names = args.variants.split(",")
  unknown = [n for n in names if n not in VARIANTS]
  if unknown:
    parser.error(f"unknown variants {unknown}; expected some of {list(VARIANTS)}")
  fns = {n: compiled_step(args.size, args.batch, args.seq, VARIANTS[n]) for n in names}
  seconds = bench_util.interleaved_best(fns, rounds=args.rounds, steps=args.steps)
  for name in names:
    print(json.dumps({"size": args.size, "variant": name, "steps_per_sec": round(1 / seconds[name], 3),
                      "ms_per_step": round(1e3 * seconds[name], 1),
                      "vs_current": round(seconds[name] / seconds["current"], 3)
                      if "current" in seconds else None}), flush=True)


if __name__ == "__main__":
  main()
