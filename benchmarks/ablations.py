"""The ablations of bert_jax's hand-tuned building blocks, as model config changes.

The textbook forms live in the package (bert_jax/model/kernels.py, which lists the parts); a
variant here is the `config.model` fields that pick them, so `gpu_pretrain_mfu.py --variants`
compiles each variant's step from its own config, in one process, and times them in interleaved
rounds (the CPU ablation that chose `auto`'s CPU forms: benchmarks/history/
2026-11-28-finished-studies.md):

  current           the default, `kernels="auto"`: what measured faster on this backend
  tuned             every hand-tuned form (differs from current on GPU: plain_bias, optax_xent)
  <part>            current with that part in textbook form (`kernels="<part>"`), e.g. jax_gelu
  textbook          every textbook form
"""
from bert_jax.model import kernels

PARTS = kernels.PARTS


def kernel_variants(parts=PARTS):
  """{variant name: config.model overrides} for current, tuned, each of `parts`, textbook."""
  return {"current": {}, "tuned": {"kernels": "tuned"},
          **{part: {"kernels": part} for part in parts},
          "textbook": {"kernels": "textbook"}}
