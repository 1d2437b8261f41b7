r"""Time to quality, four sides: BERT's recipe and the modern recipe, each in bert_jax and in
`transformers` (its `Trainer`), pre-trained from scratch for the same wall-clock budget on the same
corpus and vocabulary, then every checkpoint fine-tuned on GLUE with one recipe.

  side             model                               recipe
  bert_jax         BERT-mini (bert_jax)                BERT's: MLM 15% + NSP, AdamW, linear decay
  transformers     BertForPreTraining                  BERT's, as the Trainer does it
  bert_jax_modern  ModernBERT family, BERT-mini's size  modern: MLM 30% alone on contiguous text,
                   (bert_jax)                          StableAdamW, warmup-stable-decay (1-sqrt),
                                                       batch warm-up
  hf_modern        ModernBertForMaskedLM               modern, as the Trainer does it

The full run, in this order (each stage alone on an otherwise idle machine, one at a time: the
sides are timed; every stage resumes when the same command is run again after an interruption):

  python -m benchmarks.time_to_quality --prepare --out=/tmp/ttq
  python -m benchmarks.time_to_quality --side=bert_jax --budget_minutes=60 --out=/tmp/ttq
  python -m benchmarks.time_to_quality --side=transformers --budget_minutes=60 --out=/tmp/ttq
  python -m benchmarks.time_to_quality --side=bert_jax_modern --budget_minutes=60 --out=/tmp/ttq
  python -m benchmarks.time_to_quality --side=hf_modern --budget_minutes=60 --out=/tmp/ttq
  python -m benchmarks.time_to_quality --finetune --out=/tmp/ttq
  python -m benchmarks.time_to_quality --report --out=/tmp/ttq --plot=benchmarks/time_to_quality.png

Expected durations on a 2-core CPU: `--prepare` about 10 minutes at the default dupe factor
(2 min 8 s with --dupe_factor=1 on a busy machine, 43 s of it the contiguous-text part); each
side about 65-70 minutes of wall clock (a calibration of ~1-2 minutes, the 60 training minutes,
the evaluations and checkpoint saves, which the training clock leaves out); `--finetune` about an
hour per side (BERT-mini's: ~2 h for two sides); `--report` seconds. All of it: about 9 hours.
`--finetune` fine-tunes every side whose pre-training has finished (OUT/<side>/summary.json) and
skips finished tasks, so it can also run after each side (`--ft_sides=a,b` names sides);
`--report` reports whatever has finished and names the sides not yet run. An OUT/data prepared
before the modern sides existed gets its contiguous-text part from `--prepare` run again.

In the background, so that a stage outlives the shell: `nohup python -m benchmarks.time_to_quality
--side=bert_jax --out=/tmp/ttq > /tmp/ttq/bert_jax.log 2>&1 &` (and the same for the others).
`--finetune` and `--report` write OUT/time_to_quality.md (tables to paste into
benchmarks/RESULTS.md: every side's pre-training, GLUE per task and on average, and the issue's
goals, met or not), OUT/time_to_quality.json and the plot (`--plot`, OUT/time_to_quality.png
unless named: held-out MLM loss and accuracy against training minutes on both held-out sets,
BERT's recipe solid, the modern dashed; the committed benchmarks/time_to_quality.png is
written only by the last command above, once every side has finished).

Why: a faster step is only worth something if it buys quality, and a recipe only if it buys
quality per hour. The two sides of a recipe get the same data, model, recipe and minutes (what
differs is how many updates each fits into them); the two recipes get the same corpus,
vocabulary, held-out documents, budget and model size (what differs is the recipe). The goals
(issue 40): the modern recipe ahead of BERT's on the GLUE average by more than the seed spread,
and bert_jax's modern side at least equal to transformers' on GLUE at 1.3x its steps per hour or
more.

Needs torch, transformers, accelerate (Trainer), torch-optimi (hf_modern's StableAdamW; a test
extra) and matplotlib (the plot).

`--prepare` (OUT/data, once; times above): the corpus is every `*.txt` under `--text_dir`
(../shared/data/text: 14 Gutenberg books, one sentence per line, and tinyshakespeare, raw
text) plus Python's documentation (data_pipelines/demo_corpus.py), about 1.5M words. The books
have no document boundaries, so documents are runs of at most `--sentences_per_document` consecutive
sentences, cut at chapter headings as well (a file with blank lines is raw text: split into
sentences by data_pipelines/sentences.py, speaker lines such as "ROMEO:" dropped). Documents are
shuffled with a fixed seed (so that the data builder's blocks, and the random "next" sentences
of NSP drawn within a block, mix all sources as the original's single pool did) and every
`--holdout_every`-th one is held out for evaluation. An 8,000-entry uncased WordPiece vocabulary
is learned on the training part only (why 8k: ~1.5M words hold 12.8k word types seen 5 times or
more; at 8k, words seen ~10+ times stay whole and the rest are pieces that each occur often
enough to be learned in a budget that passes over the corpus only a few times; the demo corpus
of similar size uses 8k too). Records are the original algorithm's
(`data_pipelines.create_pretraining_data`, seq 128, dupe factor 10: ~200k instances, more than
the faster side reads in 60 minutes), unmasked (dynamic masking). The modern sides' records are
the same training documents as contiguous text (`--instances=contiguous`: each document's tokens
followed by [SEP], the stream cut into [CLS] + 126 tokens + [SEP]; each of the 10 passes orders
the documents afresh, so it cuts the rows elsewhere: 14,478 rows a pass, ~145k in all), also
unmasked. The training instances of both kinds are also stored as numpy
(OUT/data/train_instances.npz, train_contiguous_instances.npz) for the transformers sides.

The held-out evaluation: every side is scored, every ~`--eval_every_minutes` of training time and
at the end, on two fixed sets built once from the same held-out documents, both masked once at
15% (80/10/10, at most 20 predictions a row, fixed seed) by bert_jax's evaluation pipeline and
stored as numpy batches, so that all four sides are scored on the very same instances and masked
positions (the demo's modern twin was not: its held-out rows had another form than the BERT
demo's). The `pairs` set (OUT/data/eval_batches.npz; 1,024 sequences, 16,198 masked tokens) is
the held-out documents as BERT's NSP pairs, the `text` set (eval_text_batches.npz; 708 rows,
13,445 masked tokens) as contiguous text. Both are reported because neither form is neutral: the
pairs are BERT's training form (a second segment that is a random other document's half the time,
token types, a [SEP] inside the row), the text is the modern recipe's; a ModernBERT-family model
ignores token types, and BERT's reads a contiguous row as one long first segment. The held-out
MLM numbers say how each model fills masked positions of each form; GLUE, the same for all, is
the comparison of record. The metrics are bert_jax's (`pretraining.loss_from_terms`: MLM =
sum(w * nll) / sum(w) over the masked positions, accuracy = argmax hits; NSP on the pairs for the
BERT models), computed on the jax sides by the job's own `eval_step` on the numpy batches and on
the transformers sides by the same sums over the models' logits at the masked positions
(`hf_side.score_torch`).

`--side=bert_jax`, `--side=transformers` (OUT/<side>), BERT's recipe: BERT-mini (L=4, H=256,
A=4, vocab 8k, dropout 0.1, float32) from random
initialisation, MLM + NSP, batch 64 x 128, peak lr 5e-4 (post-LN small models stall at 1e-3+,
experiments/pretrain_demo.py), linear warm-up over the first 5% of the side's steps then linear
decay to 0 at its last step, AdamW (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 except biases
and LayerNorm), gradient clipping at global norm 1.0.
  bert_jax: bert_jax's pre-training job as `registry.run_job` runs it (tf.data pipeline with
    dynamic masking, 15%, 80/10/10, at most 20 predictions per sequence; AdamW as the original,
    without bias correction; the original schedule, whose decay runs over all steps), with its
    evaluation on the fixed sets (jax_side.py).
  transformers: `BertForPreTraining` with `transformers.Trainer` and
    `DataCollatorForLanguageModeling` (15%, 80/10/10, a Bernoulli draw per token, so no cap
    of 20), the same unmasked instances with their NSP labels, sequences padded per batch to the
    longest (its usual dynamic padding). Its usual optimizer and schedule: torch AdamW (fused,
    with bias correction), `lr_scheduler_type="linear"` (decay over the steps after warm-up).
    Its model computes MLM logits at every position, as BertForPreTraining does.

`--side=bert_jax_modern`, `--side=hf_modern` (OUT/<side>), the modern recipe (ModernBERT's, as
experiments/pretrain_modernbert.py carries it, at this scale as experiments/pretrain_demo.py's
`modern_twin` does; modern.py): a ModernBERT-family model of BERT-mini's size (4 layers of
H=256, 4 heads, GeGLU 704 wide: 2/3 of BERT's 1,024, the same MLP weights; layers 0 and 3
global, 1 and 2 in a `--local_attention`=64-token window; rotary positions, both bases 10,000;
pre-norm, no biases, no dropout; 5.34M parameters against BertForPreTraining's 5.48M), float32,
from random initialisation; masked LM alone at `--modern_masking`=30% (80/10/10) on the
contiguous-text rows, no NSP; batch 64 x 128 after a batch warm-up from `--batch_warmup_start`=16
rows in equal steps of 16 over the first `--batch_warmup_fraction`=10% of the side's tokens;
StableAdamW (betas 0.9/0.98, eps 1e-6, weight decay 1e-5 fully decoupled, off biases and norms,
no gradient clipping); warmup-stable-decay: peak lr `--modern_lr`=1e-3 (a pre-norm model takes a
higher rate than BERT's post-norm 5e-4; the demo's twin runs 2e-3 at half this width; not tuned
at this scale) after a linear warm-up over `--warmup_proportion`=5% of the tokens (counted
through the ramp), constant, then a 1-sqrt decay to 0 over the last `--decay_fraction`=20% of the
steps (one run: ModernBERT decays in a phase of its own).
  bert_jax_modern: the same job as bert_jax's with this config (the masks drawn while reading,
    at most 40 predictions per row; the ramp by `config.batch_warmup`: the input yields batches
    of 16 rows and a step takes 1-4 of them; the step is compiled once per batch size).
  hf_modern: transformers' `ModernBertForMaskedLM` (its own initialisation and attention, sdpa;
    `sparse_prediction=True`: the head and decoder at the masked positions only, as ModernBERT's
    training and bert_jax compute them) of the same config (bert_jax's export translation of
    it) under `transformers.Trainer`: `optim="stable_adamw"`, torch-optimi's `StableAdamW`, the
    closest torch optimizer: ModernBERT's own, the one benchmarks/pretrain_side_by_side.py
    compares bert_jax's `stable_adamw` with, here with `decouple_lr` (the weight decay fully
    decoupled, as bert_jax's);
    `lr_scheduler_type="warmup_stable_decay"` with `decay_type="1-sqrt"`, the same rate at
    every step as bert_jax's schedule; `max_grad_norm=0`; `DataCollatorForLanguageModeling` at
    30% (a Bernoulli draw per token, no cap), sequences padded per batch. The Trainer has no batch
    warm-up: its training dataloader is replaced (`hf_side.ramp_trainer`) by one whose step s
    holds the ramp's rows for s (seeded permutations of the rows), so both modern sides train
    batches of the same sizes at the same steps.

  Every schedule needs a step count. Each side first measures its own speed in a short
  calibration run (`--calibration_steps` x 3 steps: the first window holds compilation or
  warm-up, the last two give steps/s), then trains for
  `num_train_steps = (budget - measured start-up) x steps/s`, so that each side's schedule ends
  at the budget (`--calibrate --side=...` prints the calibration alone). A modern side calibrates
  at the full batch and trains the tokens those steps would train, through the ramp
  (schedule.py: more, smaller steps first; bert_jax is charged a start-up per batch size, for its
  compiles). The training clock runs
  from the start of the training loop (compilation, input pipeline and logging count) and stops
  during evaluations and checkpoint saves, on both sides: bert_jax's own clock (`train_seconds`
  in metrics.jsonl: the loop waits for the steps in flight before it pauses, as JAX dispatches
  asynchronously), and a `TrainerCallback` on the transformers side. Held-out MLM loss and
  accuracy on both held-out sets are recorded every ~`--eval_every_minutes` of training time to
  OUT/<side>/curve.jsonl: the jax sides' loop evaluation every N steps (N = interval x planned
  steps/s), the transformers sides by their clock. Checkpoints every
  ~`--checkpoint_every_minutes`: the jax sides resume from their workdir (exactly, anywhere on
  the ramp), the Trainer with `resume_from_checkpoint` (the same rows in the same order; the
  collator's masks are drawn afresh from the first resumed batch on, because the Trainer
  restores its random state only after drawing that batch); the clock reached at each
  checkpoint is saved with it and a resumed run continues from there (paying compilation again,
  ~0.5 min). The transformers sides end with `save_pretrained` + vocab.txt in OUT/<side>/final.

`--finetune` (OUT/finetune/<side>/<task>): every checkpoint with one recipe, bert_jax's GLUE
fine-tuning (`bert_jax.tasks.datasets.glue.run`, what `glue.run_all` runs for each task; called
per task because a training subset applies to one task only): SST-2, MRPC, STS-B, RTE, CoLA,
whole dev sets, `--seeds` restarts, batch 32, lr 1e-4 (small models want a higher rate than
BERT-base's 2e-5..5e-5), 3 epochs, warm-up 10%, max length 128, batches cut to their longest row
(`length_bucket=16`: same outputs, less padding computed). SST-2's training set is cut to the
first `--ft_train_examples` (default sst2=20000, 30%, the same label balance, 55% positive,
and sentence length as the whole set; the other training sets are whole): about 1 h per side
instead of ~1.75 h (estimated from BERT-mini's fine-tuning speed; `--ft_train_examples=""` for
the whole set). A finished task (OUT/finetune/<side>/<task>/ttq.json) is not run again. The
modern checkpoints are read as any other (`bert_jax.io.checkpoints.load_pretrained`: the
architecture, `modernbert`, is the checkpoint's; a sequence classifier pools the mean of the
tokens, `classifier_pooling="mean"` on both modern sides, as the released ModernBERT).

Measured results: benchmarks/RESULTS.md ("Time to quality").
"""
import os

# On import too (the test imports the parts): CPU only, no hub downloads, quiet TensorFlow.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
