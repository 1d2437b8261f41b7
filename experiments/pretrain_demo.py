r"""The README's main job: pre-train a small BERT on a corpus every machine has, on a CPU.

  python -m bert_jax.main --config=experiments/pretrain_demo.py --workdir=$HOME/bert_demo

The corpus is Python's own documentation (the language reference topics and the standard
library's docstrings, ~2,000 documents, 1.5 MB; see data_pipelines/demo_corpus.py). The first run
learns an 8k WordPiece vocabulary and writes dynamic-masking records to WORKDIR/data, then trains
a BERT-tiny-sized model (L=2, H=128, A=2) with MLM + NSP for 3,000 steps of 32 x 128 tokens.
Point it at your own corpus with `--config.data.input_files=...
--config.tokenizer.vocab_file=... --config.data.prepare_demo_corpus=False`.
Interrupt it any time; the same command resumes exactly.

Expected result: a held-out masked-LM accuracy of about 0.2 after 3,000 steps (always predicting
the most frequent token scores 0.042), NSP about 0.75, in about ten minutes on a 2-core CPU with
data preparation and compiling; the measured curve, machine and date are in benchmarks/RESULTS.md
("The demo: what moves held-out masked-LM accuracy", which also says why this recipe and not a
bigger model or vocabulary). A run is bitwise the same on every run of one machine and set of
versions (tests/test_environment.py); on another CPU the values differ slightly, because XLA
compiles the step for the host's instruction set (docs/runtime.md), so WORKDIR/environment.jsonl
records the machine and versions of each run.
`:quick` runs a few steps on a few hundred documents (the tests use it).

`:recipe=modern` is the demo's twin with the modern recipe (docs/modern-encoders.md): the same
corpus, learned 8k vocabulary and held-out documents, scored at the same 15% held-out masking; a
ModernBERT-family model of about the same size (4 layers of H=128, global / local / local /
global with a 64-token window, GeGLU 192 wide: 0.56M encoder parameters against BERT-tiny's
0.39M), the masked LM alone at 30% on documents kept apart (as sequences of their own, packed
into rows), no dropout, StableAdamW and warmup-stable-decay with a
1-sqrt decay over the last fifth, the batch rising from 8 to 32 rows over the first 1.2M tokens;
1,870 steps (419.3 s on a 2-core EPYC where the BERT demo takes 428.3 s). Both runs side by side,
each final model scored on both held-out sets (`python -m benchmarks.demo_pair --out=DIR`): benchmarks/RESULTS.md,
"The demo's modern twin, at equal wall-clock time".
"""
from experiments import pretrain_bert_base, pretrain_modernbert, pretraining_defaults


def get_config(arg=None):
  args = pretraining_defaults.parse_arg(arg, quick=False, recipe="bert")
  if args["recipe"] == "modern":
    return modern_twin(args["quick"])
  if args["recipe"] != "bert":
    raise ValueError(f"recipe={args['recipe']!r}: expected bert or modern")
  c = pretraining_defaults.get_config("tiny")  # L=2, H=128, A=2
  c.model.update(vocab_size=8000, max_position_embeddings=128)
  c.max_seq_length, c.max_predictions_per_seq = 128, 20
  c.global_batch_size, c.eval_batch_size = 32, 64
  # What moved held-out MLM accuracy at a fixed number of steps (benchmarks/RESULTS.md, "The
  # demo: what moves held-out masked-LM accuracy"): a 4x higher peak learning rate once the
  # warm-up is long enough for this post-LN model (with 100 warm-up steps, 1e-3 and above left
  # it at the unigram plateau, predicting "the" everywhere; 1e-3 after 200 and 2e-3 after 500
  # learn faster than 5e-4), and no dropout (a short run underfits; dropout only slows it). A
  # smaller vocabulary (2k) and a wider model (H=256) did worse at the same steps.
  c.num_train_steps, c.warmup_steps, c.learning_rate = 3000, 500, 2e-3
  c.model.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  c.log_every_steps, c.eval_every_steps, c.eval_steps = 100, 500, 0
  c.checkpoint_every_steps, c.keep_checkpoints = 500, 2
  c.data.prepare_demo_corpus = True
  c.data.dupe_factor = 5
  c.data.shuffle_buffer_size = 5000
  if args["quick"]:
    pretrain_bert_base.quick(c)
  return c


def modern_twin(quick: bool):
  """The modern recipe on the demo's corpus and budget (see the module docstring)."""
  c = pretrain_modernbert.get_config("size=base")   # objective, masking, data, optimizer, schedule
  c.model.update(num_hidden_layers=4, hidden_size=128, num_attention_heads=2,
                 intermediate_size=192, vocab_size=8000, local_attention=64, pad_token_id=0,
                 dtype="float32")
  # No dropout, as the BERT demo (a short run underfits; dropout only slows it): the recipe's 0.1
  # on the attention output is for its 1.7T tokens.
  c.model.attention_output_dropout_prob = 0.0
  c.shard_optimizer_state = False   # one host, usually one device: nothing to split the moments over
  c.max_seq_length, c.max_predictions_per_seq = 128, 40     # 0.30 * 126 = 38 predictions a row
  c.global_batch_size, c.eval_batch_size = 32, 64
  # The recipe's batch warm-up, scaled: 8 -> 32 rows over the first 1.2M tokens (587 steps,
  # about 196 at each of 8, 16 and 24 rows).
  c.batch_warmup.start_batch_size, c.batch_warmup.tokens = 8, 1.2e6
  # A pre-norm model takes the BERT demo's rate after a shorter warm-up. 1,870 steps: 417.1 s of
  # training on a 2-core EPYC where the demo's 3,000 took 425.5 s (this model's steps are ~0.235 s
  # against BERT-tiny's ~0.14: twice the layers, 30% masked). 2,000 steps took 447.5 s there:
  # ModernBERT's ramp, as many steps at each level, trains 8% more tokens in them than the
  # equal-token ramp the twin had when 2,000 fit (benchmarks/history/2026-11-26-demo-pair.md).
  c.num_train_steps, c.warmup_steps, c.learning_rate = 1870, 300, 2e-3
  c.schedule.update(decay_fraction=0.2, decay_shape="1-sqrt", final_fraction=0.0)
  c.log_every_steps, c.eval_every_steps, c.eval_steps = 100, 500, 0
  c.checkpoint_every_steps, c.keep_checkpoints = 500, 2
  c.data.prepare_demo_corpus = True
  c.data.dupe_factor = 5
  c.data.shuffle_buffer_size = 5000
  if quick:
    pretrain_bert_base.quick(c)
    c.batch_warmup.start_batch_size = 0
    c.model.update(vocab_size=800, local_attention=32, num_hidden_layers=4)
    c.max_seq_length, c.max_predictions_per_seq = 64, 20
  return c
