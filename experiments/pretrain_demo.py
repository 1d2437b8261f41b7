r"""The README's main job: pre-train a small BERT on a corpus every machine has, on a CPU.

  python -m bert_jax.main --config=experiments/pretrain_demo.py --workdir=/tmp/bert_demo

The corpus is Python's own documentation (the language reference topics and the standard
library's docstrings, ~2,000 documents, 1.5 MB; see data_pipelines/demo_corpus.py). The first run
learns an 8k WordPiece vocabulary and writes dynamic-masking records to WORKDIR/data, then trains
a BERT-tiny-sized model (L=2, H=128, A=2) with MLM + NSP for 3,000 steps of 32 x 128 tokens.
Point it at your own corpus with `--config.data.input_files=...
--config.tokenizer.vocab_file=... --config.data.prepare_demo_corpus=False`.
Interrupt it any time; the same command resumes exactly.

Expected result (measured on an idle 2-core CPU, 2026-11-24): held-out masked-LM accuracy 0.149
at step 500, 0.169 at 1,000, 0.179 at 1,500, 0.187 at 2,000, 0.194 at 2,500 and 0.200 at 3,000
(always predicting the most frequent token scores 0.042), NSP accuracy 0.75; 6-7 steps/s
(~210 sequences/s) once compiled, 9 min 49 s in all with data preparation and compiling. The
values are bitwise the same on every run of one machine and set of versions
(tests/test_environment.py), and move by about 0.005 with any change to the random streams. On
another CPU they differ, because XLA compiles the step for the host's instruction set: on a 2-core
Intel Xeon with AVX-512 and AMX (2026-11-25, jax 0.10.2, the same versions), 0.148 / 0.167 /
0.173 / 0.179 / 0.184 / 0.189 at steps 500-3,000 (two runs, identical), and with
XLA_FLAGS=--xla_cpu_max_isa=AVX2 on that machine 0.145 / 0.169 / 0.180 / 0.188 / 0.193 / 0.197.
WORKDIR/environment.jsonl records the machine and versions of each run. Why this recipe and not a bigger model or vocabulary: benchmarks/RESULTS.md.
`:quick` runs a few steps on a few hundred documents (the tests use it).

`:recipe=modern` is the demo's twin with the modern recipe (docs/modern-encoders.md): the same
corpus, learned 8k vocabulary and held-out documents, scored at the same 15% held-out masking; a
ModernBERT-family model of about the same size (4 layers of H=128, global / local / local /
global with a 64-token window, GeGLU 192 wide: 0.56M encoder parameters against BERT-tiny's
0.39M), the masked LM alone at 30% on contiguous text, StableAdamW and warmup-stable-decay with a
1-sqrt decay over the last fifth, the batch rising from 8 to 32 rows over the first 1.2M tokens.
Measured once (2026-11-25, the same 2-core AMD EPYC,
idle): 10 min 26 s in all, held-out MLM accuracy at 15% masking 0.240 / 0.346 / 0.372 / 0.396 /
0.412 / 0.436 at steps 500-3,000, against the BERT demo's 0.149 ... 0.200 in 9 min 49 s. Not
yet the equal-budget comparison: the held-out instances differ in form (contiguous text here,
NSP pairs there, from the same held-out documents), and no part of the difference is yet
attributed (benchmarks/RESULTS.md).
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
  c.max_seq_length, c.max_predictions_per_seq = 128, 40     # 0.30 * 126 = 38 predictions a row
  c.global_batch_size, c.eval_batch_size = 32, 64
  # The recipe's batch warm-up, scaled: 8 -> 32 rows over the first 1.2M tokens (717 steps).
  c.batch_warmup.start_batch_size, c.batch_warmup.tokens = 8, 1.2e6
  # A pre-norm model takes the BERT demo's rate after a shorter warm-up.
  c.num_train_steps, c.warmup_steps, c.learning_rate = 3000, 300, 2e-3
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
