r"""BERT-base pre-training with the paper's recipe (spec section 4).

Phase 1, 90% of the steps at 128 tokens:
  python -m bert_jax.main --config=experiments/pretrain_bert_base.py:phase=1 --workdir=gs://b/p1 \
    --config.data.input_files='gs://b/data/seq128/*.tfrecord' \
    --config.tokenizer.vocab_file=vocab.txt
Phase 2, the last 10% at 512 tokens, initialised from phase 1's workdir:
  python -m bert_jax.main --config=experiments/pretrain_bert_base.py:phase=2 --workdir=gs://b/p2 \
    --config.init_checkpoint=gs://b/p1 --config.data.input_files='gs://b/data/seq512/*.tfrecord'
Batch 256, Adam lr 1e-4 (beta 0.9/0.999, eps 1e-6, weight decay 0.01), warm-up 10k steps then
linear decay, dropout 0.1; bfloat16 compute with float32 parameters and optimizer state. The paper
trained 1M steps in 4 days on 16 TPU chips.
`:quick` shrinks everything (tiny model, a corpus built from Python's own documentation) so the
tests run the real configuration for a few steps.
"""
from experiments import pretraining_defaults


def get_config(arg=None):
  args = pretraining_defaults.parse_arg(arg, phase=1, quick=False, size="base")
  return build(args)


def build(args):
  c = pretraining_defaults.get_config(args["size"])
  total_steps = 1_000_000
  if args["phase"] == 1:
    c.max_seq_length, c.max_predictions_per_seq = 128, 20
    c.num_train_steps = int(total_steps * 0.9)
  elif args["phase"] == 2:
    c.max_seq_length, c.max_predictions_per_seq = 512, 80
    c.num_train_steps = int(total_steps * 0.1)
  else:
    raise ValueError(f"phase={args['phase']}: expected 1 or 2")
  # bfloat16 compute, float32 parameters and optimizer state: on a TPU the step moves 15% fewer
  # bytes (BERT-base phase 1 on v5litepod-8: 35.1 against 41.4 GB per chip, libtpu's count,
  # benchmarks/RESULTS.md); on a GPU it is what the tensor cores run. --config.model.dtype=float32
  # gives the float32 step.
  c.model.dtype = "bfloat16"
  if args["quick"]:
    quick(c)
  return c


def quick(c):
  """A few steps of a tiny model on data built from Python's documentation (no download)."""
  c.model.dtype = "float32"   # the tests' CPUs: bfloat16 is emulated there (slower, no gain)
  c.model.update(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                 intermediate_size=128, vocab_size=800,
                 max_position_embeddings=128)  # the same in both phases, as in the real recipe
  c.max_seq_length = min(c.max_seq_length, 64)
  c.max_predictions_per_seq = min(c.max_predictions_per_seq, 10)
  c.global_batch_size, c.eval_batch_size = 8, 8
  c.num_train_steps, c.warmup_steps = 4, 2
  c.log_every_steps, c.checkpoint_every_steps, c.eval_every_steps, c.eval_steps = 2, 2, 4, 2
  c.data.shuffle_buffer_size = 100
  c.data.prepare_demo_corpus = True
  c.data.demo_max_documents = 300
  c.data.dupe_factor = 1
