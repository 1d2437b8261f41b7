r"""BERT-large with LAMB and very large batches (You et al. 2019, "76 minutes").

  python -m bert_jax.main --config=experiments/pretrain_lamb_large_batch.py:phase=1 --workdir=...
  python -m bert_jax.main --config=experiments/pretrain_lamb_large_batch.py:phase=2 \
    --workdir=... --config.init_checkpoint=PHASE1_WORKDIR

Phase 1: batch 65,536 at 128 tokens for 7,038 steps, lr 6e-3 with 2,000 warm-up steps.
Phase 2: batch 32,768 at 512 tokens for 1,563 steps, lr 4e-3 with 200 warm-up steps.
LAMB: beta 0.9/0.999, eps 1e-6, weight decay 0.01 (not on LayerNorm/biases), layer-wise trust
ratio. On fewer chips than the paper's 1,024, keep the global batch with
`--config.grad_accum_steps=K` (the same update as the large batch, K micro-batches per step).
`:quick` is the tests' few-step version.
"""
from experiments import pretrain_bert_base, pretraining_defaults


def get_config(arg=None):
  args = pretraining_defaults.parse_arg(arg, phase=1, quick=False, size="large")
  c = pretraining_defaults.get_config(args["size"])
  c.optimizer.name = "lamb"
  if args["phase"] == 1:
    c.global_batch_size, c.max_seq_length, c.max_predictions_per_seq = 65_536, 128, 20
    c.num_train_steps, c.warmup_steps, c.learning_rate = 7_038, 2_000, 6e-3
  elif args["phase"] == 2:
    c.global_batch_size, c.max_seq_length, c.max_predictions_per_seq = 32_768, 512, 80
    c.num_train_steps, c.warmup_steps, c.learning_rate = 1_563, 200, 4e-3
  else:
    raise ValueError(f"phase={args['phase']}: expected 1 or 2")
  if args["quick"]:
    pretrain_bert_base.quick(c)
    c.grad_accum_steps = 2  # exercise accumulation with the large-batch recipe
  return c
