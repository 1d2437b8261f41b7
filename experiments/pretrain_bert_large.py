r"""BERT-large pre-training with the paper's recipe: L=24, H=1024, A=16 (340M parameters).

  python -m bert_jax.main --config=experiments/pretrain_bert_large.py:phase=1 --workdir=...
  python -m bert_jax.main --config=experiments/pretrain_bert_large.py:phase=2 --workdir=... \
    --config.init_checkpoint=PHASE1_WORKDIR
Same recipe as base (batch 256, lr 1e-4, 90% at 128 tokens, 10% at 512); the paper used 64 TPU
chips for 4 days. `:quick` is the tests' few-step version.
"""
from experiments import pretrain_bert_base, pretraining_defaults


def get_config(arg=None):
  args = pretraining_defaults.parse_arg(arg, phase=1, quick=False, size="large")
  return pretrain_bert_base.build(args)
