r"""Time to quality: BERT-mini pre-trained from scratch for the same wall-clock budget by bert_jax
and by `transformers` (its `Trainer`), then both checkpoints fine-tuned on GLUE with one recipe.

The full run (each stage on an otherwise idle machine, one at a time; every stage resumes when
the same command is run again after an interruption):

  python -m benchmarks.time_to_quality --prepare --out=/tmp/ttq
  python -m benchmarks.time_to_quality --side=bert_jax --budget_minutes=60 --out=/tmp/ttq
  python -m benchmarks.time_to_quality --side=transformers --budget_minutes=60 --out=/tmp/ttq
  python -m benchmarks.time_to_quality --finetune --out=/tmp/ttq
  python -m benchmarks.time_to_quality --report --out=/tmp/ttq --plot=benchmarks/time_to_quality.png

In the background, so that a stage outlives the shell: `nohup python -m benchmarks.time_to_quality
--side=bert_jax --out=/tmp/ttq > /tmp/ttq/bert_jax.log 2>&1 &` (and the same for the others).
`--finetune` and `--report` write OUT/time_to_quality.md (tables to paste into
benchmarks/RESULTS.md), OUT/time_to_quality.json and the plot (`--plot`).

Why: a faster step is only worth something if it buys quality. Both sides get the same data,
model, recipe and minutes; what differs is how many updates each side fits into them.

Needs torch, transformers, accelerate (Trainer) and matplotlib (the plot).

`--prepare` (OUT/data, once; 77 s with --dupe_factor=1 on a busy machine, several minutes at
the default 10): the corpus is every `*.txt` under `--text_dir` (../shared/data/text: 14
Gutenberg books, one sentence per line, and tinyshakespeare, raw text) plus Python's
documentation (data_pipelines/demo_corpus.py), about 1.5M words. The books have no
document boundaries, so documents are runs of at most `--sentences_per_document` consecutive
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
the faster side reads in 60 minutes), unmasked (dynamic masking). The held-out records are masked
once by bert_jax's evaluation pipeline (fixed seed) and stored as numpy batches
(OUT/data/eval_batches.npz): both sides are scored on exactly these batches. The training
instances are also stored as numpy (OUT/data/train_instances.npz) for the transformers side.

`--side` (OUT/<side>): BERT-mini (L=4, H=256, A=4, vocab 8k, dropout 0.1, float32) from random
initialisation, MLM + NSP, batch 64 x 128, peak lr 5e-4 (post-LN small models stall at 1e-3+,
experiments/pretrain_demo.py), linear warm-up over the first 5% of the side's steps then linear
decay to 0 at its last step, AdamW (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 except biases
and LayerNorm), gradient clipping at global norm 1.0.
  bert_jax: `bert_jax.tasks.jobs.pretraining.train_and_evaluate` as a user runs it (tf.data
    pipeline with dynamic masking, 15%, 80/10/10, at most 20 predictions per sequence; AdamW as the
    original, without bias correction; the original schedule, whose decay runs over all steps).
  transformers: `BertForPreTraining` with `transformers.Trainer` and
    `DataCollatorForLanguageModeling` (15%, 80/10/10, a Bernoulli draw per token, so no cap
    of 20), the same unmasked instances with their NSP labels, sequences padded per batch to the
    longest (its usual dynamic padding). Its usual optimizer and schedule: torch AdamW (fused,
    with bias correction), `lr_scheduler_type="linear"` (decay over the steps after warm-up).
    Its model computes MLM logits at every position, as BertForPreTraining does.
  Both schedules need a step count. Each side first measures its own speed in a short
  calibration run (`--calibration_steps` x 3 steps: the first window holds compilation or
  warm-up, the last two give steps/s), then trains for
  `num_train_steps = (budget - measured start-up) x steps/s`, so that each side's schedule ends
  at the budget (`--calibrate --side=...` prints the calibration alone). The training clock runs
  from the start of the training loop (compilation, input pipeline and logging count) and stops
  during evaluations and checkpoint saves, on both sides: bert_jax's own clock (`train_seconds`
  in metrics.jsonl: the loop waits for the steps in flight before it pauses, as JAX dispatches
  asynchronously), and a `TrainerCallback` on the transformers side. Held-out MLM loss and
  accuracy are recorded every
  ~`--eval_every_minutes` of training time to OUT/<side>/curve.jsonl: bert_jax's own
  evaluation every N steps (N = interval x calibrated steps/s), the transformers side by its
  clock. Checkpoints every ~`--checkpoint_every_minutes`: bert_jax resumes from its workdir,
  the Trainer with `resume_from_checkpoint`; the clock reached at each checkpoint is saved with
  it and a resumed run continues from there (paying compilation again, ~0.5 min).
  The transformers side ends with `save_pretrained` + vocab.txt in OUT/transformers/final.

`--finetune` (OUT/finetune/<side>/<task>): both checkpoints with one recipe, bert_jax's GLUE
fine-tuning (`bert_jax.tasks.datasets.glue.run`, what `glue.run_all` runs for each task; called
per task because a training subset applies to one task only): SST-2, MRPC, STS-B, RTE, CoLA,
whole dev sets, `--seeds` restarts, batch 32, lr 1e-4 (small models want a higher rate than
BERT-base's 2e-5..5e-5), 3 epochs, warm-up 10%, max length 128, batches cut to their longest row
(`length_bucket=16`: same outputs, less padding computed). SST-2's training set is cut to the
first `--ft_train_examples` (default sst2=20000, 30%, the same label balance, 55% positive,
and sentence length as the whole set; the other training sets are whole): about 2 h for the
stage instead of ~3.5 h (estimated from BERT-mini's fine-tuning speed; `--ft_train_examples=""`
for the whole set). A finished task (OUT/finetune/<side>/<task>/ttq.json) is not run again.

Measured results: benchmarks/RESULTS.md ("Time to quality").
"""
import os

# On import too (the test imports the parts): CPU only, no hub downloads, quiet TensorFlow.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
