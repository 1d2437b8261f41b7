r"""The README's main job: pre-train a small BERT on a corpus every machine has, on a CPU.

  python -m bert_jax.main --config=experiments/pretrain_demo.py --workdir=/tmp/bert_demo

The corpus is Python's own documentation (the language reference topics and the standard
library's docstrings, ~2,000 documents, 1.5 MB; see data_pipelines/demo_corpus.py). The first run
learns an 8k WordPiece vocabulary and writes dynamic-masking records to WORKDIR/data, then trains
BERT-mini-sized layers with MLM + NSP. Point it at your own corpus with
`--config.data.input_files=...  --config.data.vocab_file=...  --config.data.prepare_demo_corpus=False`.
Interrupt it any time; the same command resumes exactly.

Expected result: see EXPECTED below (measured on a 2-core CPU).
`:quick` runs a few steps on a few hundred documents (the tests use it).
"""
from experiments import pretrain_bert_base, pretraining_defaults

EXPECTED = "to be measured"


def get_config(arg=None):
  args = pretraining_defaults.parse_arg(arg, quick=False)
  c = pretraining_defaults.get_config("mini")
  c.model.update(vocab_size=8000, max_position_embeddings=128)
  c.max_seq_length, c.max_predictions_per_seq = 128, 20
  c.global_batch_size, c.eval_batch_size = 32, 64
  c.num_train_steps, c.warmup_steps, c.learning_rate = 600, 60, 1e-3
  c.log_every_steps, c.eval_every_steps, c.eval_steps = 50, 200, 0
  c.checkpoint_every_steps, c.keep_checkpoints = 100, 2
  c.data.prepare_demo_corpus = True
  c.data.dupe_factor = 5
  c.data.shuffle_buffer_size = 5000
  if args["quick"]:
    pretrain_bert_base.quick(c)
  return c
