r"""Continue pre-training a released encoder on your own corpus (domain-adaptive pre-training):
BERT, ModernBERT, RoBERTa or XLM-RoBERTa (e.g. XLM-R on one language).

  python -m bert_jax.main --config=experiments/continue_pretraining.py --workdir=/tmp/continued \
    --config.init_checkpoint=PATH [--config.data.text_files=/data/my_corpus/*.txt]

PATH is anything `checkpoints.load_pretrained` reads (a Hugging Face directory, a Google TF
checkpoint, a save_pretrained directory or a pre-training workdir). The architecture, the
vocabulary (`vocab.txt`, `spm.model` or `tokenizer.json` beside the checkpoint) and the casing
(a Hugging Face `tokenizer_config.json`) come from the checkpoint
(`config.model_from_checkpoint`), the objective from its family (BERT: masked LM + NSP; the
others: masked LM); the text files (BERT's input format: a sentence per line, a blank line
between documents) become records with that vocabulary in WORKDIR/data, every 20th document
held out. Without text files the
corpus is Python's documentation (no download). The pre-training heads are loaded where the
checkpoint has them and initialised where it does not (the run says which); held-out metrics
are logged at step 0 (the checkpoint as released) and every 500 steps.

The recipe is the paper's scaled to a short run: AdamW, linear warm-up over the first 10% of
the steps, then linear decay, at 5e-5 (half the paper's 1e-4: the model is already trained),
dropout as the checkpoint's config says, batches of 32 x 128 tokens, 2,000 steps
(`:steps=N` changes the length, warm-up stays 10%). `:quick` runs a few steps on a few
documents (the tests use it).
"""
from experiments import pretraining_defaults


def get_config(arg=None):
  args = pretraining_defaults.parse_arg(arg, steps=2000, quick=False)
  c = pretraining_defaults.get_config("base")   # architecture replaced by the checkpoint's
  c.model_from_checkpoint = True
  c.objective = ""                     # the checkpoint's family's: BERT's MLM + NSP, else MLM
  c.eval_before_training = True
  c.max_seq_length, c.max_predictions_per_seq = 128, 20
  c.global_batch_size, c.eval_batch_size = 32, 64
  c.num_train_steps = args["steps"]
  c.warmup_steps = max(1, c.num_train_steps // 10)
  c.learning_rate = 5e-5
  c.log_every_steps, c.eval_every_steps, c.eval_steps = 100, 500, 0
  c.checkpoint_every_steps, c.keep_checkpoints = 500, 2
  c.data.prepare_demo_corpus = True    # used when data.text_files is empty
  c.data.dupe_factor = 5
  c.data.shuffle_buffer_size = 5000
  if args["quick"]:
    c.max_seq_length, c.max_predictions_per_seq = 32, 5
    c.global_batch_size, c.eval_batch_size = 4, 4
    c.num_train_steps, c.warmup_steps = 4, 1
    c.log_every_steps, c.checkpoint_every_steps, c.eval_every_steps, c.eval_steps = 2, 2, 4, 2
    c.data.shuffle_buffer_size = 100
    c.data.demo_max_documents = 60
    c.data.dupe_factor = 1
  return c
